/* Row kernels of the widened residual stream (hyper-connections, mHC, mHC-lite): per token, the stream is
 * n rows of C, mixed by per-token coefficients (float32).
 *
 *   read    h = sum_i H_pre[i] X_i                                   (C)
 *           backward: dX_i = H_pre[i] dh,  dH_pre[i] = <dh, X_i>
 *   write   X'_i = sum_j H_res[i, j] X_j + H_post[i] y                (n x C), and q = sum_i |X'_i|^2: the
 *           statistic the next layer's RMS of vec(X') needs, from the values as stored
 *           backward (g_i = dX'_i + 2 dq X'_i):  dX_j = sum_i H_res[i, j] g_i,  dy = sum_i H_post[i] g_i,
 *                     dH_post[i] = <g_i, y>,  dH_res[i, j] = <g_i, X_j>
 *
 * One pass over the token's rows each way; every sum in float32, each output rounded once. Included per
 * instruction set after norm_rows.h and fused_rows.h.
 */

#define AN_CAT2(a, b) a##b
#define AN_CAT(a, b) AN_CAT2(a, b)
#define AN_FN(name) AN_CAT(name, AN_SFX)

static float AN_FN(dot)(const float *restrict a, const float *restrict b, int64_t n) {
    float acc[AN_LANES];
    AN_ZERO(acc);
    int64_t i = 0;
    for (; i + AN_LANES <= n; i += AN_LANES)
        for (int j = 0; j < AN_LANES; j++) acc[j] += a[i + j] * b[i + j];
    for (; i < n; i++) acc[0] += a[i] * b[i];
    return AN_FN(hsum)(acc);
}

/* dst (+)= c * src */
static void AN_FN(axpy)(float *restrict dst, const float *restrict src, float c, int64_t n, int first) {
    if (first) for (int64_t i = 0; i < n; i++) dst[i] = c * src[i];
    else for (int64_t i = 0; i < n; i++) dst[i] += c * src[i];
}

/* sum of v^2 over a bfloat16 row, with dot's lanes and order */
static float AN_FN(sq_sum_bf16)(const uint16_t *restrict v, int64_t n) {
    float acc[AN_LANES];
    AN_ZERO(acc);
    int64_t i = 0;
    for (; i + AN_LANES <= n; i += AN_LANES)
        for (int j = 0; j < AN_LANES; j++) {
            const float f = an_bf16_to_f32(v[i + j]);
            acc[j] += f * f;
        }
    for (; i < n; i++) {
        const float f = an_bf16_to_f32(v[i]);
        acc[0] += f * f;
    }
    return AN_FN(hsum)(acc);
}

/* One output row of the write, for a constant n and float32 or bfloat16 storage: each value
 * v = H_post[i] y + sum_j H_res[i, j] X_j, rounded to the storage dtype and stored, in one walk over the row
 * instead of the axpy, round_row, put_row sequence's n + 3; then the row's sum of squares from the values as stored
 * (still in L1), with dot's lanes and order. Summed inside the first walk, the accumulator row lived on the stack
 * (a store-to-load chain every 16 values): 64 tokens x 4 x 768 in float32 took 47.9 us a call against 39.3 without
 * the sum (AVX2). Not bit for bit the sequence: under -fassociative-math gcc regroups the n + 1 terms
 * ((a + b) + (c + d)), which moves a value by up to an ulp of the largest term (1 + 2^-23 where the sequential sum
 * gives 1); compiled without that flag these loops kept the order but lost their vectorization (10x slower in
 * bf16: the conversion helpers were no longer inlined), so the regrouping stays. Returns the row's sum of
 * squares (want_q), or 0 where no one reads it (a write without q; mHC's fused write+read, whose read takes its
 * own). */
