/* Row kernels of the element-wise norms fused with the residual add: DyT (arXiv 2503.10622) and Derf
 * (arXiv 2512.10938).
 *
 *   forward   s = x + r (rounded to the stream's dtype, stored),  u = alpha s + shift,
 *             y = w f(u) + b  with f = tanh (DyT) or erf (Derf)
 *   backward  g = dy w;  ds = alpha g f'(u) + dres;  dalpha += sum g f'(u) s;  dshift += sum g f'(u);
 *             dw += dy f(u);  db += dy
 *
 * f and f' are computed branch-free so that gcc vectorizes them (libm's tanhf / erff do not): exp by
 * range reduction and a degree-6 polynomial (Cephes' expf, ~1 ulp), tanh from exp with an odd polynomial
 * near 0 (Cephes' tanhf), erf from two polynomial fits (below 1 and from 1 to 3.92, see erf_v). Included per
 * instruction set after norm_rows.h.
 *
 * The polynomials' steps are AN_MAD(a, b, c) = a b + c, which addnorm_cpu.c defines per instruction set: a fused
 * multiply-add (__builtin_fmaf, one rounding) on AVX2 and AVX-512, a product and a sum on the baseline build,
 * whose x86-64 has no FMA (there fmaf would be a libm call). The build turns contraction off everywhere else;
 * here the FMA takes 10-30 % off DyT's and Derf's time at 8192x1024 and leaves them as accurate (erf 1.29 ulp
 * with FMA, 1.53 without; tanh 1.50 and 1.87), so the variants agree to an ulp or two, not to the bit. exp_neg
 * takes it too (Derf's backward, DyT's |u| >= 0.625). The bfloat16 loops take it for their other products and sums
 * as well: u = alpha s + shift, y = w f + b, and the backward's 1 - f^2, alpha g + dres, dw += dy f and
 * dalpha's sum of g s, each rounded once. Those are the loops' arithmetic bound on this machine (the vector loops
 * below: DyT's forward 4 % and its fwd+bwd 8 % faster warm than with separate products and sums), and no less
 * accurate (outputs more than half a bfloat16 step from the float64 answer: DyT 3e-5 of them either way, Derf 3e-5
 * against 4e-5). The baseline build rounds u twice, so there the bfloat16 loops' u, and where alpha s nearly cancels
 * the shift f(u), differ from the FMA builds' by more than the polynomials' ulp or two.
 */

#define AN_CAT2(a, b) a##b
#define AN_CAT(a, b) AN_CAT2(a, b)
#define AN_FN(name) AN_CAT(name, AN_SFX)

/* exp(x) for x <= 0 (every caller's case), clamped at -87 (exp(-87) = 1.6e-38: a float's smallest normal).
 * The clamp compares bit patterns (for x <= 0 a larger magnitude is a larger pattern): gcc vectorizes that,
 * where a float compare-and-select here, or copysignf below, kept the whole loop scalar. */
static inline float AN_FN(exp_neg)(float x) {
    const uint32_t xi = an_f32_bits(x), lim = 0xC2AE0000u; /* -87.0f */
    x = an_bits_f32(xi > lim ? lim : xi);
    float t = x * 1.44269504088896341f;          /* x / ln 2 */
    int n = (int)(t - 0.5f);                     /* round to nearest (t <= 0) */
    float r = x - (float)n * 0.693359375f;       /* Cody-Waite: ln 2 in two parts */
    r -= (float)n * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = AN_MAD(p, r, 1.3981999507e-3f);
    p = AN_MAD(p, r, 8.3334519073e-3f);
    p = AN_MAD(p, r, 4.1665795894e-2f);
    p = AN_MAD(p, r, 1.6666665459e-1f);
    p = AN_MAD(p, r, 5.0000001201e-1f);
    p = AN_MAD(p * r, r, r) + 1.0f;
    uint32_t bits = (uint32_t)(n + 127) << 23;   /* 2^n, n in [-126, 0] */
    return p * an_bits_f32(bits);
}

/* tanh(u) */
static inline float AN_FN(tanh_v)(float u) {
    float a = __builtin_fabsf(u);
    float z = u * u;
    float q = AN_MAD(-5.70498872745e-3f, z, 2.06390887954e-2f);
    q = AN_MAD(q, z, -5.37397155531e-2f);
    q = AN_MAD(q, z, 1.33314422036e-1f);
    q = AN_MAD(q, z, -3.33332819422e-1f);
    float small = AN_MAD(q * z, u, u);
    float e = AN_FN(exp_neg)(-2.0f * a);         /* tanh(a) = (1 - e) / (1 + e) */
    float big = (1.0f - e) / (1.0f + e);
    big = u < 0.0f ? -big : big;
    float r = a < 0.625f ? small : big;
    return u != u ? u : r; /* NaN stays NaN (a negative NaN's pattern is clamped above) */
}

/* erf(u), within 1.6 ulp (1.53 measured, 1.29 with FMA), with neither exp nor a division: two polynomials in |u|, both computed
 * (branch-free, so that gcc vectorizes the loop) and one selected, then u's sign put on.
 *   |u| < 1:   erf = a + a S(a^2) (a = |u|),  S a degree-6 fit of erf(a)/a - 1 (relative error 1.2e-9); adding
 *              the exact a last keeps the rounding of S's terms below one ulp
 *   |u| >= 1:  erf = B(min(a, 3.92) - 2.46),  B a degree-14 fit on [1, 3.92] (absolute error 6.6e-9); past 3.92
 *              erf rounds to 1 in float
 * The coefficients are least-squares fits driven to the minimax error by Lawson's reweighting, in float64,
 * then rounded to float: benchmarks/fit_erf.py derives them and measures this evaluation's error, and
 * tests/kernels/test_erf_ulp.py holds the kernels to it. Without FMA the build's -fassociative-math would
 * rewrite a S + a as a (S + 1) and fold the 1 into S's constant, which rounds S near 1.13 and costs two more
 * ulp: a is spelled two ways (fabs and the bit pattern) so that gcc does not see the common factor. The clamp
 * compares bit patterns (a >= 0), as exp_neg's does, so that the loop stays vectorized. */
