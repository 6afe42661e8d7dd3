/* Row kernels of Attention Residuals' depth mix (Kimi Team 2026, arXiv:2603.15031, eqs. 2-4): per token, S
 * source rows v_s of C (the earlier layers' outputs, or block sums), u = query * key-norm weight (float32, C):
 *
 *   forward   rstd_s = 1/sqrt(|v_s|^2/C + eps),  l_s = rstd_s <u, v_s>,  alpha = softmax_s(l),
 *             h = sum_s alpha_s v_s
 *   backward  dalpha_s = <dh, v_s>,  dl_s = alpha_s (dalpha_s - sum_t alpha_t dalpha_t),  c_s = dl_s rstd_s
 *             dv_s = alpha_s dh + c_s u - (c_s l_s rstd_s / C) v_s;   du += sum_s c_s v_s   (per chunk, float64)
 *
 * One pass over the token's S rows each way: a reducing walk (both sums of each row at once), then the writing
 * walk while the rows are still in cache. Every sum in float32, each output rounded once. Included per
 * instruction set after norm_rows.h.
 */

#define AN_CAT2(a, b) a##b
#define AN_CAT(a, b) AN_CAT2(a, b)
#define AN_FN(name) AN_CAT(name, AN_SFX)

/* element i of a row stored in dt, as float32 (dt a constant in the always-inline callers) */
static inline __attribute__((always_inline)) float AN_FN(attn_ld)(const void *row, int64_t i, const int dt) {
    if (dt == AN_F32) return ((const float *)row)[i];
    if (dt == AN_BF16) return an_bf16_to_f32(((const uint16_t *)row)[i]);
    return an_f16_to_f32(((const uint16_t *)row)[i]);
}

static inline __attribute__((always_inline)) void AN_FN(attn_st)(void *row, int64_t i, float v, const int dt) {
    if (dt == AN_F32) ((float *)row)[i] = v;
    else if (dt == AN_BF16) ((uint16_t *)row)[i] = an_f32_to_bf16(v);
    else ((uint16_t *)row)[i] = an_f32_to_f16(v);
}

/* (sum of v^2, sum of a v) over a row, with AN_LANES partial sums each */
static inline __attribute__((always_inline)) void AN_FN(attn_sums)(const void *v, const float *restrict a, int64_t C,
                                                                    const int dt, float *sq, float *dot) {
    float s[AN_LANES], d[AN_LANES];
    AN_ZERO(s); AN_ZERO(d);
    int64_t i = 0;
    for (; i + AN_LANES <= C; i += AN_LANES)
        for (int j = 0; j < AN_LANES; j++) {
            const float x = AN_FN(attn_ld)(v, i + j, dt);
            s[j] += x * x;
            d[j] += a[i + j] * x;
        }
    for (; i < C; i++) {
        const float x = AN_FN(attn_ld)(v, i, dt);
        s[0] += x * x;
        d[0] += a[i] * x;
    }
    *sq = AN_FN(hsum)(s);
    *dot = AN_FN(hsum)(d);
}

/* <g, v> and <u, v> over a row (g, u float32) */
static inline __attribute__((always_inline)) void AN_FN(attn_dots)(const void *v, const float *restrict g,
                                                                    const float *restrict u, int64_t C, const int dt,
                                                                    float *dg, float *du) {
    float a[AN_LANES], b[AN_LANES];
    AN_ZERO(a); AN_ZERO(b);
    int64_t i = 0;
    for (; i + AN_LANES <= C; i += AN_LANES)
        for (int j = 0; j < AN_LANES; j++) {
            const float x = AN_FN(attn_ld)(v, i + j, dt);
            a[j] += g[i + j] * x;
            b[j] += u[i + j] * x;
        }
    for (; i < C; i++) {
        const float x = AN_FN(attn_ld)(v, i, dt);
        a[0] += g[i] * x;
        b[0] += u[i] * x;
    }
    *dg = AN_FN(hsum)(a);
    *du = AN_FN(hsum)(b);
}

/* alpha = softmax(l) over S values, the max subtracted first (in double: S values a token) */
static void AN_FN(attn_softmax)(const float *l, float *alpha, int S) {
    float m = l[0];
    for (int s = 1; s < S; s++) m = l[s] > m ? l[s] : m;
    double e[AN_ATTN_MAX_S], sum = 0.0;
    for (int s = 0; s < S; s++) sum += (e[s] = exp((double)l[s] - (double)m));
    for (int s = 0; s < S; s++) alpha[s] = (float)(e[s] / sum);
}