static inline __attribute__((always_inline)) float AN_FN(stream_write_row)(
    void *restrict dst, const float *const *xs, const float *restrict y, const float *restrict hres_i,
    float hpost_i, int64_t C, const int n, const int bf16, const int nf, int nt, void *restrict tmp, const int want_q) {
    const float *restrict x[AN_STREAM_MAX_N];
    for (int j = 0; j < n; j++) x[j] = xs[j];
    uint16_t *restrict d16 = (uint16_t *)(nt ? tmp : dst);
    float *restrict d32 = (float *)(nt ? tmp : dst);
    for (int64_t k = 0; k < C; k++) {
        float v = hpost_i * y[k];
        for (int j = 0; j < n; j++) v += hres_i[j] * x[j][k];
        if (bf16)
            d16[k] = (uint16_t)(an_f32_bits(AN_BF16_ROUND(nf, v)) >> 16);
        else
            d32[k] = v;
    }
    const float q = !want_q ? 0.0f : bf16 ? AN_FN(sq_sum_bf16)(d16, C) : AN_FN(dot)(d32, d32, C);
    if (nt) AN_FN(stream_bytes)(dst, tmp, (size_t)C * (bf16 ? 2 : 4));
    return q;
}

/* stream_write_row for n = 2 or 4 as one function that every caller shares (the stream write, mHC's fused
 * write+read): under -fassociative-math gcc may regroup the same inlined loop differently at each place it is inlined
 * (the baseline path's n = 2 did: an ulp apart), and the fused pass must give the write's bits. noclone too: a caller
 * passing constant n would otherwise get a clone of its own, compiled apart (AVX2's n = 4 backward: an ulp apart) */
static __attribute__((noinline, noclone)) float AN_FN(stream_write_row_n)(void *restrict dst, const float *const *xs,
                                                                         const float *restrict y,
                                                                         const float *restrict hres_i, float hpost_i,
                                                                         int64_t C, int n, int bf16, int nf, int nt,
                                                                         void *restrict tmp, int want_q) {
#define AN_SW(N, B, F) return AN_FN(stream_write_row)(dst, xs, y, hres_i, hpost_i, C, N, B, F, nt, tmp, want_q)
    if (n == 2) {
        if (!bf16) AN_SW(2, 0, 0);
        if (nf) AN_SW(2, 1, 1);
        AN_SW(2, 1, 0);
    }
    if (!bf16) AN_SW(4, 0, 0);
    if (nf) AN_SW(4, 1, 1);
    AN_SW(4, 1, 0);
#undef AN_SW
}

/* h = sum_i H_pre[i] X_i in one pass over the n rows as stored (xrow: the token's n rows of C), for a constant n
 * and float32 or bfloat16 storage, rounded once as put_row rounds (the terms regrouped as in stream_write_row) */
static inline __attribute__((always_inline)) void AN_FN(stream_read_row)(
    void *restrict dst, const void *xrow, const float *restrict hp, int64_t C, const int n, const int bf16,
    const int nf, int nt, void *restrict tmp) {
    uint16_t *restrict d16 = (uint16_t *)(nt ? tmp : dst);
    float *restrict d32 = (float *)(nt ? tmp : dst);
    if (bf16) {
        const uint16_t *restrict x[AN_STREAM_MAX_N];
        for (int j = 0; j < n; j++) x[j] = (const uint16_t *)xrow + (size_t)j * (size_t)C;
        for (int64_t k = 0; k < C; k++) {
            float v = hp[0] * an_bf16_to_f32(x[0][k]);
            for (int j = 1; j < n; j++) v += hp[j] * an_bf16_to_f32(x[j][k]);
            d16[k] = AN_TO_BF16(nf, v);
        }
    } else {
        const float *restrict x[AN_STREAM_MAX_N];
        for (int j = 0; j < n; j++) x[j] = (const float *)xrow + (size_t)j * (size_t)C;
        for (int64_t k = 0; k < C; k++) {
            float v = hp[0] * x[0][k];
            for (int j = 1; j < n; j++) v += hp[j] * x[j][k];
            d32[k] = v;
        }
    }
    if (nt) AN_FN(stream_bytes)(dst, tmp, (size_t)C * (bf16 ? 2 : 4));
}

/* the token loop of the read and the write for a constant n (2 or 4: the widths the papers use) in float32 or
 * bfloat16 */