static inline float AN_FN(erf_v)(float u) {
    const uint32_t ui = an_f32_bits(u), ai = ui & 0x7fffffffu, sign = ui ^ ai, lim = 0x407AE148u; /* 3.92f */
    const float a = an_bits_f32(ai), z = u * u;
    float s = 7.853892021e-05f;
    s = AN_MAD(s, z, -8.010203601e-04f);
    s = AN_MAD(s, z, 5.188329145e-03f);
    s = AN_MAD(s, z, -2.685381286e-02f);
    s = AN_MAD(s, z, 1.128358543e-01f);
    s = AN_MAD(s, z, -3.761262596e-01f);
    s = AN_MAD(s, z, 1.283791661e-01f);
    const float small = AN_MAD(__builtin_fabsf(u), s, a);
    const float t = an_bits_f32(ai > lim ? lim : ai) - 2.46f;
    float b = 1.090815203e-06f;
    b = AN_MAD(b, t, 1.064034265e-07f);
    b = AN_MAD(b, t, -1.730688200e-05f);
    b = AN_MAD(b, t, 2.462631892e-05f);
    b = AN_MAD(b, t, 7.576047938e-05f);
    b = AN_MAD(b, t, -2.994046663e-04f);
    b = AN_MAD(b, t, 3.559847537e-04f);
    b = AN_MAD(b, t, 4.590614990e-04f);
    b = AN_MAD(b, t, -2.937226323e-03f);
    b = AN_MAD(b, t, 6.799712311e-03f);
    b = AN_MAD(b, t, -9.914168157e-03f);
    b = AN_MAD(b, t, 9.832412936e-03f);
    b = AN_MAD(b, t, -6.534521934e-03f);
    b = AN_MAD(b, t, 2.656240482e-03f);
    b = AN_MAD(b, t, 9.994966388e-01f);
    b = b < 1.0f ? b : 1.0f;
    const float r = a < 1.0f ? small : b;
    return u != u ? u : an_bits_f32(an_f32_bits(r) | sign);
}

/* tanh and erf for the bfloat16 loops: one rational function each, a P(z) / Q(z) in z = a^2 (a = |u|, clamped
 * where f rounds to 1 in float), then u's sign put on -- 9 and 11 multiply-adds and a division, against tanh_v's
 * exp, polynomial and division (41 vector operations) and erf_v's two polynomials (22 multiply-adds). Within
 * 6.5 float32 ulps (tanh 5.2 with FMA, 6.5 without; erf 5.9 and 6.5; the fits' own relative errors are
 * 2.1e-8 and 1.9e-8, the rest is float32 Horner and the rounded coefficients), where a bfloat16 ulp is 65536
 * float32 ulps: the outputs round as tanh_v's and erf_v's would but within 1e-4 of a bfloat16 ulp of a tie
 * (every finite bfloat16 u: all correctly rounded). The float32 loops keep tanh_v / erf_v (2 ulps).
 * benchmarks/fit_pointwise_rational.py derives the coefficients and measures the error; tests/kernels/
 * test_erf_ulp.py holds the kernels to it. The clamp compares bit patterns (see exp_neg), which sends a NaN to
 * the clamp: the last line puts it back. */
static inline float AN_FN(rational_odd)(float u, uint32_t lim, const float *p, int np, const float *q, int nq) {
    const uint32_t ui = an_f32_bits(u), ai = ui & 0x7fffffffu, sign = ui ^ ai;
    const float a = an_bits_f32(ai > lim ? lim : ai), z = a * a;
    float pn = p[np], qn = q[nq];
    for (int k = np - 1; k >= 0; k--) pn = AN_MAD(pn, z, p[k]);
    for (int k = nq - 1; k >= 0; k--) qn = AN_MAD(qn, z, q[k]);
    float r = a * pn / qn;
    r = r < 1.0f ? r : 1.0f;
    return u != u ? u : an_bits_f32(an_f32_bits(r) | sign);
}

#ifndef AN_RATIONAL_COEFFICIENTS /* once, not per instruction set */
#define AN_RATIONAL_COEFFICIENTS
static const float an_tanh_p[] = {1.000000000e+00f, 1.337974221e-01f, 3.494063159e-03f, 2.058395148e-05f,
                                  1.331973021e-08f};
static const float an_tanh_q[] = {1.000000000e+00f, 4.671305716e-01f, 2.587118186e-02f, 3.283139667e-04f,
                                  7.762287169e-07f};
static const float an_erf_p[] = {1.128379107e+00f, 1.904058307e-01f, 5.274863541e-02f, 3.765589092e-03f,
                                 2.848820586e-04f, 2.050091098e-06f};
static const float an_erf_q[] = {1.000000000e+00f, 5.020754933e-01f, 1.141088456e-01f, 1.496915985e-02f,
                                 1.162528759e-03f, 3.809171903e-05f};
#endif

static inline float AN_FN(tanh_bf)(float u) {
    return AN_FN(rational_odd)(u, 0x41105000u /* 9.01953125f */, an_tanh_p, 4, an_tanh_q, 4);
}
static inline float AN_FN(erf_bf)(float u) {
    return AN_FN(rational_odd)(u, 0x407AE148u /* 3.92f */, an_erf_p, 5, an_erf_q, 5);
}

