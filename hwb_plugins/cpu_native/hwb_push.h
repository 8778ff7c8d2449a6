/* hwb_push.h — the fixed vector code of cpu.native's reduced sliding push (the push_weights
 * and push_gates options, hwb_plugins/cpu_native/push_weights.py): the fast LSTM gates in
 * AVX-512 or AVX2 + FMA, and the AVX2 helpers of the 8-lane int8 products.
 *
 * Included by the push's generated code (push_weights.Kernels.c) after it has chosen, under
 * #if of the CPU features the -march enables (push_weights.FORMS), which parts it needs:
 *
 *   #define HWB_PW_FAST_GATES 512   // the fast gates: 512 (AVX-512F) or 256 (AVX2 + FMA);
 *                                   // undefined: none (the push keeps emit.py's exact gates)
 *   #define HWB_PW_INT8_AVX2 1      // the 8-lane int8 helpers (an AVX2 int8 form)
 *   #include "hwb_push.h"
 *
 * Both gate forms define hwb_pw_lstm16 with the same arguments, so the emitted calls are the
 * same. build.py passes -I for this directory. */
#ifndef HWB_PUSH_H
#define HWB_PUSH_H

#include <immintrin.h>
#include <stdint.h>

#ifndef HWB_INLINE
#define HWB_INLINE static inline __attribute__((always_inline))
#endif

#if defined(HWB_PW_FAST_GATES) && HWB_PW_FAST_GATES == 512
/* The push's LSTM gates in AVX-512 (with a reduced push; the prepare keeps emit.py's exact
 * lstm_gates, so the windows in flight stay fp32). Every gate is σ(s·x) = 1/(1 + e)
 * with e = 2^t, t = -s·x·log2(e) split as n + f (n the nearest integer, f
 * by two FMAs with log2(e) in two parts), 2^f a degree-5 polynomial on [-0.5, 0.5]
 * (relative error 1.7e-7, fitted here), 2^n by vscalefps (no integer exponent
 * arithmetic, and it saturates to 0 / inf by itself), 1/(1 + e) by vrcp14ps and one
 * Newton step (relative error ~1e-8, no division); tanh(x) = 2σ(2x) - 1 (absolute error
 * ~1e-7 near 0, which is what the state and the answer see). x is clamped at -80/s
 * so 1 + e stays finite; max(-80/s, x) keeps a NaN (vmaxps returns its second operand).
 * About 95 vector operations per 16 units, against ~140 in the exact gates, and no scalar tail. */