static inline __attribute__((always_inline)) void AN_FN(stream_fwd_fixed)(const an_stream_args *a, int64_t r0,
                                                                           int64_t r1, const an_rows *sc,
                                                                           const int n, const int bf16,
                                                                           const int nf) {
    const int64_t C = a->C;
    const size_t es = bf16 ? 2 : 4;
    void *tmp = sc->r[AN_STREAM_MAX_N + 2];
    const float *xs[AN_STREAM_MAX_N];
    for (int64_t t = r0; t < r1; t++) {
        const char *xrow = (const char *)a->x + t * (int64_t)n * C * (int64_t)es;
        if (a->op == AN_STREAM_READ) {
            /* a later token's n rows (see prefetch_span): bf16 on every CPU, float32 where the loops prefetch at all
             * (g_swpf). On the AMD EPYC, caches flushed, the order-balanced A/B of the journal had the float32 read
             * without them at 0.94-0.98 of its time with them on AVX2 and 1.04-1.06 on AVX-512, whose four readings
             * each way overlap; the bf16 read 0.99-1.04 with its requests on both sides, its loops unchanged */
            if (t + AN_PF_AHEAD < r1) {
                const char *f = xrow + (size_t)AN_PF_AHEAD * (size_t)n * (size_t)C * es;
                if (bf16) AN_FN(prefetch_span_always)(f, (size_t)n * (size_t)C * es);
                else AN_FN(prefetch_span)(f, (size_t)n * (size_t)C * es);
            }
            AN_FN(stream_read_row)((char *)a->out + t * C * (int64_t)es, xrow, a->h_pre + t * n, C, n, bf16, nf,
                                   a->nt, tmp);
        } else { /* every row is read n times: converted once */
            for (int i = 0; i < n; i++)
                xs[i] = AN_FN(f32_row)(xrow + (size_t)i * (size_t)C * es, a->dt, sc->r[i], C);
            const float *hpost = a->h_post + t * n, *hres = a->h_res + t * n * n;
            const float *y = AN_FN(f32_row)((const char *)a->y + t * C * (int64_t)es, a->dt,
                                            sc->r[AN_STREAM_MAX_N], C);
            char *xo = (char *)a->out + t * (int64_t)n * C * (int64_t)es;
            /* the next token's rows, one before each of this token's output rows (y's with the first); on every
             * CPU, AMD's too (g_swpf): there the bf16 write took 1.09 times as long without them (AVX2 1.22) */
            const int more = bf16 && t + 1 < r1; /* float32 lost 16 % with it on AVX2 */
            const char *nxrow = more ? xrow + (size_t)n * (size_t)C * es : NULL;
            const char *ny = more ? (const char *)a->y + (t + 1) * C * (int64_t)es : NULL;
            float q = 0.0f;
            for (int i = 0; i < n; i++) {
                if (more) AN_FN(prefetch_next_always)(nxrow + (size_t)i * (size_t)C * es, i == 0 ? ny : NULL, NULL,
                                                      NULL, (size_t)C * es);
                q += AN_FN(stream_write_row_n)(xo + (size_t)i * (size_t)C * es, xs, y, hres + i * n, hpost[i], C, n,
                                             bf16, nf, a->nt, tmp, a->q != NULL);
            }
            if (a->q) a->q[t] = q;
        }
    }
}

/* One pass of the write's backward for a constant n, float32 or bfloat16: out = sum_i c[i] g_i, stored in the
 * storage dtype, and dots[i] = <g_i, v> for each i with dot's lanes and order, v the row vrow read where it lies. dy
 * with its dH_post (v = y), and each dX_j with its dH_res[., j] (v = X_j): n + 1 passes per token where the general
 * loop makes 2n(n + 1). The sum's terms may be regrouped (see stream_write_row). */