/* erf'(u) = 2/sqrt(pi) exp(-u^2); NaN for a NaN u, where exp_neg's clamp alone would make it exp(-87), a number.
 * Without a select: gcc leaves this loop scalar with any compare-and-select but a plain min or max, so the
 * NaN is put in through k = min(max(|u| bits, inf bits) - inf bits, 1): 1 for a NaN, else 0; the NaN put in is
 * 0x7fc00000 (its low half zero, as the bf16 loops' rounding without a NaN test needs). */
static inline float AN_FN(erf_slope)(float u) {
    const float e = 1.12837916709551257f * AN_FN(exp_neg)(-u * u);
    const uint32_t t = an_f32_bits(u) & 0x7fffffffu;
    const uint32_t over = (t > 0x7f800000u ? t : 0x7f800000u) - 0x7f800000u;
    const uint32_t k = over < 1u ? over : 1u;
    const uint32_t nan = 0u - k; /* all ones for a NaN: then the default NaN, whose low half is zero */
    return an_bits_f32((an_f32_bits(e) & ~nan) | (nan & 0x7fc00000u));
}

/* f(u) and f'(u) of the kind: tanh' = 1 - tanh^2, erf' = 2/sqrt(pi) exp(-u^2) */
static inline float AN_FN(pw_f)(float u, int kind) { return kind == AN_DYT ? AN_FN(tanh_v)(u) : AN_FN(erf_v)(u); }

#if defined(AN_AVX512) || defined(AN_AVX2)
/* The bfloat16 loops' vector form: tanh_bf, erf_bf, erf_slope and the loops' steps written once on GCC's vector
 * types, a register of AN_VW lanes (16 on AVX-512, 8 on AVX2) and AN_LANES / AN_VW registers a step of 32 values,
 * the same operations in the same order as the scalar forms (the same bits), but with the rounding and conversion
 * of the bfloat16 ones done whole-register: AVX512_BF16's vcvtne2ps2bf16 where the CPU has it (see bf16_out_vec),
 * otherwise the integer rounding without the NaN test (nf only), and the stream's and the outputs' bits stored
 * straight into their rows, streamed where those are aligned (stream_direct), not through a scratch row. gcc's
 * vectorization of the scalar loops converted and packed element-wise and went through the scratch rows: with the
 * caches flushed, 8192 x 1024, see the journal. Only the broadcasts, the fused multiply-add, the minima and the
 * bfloat16 loads, rounding and stores are each instruction set's own. */
#ifdef AN_AVX512
#define AN_VW 16
#else
#define AN_VW 8
#endif
#define AN_VK (AN_LANES / AN_VW)
_Static_assert(AN_LANES == 32, "pv_put and pv_put_bits store 32 values a step");
_Static_assert(AN_CHUNK % AN_LANES == 0, "a chunk's vector steps start on a whole store (stream_direct's rows)");
typedef float AN_FN(pv_f) __attribute__((vector_size(AN_VW * 4)));
typedef uint32_t AN_FN(pv_u) __attribute__((vector_size(AN_VW * 4)));
#define PVF AN_FN(pv_f)
#define PVU AN_FN(pv_u)

/* c in every lane (a broadcast: a -0.0 stays -0.0, as the scalar tail has it) */
static inline __attribute__((always_inline)) PVF AN_FN(pv_set1)(float c) {
#ifdef AN_AVX512
    return (PVF)_mm512_set1_ps(c);
#else
    return (PVF)_mm256_set1_ps(c);
#endif
}

static inline __attribute__((always_inline)) PVF AN_FN(pv_fma)(PVF a, PVF b, PVF c) {
#ifdef AN_AVX512
    return (PVF)_mm512_fmadd_ps((__m512)a, (__m512)b, (__m512)c);
#else
    return (PVF)_mm256_fmadd_ps((__m256)a, (__m256)b, (__m256)c);
#endif
}

/* r < c ? r : c (a NaN r gives c, as the scalar select does) */
static inline __attribute__((always_inline)) PVF AN_FN(pv_min)(PVF r, PVF c) {
#ifdef AN_AVX512
    return (PVF)_mm512_min_ps((__m512)r, (__m512)c);
#else
    return (PVF)_mm256_min_ps((__m256)r, (__m256)c);
#endif
}

static inline __attribute__((always_inline)) PVU AN_FN(pv_minu)(PVU a, uint32_t lim) {
#ifdef AN_AVX512
    return (PVU)_mm512_min_epu32((__m512i)a, _mm512_set1_epi32((int)lim));
#else
    return (PVU)_mm256_min_epu32((__m256i)a, _mm256_set1_epi32((int)lim));
#endif
}

static inline __attribute__((always_inline)) PVF AN_FN(pv_load)(const float *p) {
#ifdef AN_AVX512
    return (PVF)_mm512_loadu_ps(p);
#else
    return (PVF)_mm256_loadu_ps(p);
#endif
}

static inline __attribute__((always_inline)) void AN_FN(pv_store)(float *p, PVF v) {
#ifdef AN_AVX512
    _mm512_storeu_ps(p, (__m512)v);
#else
    _mm256_storeu_ps(p, (__m256)v);
#endif
}

static inline __attribute__((always_inline)) PVF AN_FN(pv_load_bf16)(const uint16_t *p) {
#ifdef AN_AVX512
    return (PVF)AN_FN(bf16x16_load)(p);
#else
    return (PVF)AN_FN(bf16x8_load)(p);
#endif
}

