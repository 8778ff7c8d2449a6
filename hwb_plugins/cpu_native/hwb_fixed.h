/* hwb_fixed.h — the ap_fixed emulation of cpu.native's fixed precisions (fixed,
 * ap_fixed<W,I,Q,O>): a value is its raw integer, and a cast into a type (W bits, signed or
 * not, quantisation mode q, overflow mode o) is fx_cast / fx_from_float, bit for bit what
 * hls4ml's ap_fixed assignment does. The modes are compile-time constants at every call site
 * (the generated code passes literals), so after inlining each cast is a few integer
 * instructions.
 *
 * Included by the generated model.c of a fixed-precision model (hwb_plugins/cpu_native/
 * fixed.py FixedEmitter) and by the programs that compute its activation tables with hls4ml's
 * own expressions (fixed.py tables); build.py and fixed.py pass -I for this directory. The
 * enums' order is hwb_plugins/_shared/fixed_point.py's QUANT_MODES and OVF_MODES. */
#ifndef HWB_FIXED_H
#define HWB_FIXED_H

#include <stdint.h>

enum { FX_TRN, FX_TRN_ZERO, FX_RND, FX_RND_ZERO, FX_RND_INF, FX_RND_MIN_INF, FX_RND_CONV };
enum { FX_WRAP, FX_SAT, FX_SAT_ZERO };
#ifndef FX_INLINE
#define FX_INLINE static inline __attribute__((always_inline))
#endif
FX_INLINE int64_t fx_hi(int w, int sgn) { return sgn ? (int64_t)((1ULL << (w - 1)) - 1) : (int64_t)((1ULL << w) - 1); }
FX_INLINE int64_t fx_lo(int w, int sgn) { return sgn ? -fx_hi(w, sgn) - 1 : 0; }
/* overflow: v (at the type's fraction) into w bits */
FX_INLINE int64_t fx_ovf(int64_t v, int w, int sgn, int o) {
    if (o == FX_WRAP) {
        if (sgn) return (int64_t)((uint64_t)v << (64 - w)) >> (64 - w);
        return (int64_t)((uint64_t)v & ((1ULL << w) - 1));
    }
    const int64_t hi = fx_hi(w, sgn), lo = fx_lo(w, sgn);
    if (o == FX_SAT) return v > hi ? hi : (v < lo ? lo : v);
    return (v > hi || v < lo) ? 0 : v;
}
/* whether dropping s > 0 low bits (floor fl, remainder fr) rounds up, per mode */
FX_INLINE int fx_up(int64_t v, int64_t fl, int64_t fr, int64_t half, int q) {
    switch (q) {
    case FX_TRN: return 0;
    case FX_TRN_ZERO: return v < 0 && fr != 0;
    case FX_RND: return fr >= half;
    case FX_RND_ZERO: return fr > half || (fr == half && v < 0);
    case FX_RND_INF: return fr > half || (fr == half && v >= 0);
    case FX_RND_MIN_INF: return fr > half;
    default: return fr > half || (fr == half && (fl & 1));
    }
}
FX_INLINE int64_t fx_shr(int64_t v, int s, int q) {
    const int64_t fl = v >> s, fr = v & ((INT64_C(1) << s) - 1);
    return fl + fx_up(v, fl, fr, INT64_C(1) << (s - 1), q);
}
/* v · 2^-f_src into the type (w bits, fraction f_src - s): ap_fixed's assignment */
FX_INLINE int64_t fx_cast(int64_t v, int s, int q, int w, int sgn, int o) {
    if (s > 0) return fx_ovf(fx_shr(v, s, q), w, sgn, o);
    if (s == 0) return fx_ovf(v, w, sgn, o);
    const int k = -s;
    if (o == FX_WRAP) return fx_ovf((int64_t)((uint64_t)v << k), w, sgn, o);
    /* saturating: range-check before the shift (v << k need not fit 64 bits) */
    const int64_t hi = fx_hi(w, sgn), lo = fx_lo(w, sgn);
    if (v > (hi >> k) || v < -((-lo) >> k)) return o == FX_SAT ? (v > 0 ? hi : lo) : 0;
    return (int64_t)((uint64_t)v << k);
}
/* ap_fixed(double(f)): sc = 2^frac */
FX_INLINE int64_t fx_from_float(float f, double sc, int q, int w, int sgn, int o) {
    const double d = (double)f * sc;
    if (!(d > -0x1p62 && d < 0x1p62)) {
        if (d != d) return 0;
        if (o != FX_WRAP) return o == FX_SAT ? (d > 0 ? fx_hi(w, sgn) : fx_lo(w, sgn)) : 0;
        /* |d| >= 2^62 is an integer: its low 64 bits from the mantissa and exponent */
        union { double d; uint64_t u; } b = {d};
        const int e = (int)((b.u >> 52) & 0x7ff) - 1075;
        const uint64_t m = (b.u & ((1ULL << 52) - 1)) | (1ULL << 52);
        uint64_t low = e >= 64 ? 0 : m << e; /* inf: e >= 64 */
        if (d < 0) low = -low;
        return fx_ovf((int64_t)low, w, sgn, o);
    }
    int64_t fl = (int64_t)d;
    if ((double)fl > d) fl -= 1;
    const double fr = d - (double)fl;
    int up;
    switch (q) {
    case FX_TRN: up = 0; break;
    case FX_TRN_ZERO: up = d < 0 && fr != 0; break;
    case FX_RND: up = fr >= 0.5; break;
    case FX_RND_ZERO: up = fr > 0.5 || (fr == 0.5 && d < 0); break;
    case FX_RND_INF: up = fr > 0.5 || (fr == 0.5 && d >= 0); break;
    case FX_RND_MIN_INF: up = fr > 0.5; break;
    default: up = fr > 0.5 || (fr == 0.5 && (fl & 1)); break;
    }
    return fx_ovf(fl + up, w, sgn, o);
}

#endif