static inline __attribute__((always_inline)) void AN_FN(stream_mix_dots)(
    void *restrict dst, float *const *gs, const float *c, int64_t cstride, const void *restrict vrow,
    float *dots, int64_t C, const int n, const int bf16, const int nf, int nt, void *restrict tmp) {
    const float *restrict g[AN_STREAM_MAX_N];
    float cc[AN_STREAM_MAX_N];
    float acc[AN_STREAM_MAX_N][AN_LANES];
    AN_FN(zero_bytes)(acc, (size_t)n * sizeof acc[0]); /* the n rows in use */
    for (int i = 0; i < n; i++) {
        g[i] = gs[i];
        cc[i] = c[i * cstride];
    }
    const uint16_t *restrict vb = (const uint16_t *)vrow;
    const float *restrict vf = (const float *)vrow;
    uint16_t *restrict d16 = (uint16_t *)(nt ? tmp : dst);
    float *restrict d32 = (float *)(nt ? tmp : dst);
    int64_t k = 0;
    for (; k + AN_LANES <= C; k += AN_LANES)
        for (int l = 0; l < AN_LANES; l++) {
            const float v = bf16 ? an_bf16_to_f32(vb[k + l]) : vf[k + l];
            float o = cc[0] * g[0][k + l];
            acc[0][l] += g[0][k + l] * v;
            for (int i = 1; i < n; i++) {
                o += cc[i] * g[i][k + l];
                acc[i][l] += g[i][k + l] * v;
            }
            if (bf16) d16[k + l] = AN_TO_BF16(nf, o);
            else d32[k + l] = o;
        }
    for (; k < C; k++) {
        const float v = bf16 ? an_bf16_to_f32(vb[k]) : vf[k];
        float o = cc[0] * g[0][k];
        acc[0][0] += g[0][k] * v;
        for (int i = 1; i < n; i++) {
            o += cc[i] * g[i][k];
            acc[i][0] += g[i][k] * v;
        }
        if (bf16) d16[k] = AN_TO_BF16(nf, o);
        else d32[k] = o;
    }
    for (int i = 0; i < n; i++) dots[i] = AN_FN(hsum)(acc[i]);
    if (nt) AN_FN(stream_bytes)(dst, tmp, (size_t)C * (bf16 ? 2 : 4));
}

/* stream_mix_dots for n = 2 or 4 as one function that every caller shares, never inlined nor cloned (see
 * stream_write_row_n) */
static __attribute__((noinline, noclone)) void AN_FN(stream_mix_dots_n)(void *restrict dst, float *const *gs,
                                                                        const float *c, int64_t cstride,
                                                                        const void *restrict vrow, float *dots,
                                                                        int64_t C, int n, int bf16, int nf, int nt,
                                                                        void *restrict tmp) {
#define AN_SM(N, B, F) AN_FN(stream_mix_dots)(dst, gs, c, cstride, vrow, dots, C, N, B, F, nt, tmp)
    if (n == 2) {
        if (!bf16) AN_SM(2, 0, 0);
        else if (nf) AN_SM(2, 1, 1);
        else AN_SM(2, 1, 0);
    } else {
        if (!bf16) AN_SM(4, 0, 0);
        else if (nf) AN_SM(4, 1, 1);
        else AN_SM(4, 1, 0);
    }
#undef AN_SM
}

/* one token's write backward from its g_i rows (n = 2 or 4, float32 or bfloat16): dy with dH_post (v = y), then each
 * dX_j with dH_res[., j] (v = X_j), each by stream_mix_dots_n; the stream write's backward and mHC's fused one share
 * it, so the same g gives both the same bits */
static void AN_FN(stream_write_bwd_token)(void *dy, void *dx, const void *yrow, const void *xin, float *const *gs,
                                          const float *hpost, const float *hres, float *d_post, float *d_res,
                                          int64_t C, int n, int bf16, int nf, int nt, void *tmp) {
    const size_t es = bf16 ? 2 : 4;
    float dots[AN_STREAM_MAX_N];
    AN_FN(stream_mix_dots_n)(dy, gs, hpost, 1, yrow, dots, C, n, bf16, nf, nt, tmp);
    for (int i = 0; i < n; i++) d_post[i] = dots[i];
    for (int j = 0; j < n; j++) {
        AN_FN(stream_mix_dots_n)((char *)dx + (size_t)j * (size_t)C * es, gs, hres + j, n,
                                 (const char *)xin + (size_t)j * (size_t)C * es, dots, C, n, bf16, nf, nt, tmp);
        for (int i = 0; i < n; i++) d_res[i * n + j] = dots[i];
    }
}

/* the write's backward for a constant n (2 or 4), float32 or bfloat16: g_i as the general loop forms them (float32
 * rows of dX' read where they lie when there is no dq), then stream_write_bwd_token for dy and each dX_j */