/* 32 values already rounded to bfloat16: their bits in order, streamed when nt (p then aligned to a store) */
static inline __attribute__((always_inline)) void AN_FN(pv_put_bits)(uint16_t *p, const PVF *v, const int nt) {
#ifdef AN_AVX512
    const __m512i bits = AN_FN(bf16x32_high_halves)((__m512i)v[0], (__m512i)v[1]);
    if (nt) _mm512_stream_si512((void *)p, bits);
    else _mm512_storeu_si512((void *)p, bits);
#else
    AN_FN(bf16x16_put_avx2)(p, AN_FN(bf16x16_bits_avx2)((__m256)v[0], (__m256)v[1]), nt);
    AN_FN(bf16x16_put_avx2)(p + 16, AN_FN(bf16x16_bits_avx2)((__m256)v[2], (__m256)v[3]), nt);
#endif
}

/* 32 values rounded to bfloat16 and stored (AN_TO_BF16's bits): on AVX-512 bf16x32_put (AVX512_BF16's conversion
 * where the CPU has it), else the rounding without the NaN test (callers: bf16_vec_out's, nf there) */
static inline __attribute__((always_inline)) void AN_FN(pv_put)(uint16_t *p, PVF *v, const int nf, const int nt) {
#ifdef AN_AVX512
    AN_FN(bf16x32_put)(p, (__m512)v[0], (__m512)v[1], nf, nt);
#else
    (void)nf;
    for (int h = 0; h < 2; h++)
        AN_FN(bf16x16_put_avx2)(p + 16 * h, AN_FN(bf16x16_pack_avx2)(AN_FN(bf16x8_bits)((__m256)v[2 * h]),
                                                                     AN_FN(bf16x8_bits)((__m256)v[2 * h + 1])), nt);
#endif
}

static inline __attribute__((always_inline)) PVF AN_FN(pv_round)(PVF v) {
#ifdef AN_AVX512
    return (PVF)AN_FN(bf16x16_round)((__m512)v);
#else
    return (PVF)AN_FN(bf16x8_round)((__m256)v);
#endif
}

/* rational_odd, exp_neg and erf_slope, a register at a time */
static inline __attribute__((always_inline)) PVF AN_FN(rational_odd_pv)(PVF u, uint32_t lim, const float *p, int np,
                                                                         const float *q, int nq) {
    const PVU ui = (PVU)u, ai = ui & 0x7fffffffu, sign = ui ^ ai;
    const PVF a = (PVF)AN_FN(pv_minu)(ai, lim), z = a * a;
    PVF pn = AN_FN(pv_set1)(p[np]), qn = AN_FN(pv_set1)(q[nq]);
    for (int k = np - 1; k >= 0; k--) pn = AN_FN(pv_fma)(pn, z, AN_FN(pv_set1)(p[k]));
    for (int k = nq - 1; k >= 0; k--) qn = AN_FN(pv_fma)(qn, z, AN_FN(pv_set1)(q[k]));
    const PVF r = AN_FN(pv_min)(a * pn / qn, AN_FN(pv_set1)(1.0f));
    const PVU nan = (PVU)(u != u);
    return (PVF)((nan & ui) | (~nan & ((PVU)r | sign)));
}

static inline __attribute__((always_inline)) PVF AN_FN(tanh_pv)(PVF u) {
    return AN_FN(rational_odd_pv)(u, 0x41105000u, an_tanh_p, 4, an_tanh_q, 4);
}

static inline __attribute__((always_inline)) PVF AN_FN(erf_pv)(PVF u) {
    return AN_FN(rational_odd_pv)(u, 0x407AE148u, an_erf_p, 5, an_erf_q, 5);
}

static inline __attribute__((always_inline)) PVF AN_FN(exp_neg_pv)(PVF x) {
    typedef int32_t pv_i __attribute__((vector_size(AN_VW * 4)));
    x = (PVF)AN_FN(pv_minu)((PVU)x, 0xC2AE0000u);
    const PVF t = x * 1.44269504088896341f;
    const pv_i n = __builtin_convertvector(t - 0.5f, pv_i);
    const PVF nf = __builtin_convertvector(n, PVF);
    PVF r = x - nf * 0.693359375f;
    r -= nf * -2.12194440e-4f;
    PVF p = AN_FN(pv_set1)(1.9875691500e-4f);
    p = AN_FN(pv_fma)(p, r, AN_FN(pv_set1)(1.3981999507e-3f));
    p = AN_FN(pv_fma)(p, r, AN_FN(pv_set1)(8.3334519073e-3f));
    p = AN_FN(pv_fma)(p, r, AN_FN(pv_set1)(4.1665795894e-2f));
    p = AN_FN(pv_fma)(p, r, AN_FN(pv_set1)(1.6666665459e-1f));
    p = AN_FN(pv_fma)(p, r, AN_FN(pv_set1)(5.0000001201e-1f));
    p = AN_FN(pv_fma)(p * r, r, r) + 1.0f;
    return p * (PVF)((PVU)(n + 127) << 23);
}

static inline __attribute__((always_inline)) PVF AN_FN(erf_slope_pv)(PVF u) {
    const PVF e = 1.12837916709551257f * AN_FN(exp_neg_pv)(-u * u);
    const PVU nan = (PVU)(((PVU)u & 0x7fffffffu) > 0x7f800000u);
    return (PVF)(((PVU)e & ~nan) | (nan & 0x7fc00000u));
}

/* The forward over [i, c1) of a row, 32 values a step: the stream's bits into so (streamed when nt_s), y into d
 * (streamed when nt_d); returns where the scalar loop takes over. */
