/* hwb_prelude.h — the fixed part of every cpu.native model.c: the vector types the emitter's
 * loops use and the branch-free math (exp, sigmoid, tanh, gelu, log) the activations call.
 *
 * Included by the generated model.c (hwb_plugins/cpu_native/emit.py) right after its own
 * hwb_model.h, with the vector width defined first:
 *
 *   #define HWB_VW 16              // floats per vector: 16 (AVX-512) or 8 (emit.VECTORS)
 *   #include "hwb_model.h"
 *   #include "hwb_prelude.h"
 *
 * build.py passes -I for this directory. Everything here is a macro, a typedef or a static
 * inline function: what a model does not call costs nothing. */
#ifndef HWB_PRELUDE_H
#define HWB_PRELUDE_H

#ifndef HWB_VW
#error "define HWB_VW (floats per vector: 8 or 16) before including hwb_prelude.h"
#endif

#include <stdint.h>
#if defined(__AVX512VNNI__) || defined(__AVXVNNI__)
#include <immintrin.h>
#endif

/* inlined at every call (a test compiles each function on its own with a plain static inline) */
#ifndef HWB_INLINE
#define HWB_INLINE static inline __attribute__((always_inline))
#endif
#define A64 __attribute__((aligned(64)))
/* HWB_VW-float vectors: vf aligned (weights, padded rows), vfu for tensors at any offset */
typedef float vf __attribute__((vector_size(4 * HWB_VW)));
typedef float vfu __attribute__((vector_size(4 * HWB_VW), aligned(4)));
typedef int32_t vi __attribute__((vector_size(4 * HWB_VW)));
/* the activations a conv's epilogue applies in registers (C has no vector ?:): a comparison
   mask, then a bitwise select; NaN and -0.0 give 0, as the scalar v > 0 ? v : 0 does */
HWB_INLINE vf hwb_vrelu(vf v) { return (vf)((vi)v & (v > 0.0f)); }
HWB_INLINE vf hwb_vleaky(vf v, float a) {
    const vi m = v > 0.0f;
    return (vf)(((vi)v & m) | ((vi)(a * v) & ~m));
}
HWB_INLINE vf hwb_load_part(const float *p, int n) {
    vf v = {0};
    __builtin_memcpy(&v, p, 4 * n);
    return v;
}

/* exp(x), ~1 ulp on the clamped range, branch-free so loops over it vectorise (Cephes'
   expf polynomial; the rounding of x·log2(e) to an integer by the 1.5·2^23 trick). The
   LSTM's steps wait on it (the recurrence), so its latency counts, hence Estrin. */
HWB_INLINE float hwb_exp_le88(float x);
HWB_INLINE float hwb_exp(float x) { return hwb_exp_le88(x > 88.0f ? 88.0f : x); }
/* exp(x) for x <= 88 (the LSTM gates' arguments: one clamp less on the recurrence's path) */
HWB_INLINE float hwb_exp_le88(float x) {
    x = x < -87.0f ? -87.0f : x;
    float k = x * 1.44269504088896341f;
    k = (k + 12582912.0f) - 12582912.0f;
    float r = x - k * 0.693359375f;
    r = r - k * -2.12194440e-4f;
    /* Estrin's scheme: the same polynomial in 3 levels instead of 6 dependent steps */
    const float r2 = r * r, r4 = r2 * r2;
    const float a = 1.6666665459e-1f * r + 5.0000001201e-1f;
    const float b = 8.3334519073e-3f * r + 4.1665795894e-2f;
    const float c = 1.9875691500e-4f * r + 1.3981999507e-3f;
    float p = (c * r4 + (b * r2 + a)) * r2 + r + 1.0f;
    union { int i; float f; } s;
    s.i = ((int)k + 127) << 23;
    return p * s.f;
}
HWB_INLINE float hwb_sigmoid(float x) { return 1.0f / (1.0f + hwb_exp(-x)); }
/* gelu(x) = x·Φ(x) with erf by Abramowitz & Stegun 7.1.26 (|error| <= 1.5e-7), branch-free */
HWB_INLINE float hwb_gelu(float x) {
    const float z = (x < 0.0f ? -x : x) * 0.70710678118654752f, t = 1.0f / (1.0f + 0.3275911f * z);
    const float p = t * (0.254829592f + t * (-0.284496736f + t * (1.421413741f + t * (-1.453152027f
                    + t * 1.061405429f))));
    const float e = 1.0f - p * hwb_exp(-z * z);
    return 0.5f * x * (1.0f + (x < 0.0f ? -e : e));
}
/* log(x) for finite x >= 1 (the sums softplus and log_softmax take): Cephes' logf, the
   mantissa in [sqrt(1/2), sqrt(2)) by a polynomial, no libm call. */
HWB_INLINE float hwb_log_ge1(float x) {
    union { float f; int i; } u = {x};
    int e = ((u.i >> 23) & 0xff) - 126;
    u.i = (u.i & 0x807fffff) | 0x3f000000;
    float m = u.f;
    if (m < 0.707106781186547524f) { e -= 1; m = m + m - 1.0f; } else { m = m - 1.0f; }
    const float z = m * m, fe = (float)e;
    float y = ((((((((7.0376836292e-2f * m - 1.1514610310e-1f) * m + 1.1676998740e-1f) * m
              - 1.2420140846e-1f) * m + 1.4249322787e-1f) * m - 1.6668057665e-1f) * m
              + 2.0000714765e-1f) * m - 2.4999993993e-1f) * m + 3.3333331174e-1f) * m * z;
    y += -2.12194440e-4f * fe - 0.5f * z;
    return m + y + 0.693359375f * fe;
}
/* log(1 + u) for 0 <= u <= 1, the rounding of 1 + u corrected (Goldberg's trick) */
HWB_INLINE float hwb_log1p01(float u) {
    const float w = 1.0f + u;
    return w == 1.0f ? u : hwb_log_ge1(w) * (u / (w - 1.0f));
}
/* tanh: (1-e)/(1+e) with e = exp(-2|x|); near 0 its odd Taylor series (no cancellation). */
HWB_INLINE float hwb_tanh(float x) {
    float a = x < 0.0f ? -x : x;
    float e = hwb_exp(-2.0f * a);
    float t = (1.0f - e) / (1.0f + e);
    float x2 = x * x;
    float s = x * (1.0f + x2 * (-0.333333333f + x2 * (0.133333333f + x2 * -0.0539682540f)));
    t = x < 0.0f ? -t : t;
    return a < 0.0625f ? s : t;
}

#endif