static inline __attribute__((always_inline)) void AN_FN(stream_write_bwd_fixed)(const an_stream_args *a, int64_t r0,
                                                                                 int64_t r1, const an_rows *sc,
                                                                                 const int n, const int bf16,
                                                                                 const int nf) {
    const int64_t C = a->C;
    const size_t es = bf16 ? 2 : 4;
    void *tmp = sc->r[AN_STREAM_MAX_N + 2];
    float *gs[AN_STREAM_MAX_N];
    for (int64_t t = r0; t < r1; t++) {
        /* bf16: a later token's rows: dX', X', the stream read and y (see prefetch_span). Caches flushed, 8192 tokens
         * x 4 x 1024, fwd+bwd: 22.7 -> 20.7 ms (AVX2 30.0 -> 29.0). The general loop's backward (float32, and the
         * read's) was left without: float32 lost 6-13 % with it, the bf16 read gained nothing. On every CPU, AMD's
         * too (g_swpf): there the write's fwd+bwd took 1.02 times as long without it (AVX2 1.08). */
        if (bf16 && t + AN_PF_AHEAD < r1) {
            const int64_t f = t + AN_PF_AHEAD;
            const size_t nb = (size_t)n * (size_t)C * 2;
            AN_FN(prefetch_span_always)((const uint16_t *)a->x + f * (int64_t)n * C, nb);
            const int dq = a->xout && a->dq && a->dq[f] != 0.0f;
            AN_FN(prefetch_span_always)(dq ? (const uint16_t *)a->xout + f * (int64_t)n * C : NULL, nb);
            AN_FN(prefetch_span_always)((const uint16_t *)a->xin + f * (int64_t)n * C, nb);
            AN_FN(prefetch_span_always)((const uint16_t *)a->y + f * C, (size_t)C * 2);
        }
        const char *xrow = (const char *)a->x + t * (int64_t)n * C * (int64_t)es;
        const char *xout = a->xout ? (const char *)a->xout + t * (int64_t)n * C * (int64_t)es : NULL;
        const float dq = a->dq ? a->dq[t] : 0.0f;
        const float *hpost = a->h_post + t * n;
        for (int i = 0; i < n; i++) { /* g_i = dX'_i + 2 dq X'_i */
            const char *gi = xrow + (size_t)i * (size_t)C * es;
            if (!bf16 && !(xout && dq != 0.0f)) {
                gs[i] = (float *)gi; /* read where it lies, never written */
                continue;
            }
            gs[i] = sc->r[i];
            AN_FN(load_row)(gs[i], gi, C, a->dt);
            if (xout && dq != 0.0f) {
                const float *xo = AN_FN(f32_row)(xout + (size_t)i * (size_t)C * es, a->dt, sc->r[AN_STREAM_MAX_N + 3],
                                                 C);
                AN_FN(axpy)(gs[i], xo, 2.0f * dq, C, 0);
            }
        }
        AN_FN(stream_write_bwd_token)((char *)a->dy + t * C * (int64_t)es,
                                      (char *)a->out + t * (int64_t)n * C * (int64_t)es,
                                      (const char *)a->y + t * C * (int64_t)es,
                                      (const char *)a->xin + t * (int64_t)n * C * (int64_t)es, gs, hpost,
                                      a->h_res + t * n * n, a->d_post + t * n, a->d_res + t * n * n, C, n, bf16, nf,
                                      a->nt, tmp);
    }
}

/* float32 and bfloat16. bf16 gained 8 % at 8192 tokens x 4 x 1024 on two threads (19.5 against 21.2 ms fwd+bwd).
 * float32 was left to the general loop then, these passes having measured 6-8 % slower there (28.0 against 26.1
 * ms, memory-bound); but at a block's 512 tokens x 4 x 768 the general loop's 2n(n + 1) walks and row copies cost
 * 1.9 ms of one core's time where these take 1.1, and at 8192 x 4 x 1024 a shared 2-core machine showed no loss
 * (single thread 37-40 against 40-48 ms) -- the general loop keeps n other than 2 and 4 and float16 */