static inline __attribute__((always_inline)) int64_t AN_FN(pw_fwd_vec)(
    uint16_t *restrict d, uint16_t *restrict so, const uint16_t *restrict x, const uint16_t *restrict rv,
    const float *restrict w, const float *restrict b, float al, float sh, int64_t i, int64_t c1, const int dyt,
    const int nf, const int nt_d, const int nt_s) {
    for (; i + AN_LANES <= c1; i += AN_LANES) {
        PVF v[AN_VK];
        for (int k = 0; k < AN_VK; k++) {
            v[k] = AN_FN(pv_load_bf16)(x + i + AN_VW * k);
            if (rv) v[k] = AN_FN(pv_round)(v[k] + AN_FN(pv_load_bf16)(rv + i + AN_VW * k));
        }
        if (rv) AN_FN(pv_put_bits)(so + i, v, nt_s);
        for (int k = 0; k < AN_VK; k++) {
            const PVF u = AN_FN(pv_fma)(AN_FN(pv_set1)(al), v[k], AN_FN(pv_set1)(sh));
            const PVF f = dyt ? AN_FN(tanh_pv)(u) : AN_FN(erf_pv)(u);
            v[k] = AN_FN(pv_fma)(AN_FN(pv_load)(w + i + AN_VW * k), f, AN_FN(pv_load)(b + i + AN_VW * k));
        }
        AN_FN(pv_put)(d + i, v, nf, nt_d);
    }
    return i;
}

/* The backward's whole groups of 32 of a row (pw_bwd_block_bf16_body's first loop, whose sums' lanes these are);
 * returns where the scalar loop takes over. */
static inline __attribute__((always_inline)) int64_t AN_FN(pw_bwd_vec)(
    uint16_t *restrict d, const uint16_t *restrict s, const uint16_t *restrict dy, const uint16_t *restrict dres,
    const float *restrict w, float *restrict dw, float *restrict db, float al, float sh, int64_t D,
    float *restrict acc_a, float *restrict acc_s, const int dyt, const int nf, const int nt) {
    PVF ca[AN_VK], cs[AN_VK];
    for (int k = 0; k < AN_VK; k++) ca[k] = cs[k] = (PVF){0};
    int64_t i = 0;
    for (; i + AN_LANES <= D; i += AN_LANES) {
        PVF o[AN_VK];
        for (int k = 0; k < AN_VK; k++) {
            const int64_t e = i + AN_VW * k;
            const PVF sv = AN_FN(pv_load_bf16)(s + e), dv = AN_FN(pv_load_bf16)(dy + e);
            const PVF u = AN_FN(pv_fma)(AN_FN(pv_set1)(al), sv, AN_FN(pv_set1)(sh));
            PVF f, g;
            if (dyt) {
                f = AN_FN(tanh_pv)(u);
                g = dv * AN_FN(pv_load)(w + e) * AN_FN(pv_fma)(-f, f, AN_FN(pv_set1)(1.0f));
            } else {
                f = AN_FN(erf_pv)(u);
                g = dv * AN_FN(pv_load)(w + e) * AN_FN(erf_slope_pv)(u);
            }
            ca[k] = AN_FN(pv_fma)(g, sv, ca[k]);
            cs[k] += g;
            o[k] = AN_FN(pv_fma)(AN_FN(pv_set1)(al), g, AN_FN(pv_load_bf16)(dres + e));
            AN_FN(pv_store)(dw + e, AN_FN(pv_fma)(dv, f, AN_FN(pv_load)(dw + e)));
            AN_FN(pv_store)(db + e, AN_FN(pv_load)(db + e) + dv);
        }
        AN_FN(pv_put)(d + i, o, nf, nt);
    }
    for (int k = 0; k < AN_VK; k++) {
        AN_FN(pv_store)(acc_a + AN_VW * k, ca[k]);
        AN_FN(pv_store)(acc_s + AN_VW * k, cs[k]);
    }
    return i;
}

#undef PVF
#undef PVU
#undef AN_VK
#undef AN_VW
#endif