static inline __attribute__((always_inline)) void AN_FN(attn_fwd_dt)(const an_attn_args *a, int64_t r0, int64_t r1,
                                                                      const an_rows *sc, const int dt) {
    const int64_t C = a->C;
    const int S = a->S;
    const size_t es = dt == AN_F32 ? 4 : 2;
    float *restrict acc = sc->r[0];
    float l[AN_ATTN_MAX_S];
    for (int64_t t = r0; t < r1; t++) {
        const size_t off = (size_t)t * (size_t)C * es;
        float *alpha = a->alpha + t * S, *rstd = a->rstd + t * S;
        for (int s = 0; s < S; s++) {
            float sq, z;
            AN_FN(attn_sums)((const char *)a->v[s] + off, a->u, C, dt, &sq, &z);
            rstd[s] = an_rstd(sq / (float)C, a->eps);
            l[s] = z * rstd[s];
        }
        AN_FN(attn_softmax)(l, alpha, S);
        const void *v0 = (const char *)a->v[0] + off;
        for (int64_t i = 0; i < C; i++) acc[i] = alpha[0] * AN_FN(attn_ld)(v0, i, dt);
        for (int s = 1; s < S; s++) {
            const void *vs = (const char *)a->v[s] + off;
            const float w = alpha[s];
            for (int64_t i = 0; i < C; i++) acc[i] += w * AN_FN(attn_ld)(vs, i, dt);
        }
        void *h = (char *)a->h + off;
        for (int64_t i = 0; i < C; i++) AN_FN(attn_st)(h, i, acc[i], dt);
    }
}

static inline __attribute__((always_inline)) void AN_FN(attn_bwd_dt)(const an_attn_args *a, int64_t r0, int64_t r1,
                                                                      const an_rows *sc, double *du, const int dt) {
    const int64_t C = a->C;
    const int S = a->S;
    const size_t es = dt == AN_F32 ? 4 : 2;
    const float *restrict u = a->u;
    float *restrict g = sc->r[0];   /* dh of the token as float32 */
    float *restrict dut = sc->r[1]; /* the token's sum_s c_s v_s */
    float coef[AN_ATTN_MAX_S], k[AN_ATTN_MAX_S];
    for (int64_t t = r0; t < r1; t++) {
        const size_t off = (size_t)t * (size_t)C * es;
        const float *alpha = a->alpha_in + t * S, *rstd = a->rstd_in + t * S;
        const void *dh = (const char *)a->dh + off;
        for (int64_t i = 0; i < C; i++) g[i] = AN_FN(attn_ld)(dh, i, dt);
        float da[AN_ATTN_MAX_S], l[AN_ATTN_MAX_S], mean = 0.0f;
        for (int s = 0; s < S; s++) {
            float z;
            AN_FN(attn_dots)((const char *)a->v[s] + off, g, u, C, dt, &da[s], &z);
            l[s] = z * rstd[s];
            mean += alpha[s] * da[s];
        }
        for (int s = 0; s < S; s++) {
            coef[s] = alpha[s] * (da[s] - mean) * rstd[s];  /* c_s */
            k[s] = coef[s] * l[s] * rstd[s] / (float)C;
        }
        for (int s = 0; s < S; s++) {
            const void *vs = (const char *)a->v[s] + off;
            void *dv = (char *)a->dv[s] + off;
            const float al = alpha[s], c = coef[s], ks = k[s];
            if (s == 0)
                for (int64_t i = 0; i < C; i++) {
                    const float x = AN_FN(attn_ld)(vs, i, dt);
                    AN_FN(attn_st)(dv, i, al * g[i] + c * u[i] - ks * x, dt);
                    dut[i] = c * x;
                }
            else
                for (int64_t i = 0; i < C; i++) {
                    const float x = AN_FN(attn_ld)(vs, i, dt);
                    AN_FN(attn_st)(dv, i, al * g[i] + c * u[i] - ks * x, dt);
                    dut[i] += c * x;
                }
        }
        for (int64_t i = 0; i < C; i++) du[i] += (double)dut[i];
    }
}

static void AN_FN(attn_rows)(const an_attn_args *a, int64_t r0, int64_t r1, const an_rows *sc, double *du) {
    if (a->op == AN_ATTN_FWD) {
        if (a->dt == AN_F32) AN_FN(attn_fwd_dt)(a, r0, r1, sc, AN_F32);
        else if (a->dt == AN_BF16) AN_FN(attn_fwd_dt)(a, r0, r1, sc, AN_BF16);
        else AN_FN(attn_fwd_dt)(a, r0, r1, sc, AN_F16);
    } else {
        if (a->dt == AN_F32) AN_FN(attn_bwd_dt)(a, r0, r1, sc, du, AN_F32);
        else if (a->dt == AN_BF16) AN_FN(attn_bwd_dt)(a, r0, r1, sc, du, AN_BF16);
        else AN_FN(attn_bwd_dt)(a, r0, r1, sc, du, AN_F16);
    }
}