static int AN_FN(stream_write_bwd_fast)(const an_stream_args *a, int64_t r0, int64_t r1, const an_rows *sc) {
    if (a->op != AN_STREAM_WRITE_BWD || (a->n != 2 && a->n != 4) || (a->dt != AN_BF16 && a->dt != AN_F32))
        return 0;
    const int64_t T = r1 - r0, n = a->n;
    /* the outputs are rounded without the NaN test only when no float32 operand holds a NaN that needs it */
    const int nf = an_nan_safe(a->h_post + r0 * n, T * n) &&
                   an_nan_safe(a->h_res + r0 * n * n, T * n * n) &&
                   an_nan_safe(a->dq ? a->dq + r0 : NULL, T);
#define AN_STREAM_CASE(N, B)                                                                                       \
    if (nf) AN_FN(stream_write_bwd_fixed)(a, r0, r1, sc, N, B, 1);                                               \
    else AN_FN(stream_write_bwd_fixed)(a, r0, r1, sc, N, B, 0);
    if (a->n == 2 && a->dt == AN_F32) { AN_STREAM_CASE(2, 0) }
    else if (a->n == 2) { AN_STREAM_CASE(2, 1) }
    else if (a->dt == AN_F32) { AN_STREAM_CASE(4, 0) }
    else { AN_STREAM_CASE(4, 1) }
#undef AN_STREAM_CASE
    return 1;
}

/* 0 when the call is not one stream_fwd_fixed takes (the general loop in stream_rows takes it) */
static int AN_FN(stream_fwd_fast)(const an_stream_args *a, int64_t r0, int64_t r1, const an_rows *sc) {
    if ((a->op != AN_STREAM_READ && a->op != AN_STREAM_WRITE) || (a->n != 2 && a->n != 4) ||
        (a->dt != AN_F32 && a->dt != AN_BF16))
        return 0;
    const int64_t T = r1 - r0, n = a->n;
    /* rounding without the NaN test needs coefficients with no NaN that would need it (an_f32_to_bf16_nf) */
    const int nf = a->op == AN_STREAM_READ ? an_nan_safe(a->h_pre + r0 * n, T * n)
                                           : an_nan_safe(a->h_post + r0 * n, T * n) &&
                                                 an_nan_safe(a->h_res + r0 * n * n, T * n * n);
#define AN_STREAM_CASE(N, B)                                                                                       \
    if (nf) AN_FN(stream_fwd_fixed)(a, r0, r1, sc, N, B, 1);                                                     \
    else AN_FN(stream_fwd_fixed)(a, r0, r1, sc, N, B, 0);
    if (a->n == 2 && a->dt == AN_F32) { AN_STREAM_CASE(2, 0) }
    else if (a->n == 2) { AN_STREAM_CASE(2, 1) }
    else if (a->dt == AN_F32) { AN_STREAM_CASE(4, 0) }
    else { AN_STREAM_CASE(4, 1) }
#undef AN_STREAM_CASE
    return 1;
}