/* bfloat16 throughout (x, residual, stream, y): one pass per row, the conversions inside it */
static inline __attribute__((always_inline)) void AN_FN(pw_fwd_rows_bf16_body)(const an_pw_args *a, int64_t r0,
                                                                                 int64_t r1, const an_rows *sc,
                                                                                 const int nf) {
    const int64_t D = a->D;
    uint16_t *restrict s16 = (uint16_t *)sc->r[1], *restrict o16 = (uint16_t *)sc->r[2];
    const float *restrict w = a->weight ? a->weight : AN_ONES(sc), *restrict b = a->bias ? a->bias : AN_NZEROS(sc);
    const float al = a->alpha, sh = a->shift;
    const int dyt = a->kind == AN_DYT;
    const int vec = AN_FN(bf16_vec_out)(nf); /* the vector loops (norm_rows.h) */
    for (int64_t r = r0; r < r1; r++) {
        const uint16_t *restrict x = (const uint16_t *)a->x + r * a->x_rs;
        uint16_t *y_row = (uint16_t *)a->y + r * D;
        /* the next row's inputs, a chunk at a time before each chunk of this one (see prefetch_chunk) */
        const uint16_t *restrict rv = a->res ? (const uint16_t *)a->res + r * a->res_rs : NULL;
        const uint16_t *nx = r + 1 < r1 ? x + a->x_rs : NULL, *nr = r + 1 < r1 && rv ? rv + a->res_rs : NULL;
        uint16_t *s_row = a->res && a->s_out ? (uint16_t *)a->s_out + r * D : NULL;
        /* the vector loop's rows take their streaming stores themselves where aligned (stream_direct) */
        const int y_direct = vec && AN_FN(stream_direct)(y_row, a->nt);
        const int s_direct = vec && s_row && AN_FN(stream_direct)(s_row, a->nt);
        uint16_t *restrict d = (a->nt && !y_direct) ? o16 : y_row;
        uint16_t *restrict so = (s_row && (!a->nt || s_direct)) ? s_row : s16;
        for (int64_t c0 = 0; c0 < D; c0 += AN_CHUNK) {
            const int64_t c1 = c0 + AN_CHUNK < D ? c0 + AN_CHUNK : D;
            AN_FN(prefetch_chunk)(nx, nr, NULL, c0, D, 2);
            int64_t i0 = c0;
#if defined(AN_AVX512) || defined(AN_AVX2)
            if (vec) i0 = AN_FN(pw_fwd_vec)(d, so, x, rv, w, b, al, sh, c0, c1, dyt, nf, y_direct, s_direct);
#endif
            if (rv && dyt)
                for (int64_t i = i0; i < c1; i++) {
                    float v = an_bf16_round_nf(an_bf16_to_f32(x[i]) + an_bf16_to_f32(rv[i]));
                    so[i] = (uint16_t)(an_f32_bits(v) >> 16);
                    d[i] = AN_TO_BF16(nf, AN_MAD(w[i], AN_FN(tanh_bf)(AN_MAD(al, v, sh)), b[i]));
                }
            else if (rv)
                for (int64_t i = i0; i < c1; i++) {
                    float v = an_bf16_round_nf(an_bf16_to_f32(x[i]) + an_bf16_to_f32(rv[i]));
                    so[i] = (uint16_t)(an_f32_bits(v) >> 16);
                    d[i] = AN_TO_BF16(nf, AN_MAD(w[i], AN_FN(erf_bf)(AN_MAD(al, v, sh)), b[i]));
                }
            else if (dyt)
                for (int64_t i = i0; i < c1; i++)
                    d[i] = AN_TO_BF16(nf, AN_MAD(w[i], AN_FN(tanh_bf)(AN_MAD(al, an_bf16_to_f32(x[i]), sh)), b[i]));
            else
                for (int64_t i = i0; i < c1; i++)
                    d[i] = AN_TO_BF16(nf, AN_MAD(w[i], AN_FN(erf_bf)(AN_MAD(al, an_bf16_to_f32(x[i]), sh)), b[i]));
        }
        if (s_row && a->nt && !s_direct) AN_FN(stream_bytes)(s_row, s16, (size_t)D * 2);
        if (a->nt && !y_direct) AN_FN(stream_bytes)(y_row, o16, (size_t)D * 2);
    }
}

/* the sum x + r rounded without the NaN test always (both bfloat16: see an_f32_to_bf16_nf); y too when the
 * float32 operands (weight, bias, alpha, shift) hold no NaN that would need it */
static void AN_FN(pw_fwd_rows_bf16)(const an_pw_args *a, int64_t r0, int64_t r1, const an_rows *sc) {
    if (an_nan_safe(a->weight, a->D) && an_nan_safe(a->bias, a->D) && an_scalar_nan_safe(a->alpha) &&
        an_scalar_nan_safe(a->shift))
        AN_FN(pw_fwd_rows_bf16_body)(a, r0, r1, sc, 1);
    else
        AN_FN(pw_fwd_rows_bf16_body)(a, r0, r1, sc, 0);
}

static void AN_FN(pw_fwd_rows)(const an_pw_args *a, int64_t r0, int64_t r1, const an_rows *sc) {
    if (a->xdt == AN_BF16 && a->odt == AN_BF16 && (a->res == NULL || (a->rdt == AN_BF16 && a->sdt == AN_BF16))) {
        AN_FN(pw_fwd_rows_bf16)(a, r0, r1, sc);
        return;
    }
    const int64_t D = a->D;
    const size_t xes = an_elem_size(a->xdt), res = an_elem_size(a->rdt), ses = an_elem_size(a->sdt),
                 oes = an_elem_size(a->odt);
    float *buf = sc->r[0], *tmp = sc->r[1], *out = sc->r[2];
    const float *w = a->weight ? a->weight : AN_ONES(sc), *b = a->bias ? a->bias : AN_NZEROS(sc);
    const float al = a->alpha, sh = a->shift;
    for (int64_t r = r0; r < r1; r++) {
        const float *s = AN_FN(f32_row)((const char *)a->x + r * a->x_rs * xes, a->xdt, buf, D);
        if (a->res) {
            const float *rv = AN_FN(f32_row)((const char *)a->res + r * a->res_rs * res, a->rdt, tmp, D);
            for (int64_t i = 0; i < D; i++) buf[i] = s[i] + rv[i];
            AN_FN(round_row)(buf, D, a->sdt);
            s = buf;
            if (a->s_out) AN_FN(put_row)((char *)a->s_out + r * D * ses, buf, D, a->sdt, a->nt, tmp);
        }
        char *y_row = (char *)a->y + r * D * oes;
        float *o = (a->odt == AN_F32 && !a->nt) ? (float *)y_row : out;
        if (a->kind == AN_DYT)
            for (int64_t i = 0; i < D; i++) o[i] = w[i] * AN_FN(tanh_v)(al * s[i] + sh) + b[i];
        else
            for (int64_t i = 0; i < D; i++) o[i] = w[i] * AN_FN(erf_v)(al * s[i] + sh) + b[i];
        if (o == out) AN_FN(put_row)(y_row, out, D, a->odt, a->nt, tmp);
    }
}