HWB_INLINE __m512 hwb_pw_sig(__m512 x, float s) {
    const __m512 xc = _mm512_max_ps(_mm512_set1_ps(-80.0f / s), x);
    const __m512 hi = _mm512_set1_ps(-s * 0x1.715476p+0f), lo = _mm512_set1_ps(-s * 0x1.4ae0cp-26f);
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(xc, hi), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m512 f = _mm512_fmadd_ps(xc, lo, _mm512_fmsub_ps(xc, hi, n));
    __m512 p = _mm512_set1_ps(0x1.5a850ap-10f);
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0x1.3cec2ap-7f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0x1.c6baaap-5f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0x1.ebf9b6p-3f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0x1.62e426p-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
    const __m512 d = _mm512_add_ps(_mm512_scalef_ps(p, n), _mm512_set1_ps(1.0f));
    const __m512 r = _mm512_rcp14_ps(d);
    return _mm512_fmadd_ps(r, _mm512_fnmadd_ps(d, r, _mm512_set1_ps(1.0f)), r);
}
HWB_INLINE __m512 hwb_pw_tanh(__m512 x) { return _mm512_fmsub_ps(hwb_pw_sig(x, 2.0f), _mm512_set1_ps(2.0f), _mm512_set1_ps(1.0f)); }
/* units j..j+15 (lanes in m) of an LSTM of u units: gates i, f, g, o at r + zx (Keras' order) */
HWB_INLINE void hwb_pw_lstm16(const float *r, const float *zx, float *c, float *h, int u, int j, __mmask16 m) {
    const __m512 zi = _mm512_add_ps(_mm512_maskz_loadu_ps(m, r + j), _mm512_maskz_loadu_ps(m, zx + j));
    const __m512 zf = _mm512_add_ps(_mm512_maskz_loadu_ps(m, r + u + j), _mm512_maskz_loadu_ps(m, zx + u + j));
    const __m512 zg = _mm512_add_ps(_mm512_maskz_loadu_ps(m, r + 2 * u + j), _mm512_maskz_loadu_ps(m, zx + 2 * u + j));
    const __m512 zo = _mm512_add_ps(_mm512_maskz_loadu_ps(m, r + 3 * u + j), _mm512_maskz_loadu_ps(m, zx + 3 * u + j));
    const __m512 cc = _mm512_fmadd_ps(hwb_pw_sig(zf, 1.0f), _mm512_maskz_loadu_ps(m, c + j),
                                      _mm512_mul_ps(hwb_pw_sig(zi, 1.0f), hwb_pw_tanh(zg)));
    _mm512_mask_storeu_ps(c + j, m, cc);
    _mm512_mask_storeu_ps(h + j, m, _mm512_mul_ps(hwb_pw_sig(zo, 1.0f), hwb_pw_tanh(cc)));
}
#elif defined(HWB_PW_FAST_GATES) && HWB_PW_FAST_GATES == 256
/* The push's LSTM gates in AVX2 + FMA (8 lanes), for a -march without AVX-512: the
 * arithmetic of the AVX-512 gates with what AVX2 lacks done by hand. x is clamped to
 * ±80/s (t within ±115.5, so 2^n is a normal float built in the exponent bits:
 * (n + 127) << 23; σ(±80) is 0 / 1 in float, so the clamp changes no answer, and the
 * max/min operand order keeps a NaN); 1/(1 + e) by vrcpps (12 bits) and one
 * Newton step (relative error ~1.5e-7). hwb_pw_lstm16 keeps the AVX-512 gates' signature
 * (the same emitted calls) and runs two 8-lane halves, a masked half only at a partial end. */