static void AN_FN(stream_rows)(const an_stream_args *a, int64_t r0, int64_t r1, const an_rows *sc) {
    if (AN_FN(stream_fwd_fast)(a, r0, r1, sc) || AN_FN(stream_write_bwd_fast)(a, r0, r1, sc)) return;
    const int64_t C = a->C;
    const int n = a->n;
    const size_t es = an_elem_size(a->dt);
    float *out = sc->r[AN_STREAM_MAX_N + 1], *tmp = sc->r[AN_STREAM_MAX_N + 2], *g = sc->r[AN_STREAM_MAX_N + 3];
    const float *xs[AN_STREAM_MAX_N];
    for (int64_t t = r0; t < r1; t++) {
        const char *xrow = (const char *)a->x + t * (int64_t)n * C * es;
        for (int i = 0; i < n; i++) xs[i] = AN_FN(f32_row)(xrow + (size_t)i * (size_t)C * es, a->dt, sc->r[i], C);
        if (a->op == AN_STREAM_READ) {
            const float *hp = a->h_pre + t * n;
            for (int i = 0; i < n; i++) AN_FN(axpy)(out, xs[i], hp[i], C, i == 0);
            AN_FN(put_row)((char *)a->out + t * C * es, out, C, a->dt, a->nt, tmp);
        } else if (a->op == AN_STREAM_READ_BWD) {
            const float *hp = a->h_pre + t * n;
            const float *dh = AN_FN(f32_row)((const char *)a->y + t * C * es, a->dt, sc->r[AN_STREAM_MAX_N], C);
            char *dx = (char *)a->out + t * (int64_t)n * C * es;
            for (int i = 0; i < n; i++) {
                a->d_pre[t * n + i] = AN_FN(dot)(dh, xs[i], C);
                AN_FN(axpy)(out, dh, hp[i], C, 1);
                AN_FN(put_row)(dx + (size_t)i * (size_t)C * es, out, C, a->dt, a->nt, tmp);
            }
        } else if (a->op == AN_STREAM_WRITE) {
            const float *hpost = a->h_post + t * n, *hres = a->h_res + t * n * n;
            const float *y = AN_FN(f32_row)((const char *)a->y + t * C * es, a->dt, sc->r[AN_STREAM_MAX_N], C);
            char *xo = (char *)a->out + t * (int64_t)n * C * es;
            float q = 0.0f;
            for (int i = 0; i < n; i++) {
                AN_FN(axpy)(out, y, hpost[i], C, 1);
                for (int j = 0; j < n; j++) AN_FN(axpy)(out, xs[j], hres[i * n + j], C, 0);
                AN_FN(round_row)(out, C, a->dt); /* the statistic of the values as stored */
                q += AN_FN(dot)(out, out, C);
                AN_FN(put_row)(xo + (size_t)i * (size_t)C * es, out, C, a->dt, a->nt, tmp);
            }
            if (a->q) a->q[t] = q;
        } else { /* AN_STREAM_WRITE_BWD: x is dX', y the branch output; xin the stream read, xout (opt.) X' */
            const float *hpost = a->h_post + t * n, *hres = a->h_res + t * n * n;
            const float *y = AN_FN(f32_row)((const char *)a->y + t * C * es, a->dt, sc->r[AN_STREAM_MAX_N], C);
            const char *xin = (const char *)a->xin + t * (int64_t)n * C * es;
            const char *xout = a->xout ? (const char *)a->xout + t * (int64_t)n * C * es : NULL;
            const float dq = a->dq ? a->dq[t] : 0.0f;
            /* g_i = dX'_i + 2 dq X'_i, in place of the converted rows xs[i] (scratch rows are ours; float32
             * rows read in place are copied first) */
            float *gs[AN_STREAM_MAX_N];
            for (int i = 0; i < n; i++) {
                gs[i] = sc->r[i];
                if (xs[i] != sc->r[i]) memcpy(gs[i], xs[i], sizeof(float) * (size_t)C);
                if (xout && dq != 0.0f) {
                    const float *xo = AN_FN(f32_row)(xout + (size_t)i * (size_t)C * es, a->dt, tmp, C);
                    AN_FN(axpy)(gs[i], xo, 2.0f * dq, C, 0);
                }
            }
            /* dy = sum_i H_post[i] g_i; dH_post[i] = <g_i, y> */
            for (int i = 0; i < n; i++) {
                a->d_post[t * n + i] = AN_FN(dot)(gs[i], y, C);
                AN_FN(axpy)(out, gs[i], hpost[i], C, i == 0);
            }
            AN_FN(put_row)((char *)a->dy + t * C * es, out, C, a->dt, a->nt, tmp);
            /* dX_j = sum_i H_res[i, j] g_i; dH_res[i, j] = <g_i, X_j> */
            char *dx = (char *)a->out + t * (int64_t)n * C * es;
            /* dX_j = sum_i H_res[i, j] g_i; dH_res[i, j] = <g_i, X_j> */
            for (int j = 0; j < n; j++) {
                const float *xj = AN_FN(f32_row)(xin + (size_t)j * (size_t)C * es, a->dt, g, C);
                for (int i = 0; i < n; i++) a->d_res[t * n * n + i * n + j] = AN_FN(dot)(gs[i], xj, C);
                for (int i = 0; i < n; i++) AN_FN(axpy)(out, gs[i], hres[i * n + j], C, i == 0);
                AN_FN(put_row)(dx + (size_t)j * (size_t)C * es, out, C, a->dt, a->nt, tmp);
            }
        }
    }
}

#undef AN_FN
#undef AN_CAT
#undef AN_CAT2