/* bfloat16 throughout (the stream, dy, dres, ds): one pass per row; absent accumulators write a discarded row */
static inline __attribute__((always_inline)) void AN_FN(pw_bwd_block_bf16_body)(
    const an_pw_args *a, int64_t b0, int64_t b1, const an_rows *sc, float *bw, float *bb, double *d_alpha,
    double *d_shift, const int nf) {
    const int64_t D = a->D;
    float *restrict dw = bw ? bw : sc->r[9], *restrict db = bb ? bb : sc->r[10];
    uint16_t *restrict o16 = (uint16_t *)sc->r[5];
    const float *restrict w = a->weight ? a->weight : AN_ONES(sc);
    const float al = a->alpha, sh = a->shift;
    const uint16_t *zeros16 = (const uint16_t *)AN_ZEROS(sc);
    const int vec = AN_FN(bf16_vec_out)(nf); /* the vector loops (norm_rows.h) */
    for (int64_t r = b0; r < b1; r++) {
        if (r + AN_PF_AHEAD < b1) { /* a later row's inputs (see prefetch_span) */
            const int64_t f = r + AN_PF_AHEAD;
            AN_FN(prefetch_span)((const uint16_t *)a->s + f * D, (size_t)D * 2);
            AN_FN(prefetch_span)((const uint16_t *)a->dy + f * a->dy_rs, (size_t)D * 2);
            AN_FN(prefetch_span)(a->dres ? (const uint16_t *)a->dres + f * a->dres_rs : NULL, (size_t)D * 2);
        }
        const uint16_t *restrict s = (const uint16_t *)a->s + r * D;
        const uint16_t *restrict dy = (const uint16_t *)a->dy + r * a->dy_rs;
        const uint16_t *restrict dres = a->dres ? (const uint16_t *)a->dres + r * a->dres_rs : zeros16;
        uint16_t *ds_row = (uint16_t *)a->ds + r * D;
        const int direct = vec && AN_FN(stream_direct)(ds_row, a->nt); /* streamed in the loop */
        uint16_t *restrict d = (a->nt && !direct) ? o16 : ds_row;
        float acc_a[AN_LANES], acc_s[AN_LANES];
        AN_ZERO(acc_a); AN_ZERO(acc_s);
        int64_t i = 0;
#if defined(AN_AVX512) || defined(AN_AVX2)
        if (vec)
            i = AN_FN(pw_bwd_vec)(d, s, dy, dres, w, dw, db, al, sh, D, acc_a, acc_s, a->kind == AN_DYT, nf, direct);
#endif
        if (a->kind == AN_DYT) {
            for (; i + AN_LANES <= D; i += AN_LANES)
                for (int j = 0; j < AN_LANES; j++) {
                    float sv = an_bf16_to_f32(s[i + j]), dv = an_bf16_to_f32(dy[i + j]);
                    float f = AN_FN(tanh_bf)(AN_MAD(al, sv, sh));
                    float g = dv * w[i + j] * AN_MAD(-f, f, 1.0f);
                    acc_a[j] = AN_MAD(g, sv, acc_a[j]);
                    acc_s[j] += g;
                    d[i + j] = AN_TO_BF16(nf, AN_MAD(al, g, an_bf16_to_f32(dres[i + j])));
                    dw[i + j] = AN_MAD(dv, f, dw[i + j]);
                    db[i + j] += dv;
                }
            for (; i < D; i++) {
                float sv = an_bf16_to_f32(s[i]), dv = an_bf16_to_f32(dy[i]);
                float f = AN_FN(tanh_bf)(AN_MAD(al, sv, sh));
                float g = dv * w[i] * AN_MAD(-f, f, 1.0f);
                acc_a[0] = AN_MAD(g, sv, acc_a[0]);
                acc_s[0] += g;
                d[i] = AN_TO_BF16(nf, AN_MAD(al, g, an_bf16_to_f32(dres[i])));
                dw[i] = AN_MAD(dv, f, dw[i]);
                db[i] += dv;
            }
        } else {
            for (; i + AN_LANES <= D; i += AN_LANES)
                for (int j = 0; j < AN_LANES; j++) {
                    float sv = an_bf16_to_f32(s[i + j]), dv = an_bf16_to_f32(dy[i + j]);
                    float u = AN_MAD(al, sv, sh);
                    float f = AN_FN(erf_bf)(u);
                    float g = dv * w[i + j] * AN_FN(erf_slope)(u);
                    acc_a[j] = AN_MAD(g, sv, acc_a[j]);
                    acc_s[j] += g;
                    d[i + j] = AN_TO_BF16(nf, AN_MAD(al, g, an_bf16_to_f32(dres[i + j])));
                    dw[i + j] = AN_MAD(dv, f, dw[i + j]);
                    db[i + j] += dv;
                }
            for (; i < D; i++) {
                float sv = an_bf16_to_f32(s[i]), dv = an_bf16_to_f32(dy[i]);
                float u = AN_MAD(al, sv, sh);
                float f = AN_FN(erf_bf)(u);
                float g = dv * w[i] * AN_FN(erf_slope)(u);
                acc_a[0] = AN_MAD(g, sv, acc_a[0]);
                acc_s[0] += g;
                d[i] = AN_TO_BF16(nf, AN_MAD(al, g, an_bf16_to_f32(dres[i])));
                dw[i] = AN_MAD(dv, f, dw[i]);
                db[i] += dv;
            }
        }
        *d_alpha += (double)AN_FN(hsum)(acc_a);
        *d_shift += (double)AN_FN(hsum)(acc_s);
        if (a->nt && !direct) AN_FN(stream_bytes)(ds_row, o16, (size_t)D * 2);
    }
}

/* nf: pw_bwd_rows' verdict on the call (ds rounded without the NaN test when no float32 operand needs it) */
static void AN_FN(pw_bwd_block_bf16)(const an_pw_args *a, int64_t b0, int64_t b1, const an_rows *sc, float *bw,
                                     float *bb, double *d_alpha, double *d_shift, const int nf) {
    if (nf)
        AN_FN(pw_bwd_block_bf16_body)(a, b0, b1, sc, bw, bb, d_alpha, d_shift, 1);
    else
        AN_FN(pw_bwd_block_bf16_body)(a, b0, b1, sc, bw, bb, d_alpha, d_shift, 0);
}