HWB_INLINE __m256 hwb_pw_sig8(__m256 x, float s) {
    const __m256 xc = _mm256_min_ps(_mm256_set1_ps(80.0f / s), _mm256_max_ps(_mm256_set1_ps(-80.0f / s), x));
    const __m256 hi = _mm256_set1_ps(-s * 0x1.715476p+0f), lo = _mm256_set1_ps(-s * 0x1.4ae0cp-26f);
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(xc, hi), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m256 f = _mm256_fmadd_ps(xc, lo, _mm256_fmsub_ps(xc, hi, n));
    __m256 p = _mm256_set1_ps(0x1.5a850ap-10f);
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(0x1.3cec2ap-7f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(0x1.c6baaap-5f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(0x1.ebf9b6p-3f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(0x1.62e426p-1f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f));
    const __m256 e2n = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n),
                                                                              _mm256_set1_epi32(127)), 23));
    const __m256 d = _mm256_fmadd_ps(p, e2n, _mm256_set1_ps(1.0f));
    const __m256 r = _mm256_rcp_ps(d);
    return _mm256_fmadd_ps(r, _mm256_fnmadd_ps(d, r, _mm256_set1_ps(1.0f)), r);
}
HWB_INLINE __m256 hwb_pw_tanh8(__m256 x) { return _mm256_fmsub_ps(hwb_pw_sig8(x, 2.0f), _mm256_set1_ps(2.0f), _mm256_set1_ps(1.0f)); }
/* lanes of m (bits 0..7): all 8 (full) by plain loads and stores, else masked */
HWB_INLINE __m256i hwb_pw_mask8(unsigned m) {
    const __m256i bit = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
    return _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_set1_epi32((int)m), bit), bit);
}
HWB_INLINE __m256 hwb_pw_ld8(const float *p, unsigned m) {
    return m == 0xFF ? _mm256_loadu_ps(p) : _mm256_maskload_ps(p, hwb_pw_mask8(m));
}
HWB_INLINE void hwb_pw_st8(float *p, unsigned m, __m256 v) {
    if (m == 0xFF) _mm256_storeu_ps(p, v); else _mm256_maskstore_ps(p, hwb_pw_mask8(m), v);
}
HWB_INLINE void hwb_pw_lstm8(const float *r, const float *zx, float *c, float *h, int u, int j, unsigned m) {
    const __m256 zi = _mm256_add_ps(hwb_pw_ld8(r + j, m), hwb_pw_ld8(zx + j, m));
    const __m256 zf = _mm256_add_ps(hwb_pw_ld8(r + u + j, m), hwb_pw_ld8(zx + u + j, m));
    const __m256 zg = _mm256_add_ps(hwb_pw_ld8(r + 2 * u + j, m), hwb_pw_ld8(zx + 2 * u + j, m));
    const __m256 zo = _mm256_add_ps(hwb_pw_ld8(r + 3 * u + j, m), hwb_pw_ld8(zx + 3 * u + j, m));
    const __m256 cc = _mm256_fmadd_ps(hwb_pw_sig8(zf, 1.0f), hwb_pw_ld8(c + j, m),
                                      _mm256_mul_ps(hwb_pw_sig8(zi, 1.0f), hwb_pw_tanh8(zg)));
    hwb_pw_st8(c + j, m, cc);
    hwb_pw_st8(h + j, m, _mm256_mul_ps(hwb_pw_sig8(zo, 1.0f), hwb_pw_tanh8(cc)));
}
/* units j..j+15 (lanes in m) of an LSTM of u units: gates i, f, g, o at r + zx (Keras' order) */
HWB_INLINE void hwb_pw_lstm16(const float *r, const float *zx, float *c, float *h, int u, int j, unsigned m) {
    hwb_pw_lstm8(r, zx, c, h, u, j, m & 0xFF);
    if (m >> 8) hwb_pw_lstm8(r, zx, c, h, u, j + 8, m >> 8);
}
#elif defined(HWB_PW_FAST_GATES)
#error "HWB_PW_FAST_GATES is 512 (AVX-512F) or 256 (AVX2 + FMA)"
#endif

#ifdef HWB_PW_INT8_AVX2
/* The 8-lane int8 forms' helpers (AVX2): horizontal max and sum, the quantisation of 32
 * inputs, and AVX2's exact s8 × s8 dot product of 4-byte groups, hwb_pw_dots8:
 * vpmaddubsw takes |x| as its u8 operand and w with x's sign (vpsignb;
 * zero where x is 0), so each s16 pair sum is x₀w₀ + x₁w₁ with |x|, |w| ≤ 127:
 * at most 2·127·127 = 32258, never saturated; vpmaddwd by 1 adds the pairs into s32. */
HWB_INLINE float hwb_pw_hmax8(__m256 v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    return _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
}
HWB_INLINE float hwb_pw_hsum8(__m256 v) {
    __m128 m = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_add_ps(m, _mm_movehl_ps(m, m));
    return _mm_cvtss_f32(_mm_add_ss(m, _mm_movehdup_ps(m)));
}
/* q[0..31] = v[0..31]·inv rounded to nearest even (|v·inv| <= 127: the packs do not clip) */
HWB_INLINE void hwb_pw_q32(const float *v, __m256 inv, int8_t *q) {
    const __m256i c0 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_load_ps(v), inv));
    const __m256i c1 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_load_ps(v + 8), inv));
    const __m256i c2 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_load_ps(v + 16), inv));
    const __m256i c3 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_load_ps(v + 24), inv));
    /* the packs interleave 128-bit lanes: dwords c0lo c1lo c2lo c3lo c0hi c1hi c2hi c3hi */
    const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(c0, c1), _mm256_packs_epi32(c2, c3));
    _mm256_store_si256((__m256i *)q, _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
}
HWB_INLINE __m256i hwb_pw_dots8(__m256i acc, __m256i x, __m256i w) {
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_abs_epi8(x), _mm256_sign_epi8(w, x)),
                                                   _mm256_set1_epi16(1)));
}
#endif

#endif