/* partial: [0] dw row, [1] db row, [2] (dalpha, dshift) -- this chunk's float64 sums (each NULL if unwanted) */
static void AN_FN(pw_bwd_rows)(const an_pw_args *a, int64_t r0, int64_t r1, const an_rows *sc, double *const *partial) {
    const int64_t D = a->D;
    const size_t ses = an_elem_size(a->sdt), dyes = an_elem_size(a->dydt), dres_es = an_elem_size(a->dresdt),
                 oes = an_elem_size(a->sdt);
    float *g = sc->r[3], *fv = sc->r[4], *tmp = sc->r[5];
    const int direct = sc->f32_partials; /* each chunk one block: its float32 sums go straight to its partial rows */
    float *bw = partial[0] ? (direct ? (float *)partial[0] : sc->r[6]) : NULL;
    float *bb = partial[1] ? (direct ? (float *)partial[1] : sc->r[7]) : NULL;
    const float *w = a->weight ? a->weight : AN_ONES(sc);
    const float al = a->alpha, sh = a->shift;
    double d_alpha = 0.0, d_shift = 0.0;
    const int bf16 = a->sdt == AN_BF16 && a->dydt == AN_BF16 && (a->dres == NULL || a->dresdt == AN_BF16);
    /* once per chunk: the NaN verdict over the float32 operands (weight, alpha, shift) */
    const int nf = bf16 && an_nan_safe(a->weight, D) && an_scalar_nan_safe(a->alpha) && an_scalar_nan_safe(a->shift);
    for (int64_t b0 = r0; b0 < r1; b0 += AN_BLOCK) {
        const int64_t b1 = b0 + AN_BLOCK < r1 ? b0 + AN_BLOCK : r1;
        if (bw && !direct) memset(bw, 0, sizeof(float) * (size_t)D);
        if (bb && !direct) memset(bb, 0, sizeof(float) * (size_t)D);
        if (bf16) {
            AN_FN(pw_bwd_block_bf16)(a, b0, b1, sc, bw, bb, &d_alpha, &d_shift, nf);
        } else
        for (int64_t r = b0; r < b1; r++) {
            /* a later row's inputs, as the bf16 loop does (see prefetch_span): on the 2-core Xeon, with the caches
             * flushed, 8192 x 1024, DyT's fwd+bwd 15.5 -> 14.1 ms, Derf's 18.6 -> 13.8 (AVX2: 22.4 -> 17.4,
             * 22.5 -> 17.6). The float32 forward is left without: 4-7 % slower with it. */
            if (r + AN_PF_AHEAD < r1) {
                const int64_t f = r + AN_PF_AHEAD;
                AN_FN(prefetch_span)((const char *)a->s + f * D * ses, (size_t)D * ses);
                AN_FN(prefetch_span)((const char *)a->dy + f * a->dy_rs * dyes, (size_t)D * dyes);
                AN_FN(prefetch_span)(a->dres ? (const char *)a->dres + f * a->dres_rs * dres_es : NULL,
                                     (size_t)D * dres_es);
            }
            const float *s = AN_FN(f32_row)((const char *)a->s + r * D * ses, a->sdt, sc->r[0], D);
            const float *dy = AN_FN(f32_row)((const char *)a->dy + r * a->dy_rs * dyes, a->dydt, sc->r[1], D);
            const float *dres = a->dres ? AN_FN(f32_row)((const char *)a->dres + r * a->dres_rs * dres_es, a->dresdt,
                                                         sc->r[2], D) : AN_ZEROS(sc);
            /* g = dy w f'(u), f = f(u) */
            if (a->kind == AN_DYT) {
                for (int64_t i = 0; i < D; i++) {
                    float f = AN_FN(tanh_v)(al * s[i] + sh);
                    fv[i] = f;
                    g[i] = dy[i] * w[i] * (1.0f - f * f);
                }
            } else {
                for (int64_t i = 0; i < D; i++) {
                    float u = al * s[i] + sh;
                    fv[i] = AN_FN(erf_v)(u);
                    g[i] = dy[i] * w[i] * AN_FN(erf_slope)(u);
                }
            }
            float acc_a[AN_LANES], acc_s[AN_LANES];
            AN_ZERO(acc_a); AN_ZERO(acc_s);
            int64_t i = 0;
            for (; i + AN_LANES <= D; i += AN_LANES)
                for (int j = 0; j < AN_LANES; j++) {
                    acc_a[j] += g[i + j] * s[i + j];
                    acc_s[j] += g[i + j];
                }
            for (; i < D; i++) {
                acc_a[0] += g[i] * s[i];
                acc_s[0] += g[i];
            }
            d_alpha += (double)AN_FN(hsum)(acc_a);
            d_shift += (double)AN_FN(hsum)(acc_s);
            char *ds_row = (char *)a->ds + r * D * oes;
            float *o = (a->sdt == AN_F32 && !a->nt) ? (float *)ds_row : tmp;
            for (i = 0; i < D; i++) o[i] = al * g[i] + dres[i];
            if (o == tmp) AN_FN(put_row)(ds_row, tmp, D, a->sdt, a->nt, sc->r[8]);
            if (bw) for (i = 0; i < D; i++) bw[i] += dy[i] * fv[i];
            if (bb) for (i = 0; i < D; i++) bb[i] += dy[i];
        }
        if (bw && !direct) for (int64_t i = 0; i < D; i++) partial[0][i] += (double)bw[i];
        if (bb && !direct) for (int64_t i = 0; i < D; i++) partial[1][i] += (double)bb[i];
    }
    if (partial[2]) {
        partial[2][0] += d_alpha;
        partial[2][1] += d_shift;
    }
}

#undef AN_FN
#undef AN_CAT
#undef AN_CAT2
