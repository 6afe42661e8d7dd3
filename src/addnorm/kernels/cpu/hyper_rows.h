/* Row kernels of Qwen4-exp's gated read of the widened stream (per token n rows of C, K = nC values) and of the
 * write before it, each one walk over the token's rows:
 *
 *   norm        N_i = X_i rstd_i (off + w_i),  rstd_i = 1 / sqrt(mean(X_i^2) + eps)       w (n, C)
 *               backward: xh_i = X_i rstd_i,  dX_i = rstd_i (dN_i wo_i - xh_i mean(dN_i wo_i xh_i)),
 *                         dw_i += dN_i xh_i   (wo = off + w)
 *   write+norm  X'_i = X_i + H_post[i] y, stored, then N = norm(X') from the values as stored
 *               backward: g_i = dX'_i + the norm's dX'_i (in float32, never rounded between), dX_i = g_i,
 *                         dy = sum_i H_post[i] g_i,  dH_post[i] = <g_i, y>,  dw_i += dN_i xh_i
 *   gate        h = (1/n) sum_i sigmoid(U_i) N_i                                          U (n, C): logits
 *               backward: G = sigmoid(U) recomputed,  dN_i = (dh / n) G_i,
 *                         dU_i = (dh / n) N_i G_i (1 - G_i)
 *
 * Every sum in float32, each output rounded once to the storage dtype -- or, with ``products``, where eager
 * 16-bit code rounds: the write's H_post[i] y, and the gate's sigmoid(U) and each product G_i N_i, before the
 * float32 sum (the mean then divides that sum by n and rounds once, as torch's 16-bit mean does). The norm's
 * statistics are RMSNorm's as norm_rows.h forms them (its rows beyond float32's range taken in float64); the
 * backward recomputes rstd with the same function (the same bits), so nothing per row is saved. dw is summed per
 * block of AN_BLOCK tokens in float32, the blocks into the chunk's float64 partial row (the caller reduces the
 * chunks in order: the same bits on every run for a given thread count). Included per instruction set after
 * norm_rows.h, stream_rows.h (dot, axpy) and pointwise_rows.h (exp_neg).
 */

#define AN_CAT2(a, b) a##b
#define AN_CAT(a, b) AN_CAT2(a, b)
#define AN_FN(name) AN_CAT(name, AN_SFX)

/* sigmoid(u) from e = exp(-|u|) (exp_neg: branch-free, so the loops vectorize): 1 / (1 + e) for u >= 0, e / (1 + e)
 * below, where 1 - 1 / (1 + e) would lose the small gate's digits. exp_neg clamps at -87: for u < -87 the gate is
 * 1.6e-38 where the exact one is smaller. NaN stays NaN. */
static inline float AN_FN(sigmoid_v)(float u) {
    const float e = AN_FN(exp_neg)(-__builtin_fabsf(u));
    const float s = 1.0f / (1.0f + e);
    const float g = u >= 0.0f ? s : e * s;
    return u != u ? u : g;
}

/* 1 / sqrt(mean(v^2) + eps) of a float32 row, as norm_rows.h's RMSNorm forms it; forward and backward both call this */
static inline float AN_FN(hyper_rstd)(const float *v, int64_t C, float eps) {
    return an_rstd(AN_FN(sq_dev_sum)(v, 0.0f, C) / (float)C, eps);
}

/* o = v rstd (w + off) in float32, the statistics checked as norm_rows.h checks them (a row beyond float32's range
 * normalized in float64, into buf) */
static void AN_FN(hyper_norm_row)(float *o, const float *v, const float *w, float off, float eps, int64_t C,
                                  float *buf) {
    float mean = 0.0f, rstd = AN_FN(hyper_rstd)(v, C, eps), om, os;
    an_big bs;
    const an_big *big = AN_FN(checked_stats)(v, C, 1, eps, &bs, &mean, &rstd);
    const float *src = AN_FN(output_row)(buf, v, C, mean, rstd, big, &om, &os);
    AN_FN(normalize)(o, src, C, om, os, w, NULL, off);
}

/* The norm's backward of one row into g (C): rstd (dn wo - xh mean(dn wo xh)) + dres, xh = v rstd; dw += dn xh */
static void AN_FN(hyper_norm_bwd_row)(float *restrict g, const float *restrict v, const float *restrict dn,
                                      const float *restrict w, float off, float eps, const float *restrict dres,
                                      float *restrict dw, int64_t C) {
    const float rstd = AN_FN(hyper_rstd)(v, C, eps);
    if (!(rstd >= AN_TINY_RSTD) && /* beyond float32's range: in float64 (a row with an inf or NaN: below) */
        AN_FN(bwd_row_big)(v, dn, NULL, dres, w, off, NULL, 0.0f, 1, C, dw, NULL, NULL, NULL, g))
        return;
    float acc[AN_LANES];
    AN_ZERO(acc);
    int64_t k = 0;
    for (; k + AN_LANES <= C; k += AN_LANES)
        for (int j = 0; j < AN_LANES; j++) acc[j] += dn[k + j] * (w[k + j] + off) * (v[k + j] * rstd);
    for (; k < C; k++) acc[0] += dn[k] * (w[k] + off) * (v[k] * rstd);
    const float mgx = AN_FN(hsum)(acc) / (float)C;
    for (k = 0; k < C; k++) {
        const float xh = v[k] * rstd, d = dn[k];
        dw[k] += d * xh;
        g[k] = rstd * (d * (w[k] + off) - xh * mgx) + dres[k];
    }
}

/* the chunk's float32 block sums of dw (K) added into its float64 partial row, and cleared */
static void AN_FN(hyper_flush_dw)(float *restrict block, double *restrict part, int64_t K) {
    for (int64_t k = 0; k < K; k++) {
        part[k] += (double)block[k];
        block[k] = 0.0f;
    }
}

/* Scratch: rows of K floats (the caller sizes them so): r[0] X_i or X'_i, r[1] the output row, r[2] the norm's
 * float64 path, r[3] y, r[4] dN_i or U_i, r[5] dX'_i or dy's sum, r[6] the dw block sums (K), r[7] put_row's. */
static void AN_FN(hyper_rows)(const an_hyper_args *a, int64_t t0, int64_t t1, const an_rows *sc, int chunk) {
    const int n = a->n, dt = a->dt, nt = a->nt;
    const int64_t C = a->C, K = (int64_t)n * C;
    const size_t es = an_elem_size(dt), rb = (size_t)C * es;
    float *o = sc->r[1], *buf = sc->r[2], *stage = sc->r[7];
    const int bwd_w = a->op == AN_HYPER_NORM_BWD || a->op == AN_HYPER_WNORM_BWD;
    float *block = bwd_w && a->dw_part ? sc->r[6] : NULL;
    double *part = block ? a->dw_part + (size_t)chunk * (size_t)K : NULL;
    if (block) memset(block, 0, sizeof(float) * (size_t)K);
    for (int64_t t = t0; t < t1; t++) {
        const char *xt = (const char *)a->x + t * K * (int64_t)es;
        if (a->op == AN_HYPER_NORM || a->op == AN_HYPER_WNORM) {
            const float *y = NULL;
            if (a->op == AN_HYPER_WNORM) y = AN_FN(f32_row)((const char *)a->y + t * C * (int64_t)es, dt, sc->r[3], C);
            for (int i = 0; i < n; i++) {
                const float *xi = AN_FN(f32_row)(xt + (size_t)i * rb, dt, sc->r[0], C);
                if (y) { /* X'_i = X_i + H_post[i] y (two loops: the product rounded between, as eager's) */
                    float *v = sc->r[5];
                    AN_FN(axpy)(v, y, a->h_post[t * n + i], C, 1);
                    if (a->products) AN_FN(round_row)(v, C, dt);
                    for (int64_t k = 0; k < C; k++) v[k] += xi[k];
                    AN_FN(round_row)(v, C, dt); /* the norm reads X' as stored */
                    AN_FN(put_row)((char *)a->x2 + t * K * (int64_t)es + (size_t)i * rb, v, C, dt, nt, stage);
                    xi = v;
                }
                char *dst = (char *)a->out + t * K * (int64_t)es + (size_t)i * rb;
                const int direct = dt == AN_F32 && !nt;
                AN_FN(hyper_norm_row)(direct ? (float *)dst : o, xi, a->w + (size_t)i * (size_t)C, a->off, a->eps, C,
                                      buf);
                if (!direct) AN_FN(put_row)(dst, o, C, dt, nt, stage);
            }
        } else if (bwd_w) {
            const float *y = NULL;
            float *dysum = sc->r[5];
            if (a->op == AN_HYPER_WNORM_BWD) y = AN_FN(f32_row)((const char *)a->y + t * C * (int64_t)es, dt, sc->r[3], C);
            for (int i = 0; i < n; i++) {
                const size_t off_i = (size_t)t * (size_t)K * es + (size_t)i * rb;
                const float *v = AN_FN(f32_row)(xt + (size_t)i * rb, dt, sc->r[0], C);
                const float *dn = AN_FN(f32_row)((const char *)a->dout + off_i, dt, sc->r[4], C);
                const float *dres = a->dx2 ? AN_FN(f32_row)((const char *)a->dx2 + off_i, dt, buf, C) : AN_ZEROS(sc);
                float *dwi = block ? block + (size_t)i * (size_t)C : sc->r[8];
                AN_FN(hyper_norm_bwd_row)(o, v, dn, a->w + (size_t)i * (size_t)C, a->off, a->eps, dres, dwi, C);
                AN_FN(put_row)((char *)a->out + off_i, o, C, dt, nt, stage);
                if (y) { /* the write's backward from g_i = o: dH_post[i] = <g_i, y>, dy += H_post[i] g_i */
                    a->d_post[t * n + i] = AN_FN(dot)(o, y, C);
                    AN_FN(axpy)(dysum, o, a->h_post[t * n + i], C, i == 0);
                }
            }
            if (y) AN_FN(put_row)((char *)a->dy + t * C * (int64_t)es, dysum, C, dt, nt, stage);
            if (block && (t - t0 + 1) % AN_BLOCK == 0) AN_FN(hyper_flush_dw)(block, part, K);
        } else { /* the gate: x holds N, u the logits U */
            const char *ut = (const char *)a->u + t * K * (int64_t)es;
            if (a->op == AN_HYPER_GATE) {
                float *h = o, *gp = sc->r[5];
                for (int i = 0; i < n; i++) {
                    const float *u = AN_FN(f32_row)(ut + (size_t)i * rb, dt, sc->r[4], C);
                    const float *xi = AN_FN(f32_row)(xt + (size_t)i * rb, dt, sc->r[0], C);
                    if (a->products) { /* sigmoid(U) and G N each rounded to the storage dtype, as eager's */
                        for (int64_t k = 0; k < C; k++) gp[k] = AN_FN(sigmoid_v)(u[k]);
                        AN_FN(round_row)(gp, C, dt);
                        for (int64_t k = 0; k < C; k++) gp[k] *= xi[k];
                        AN_FN(round_row)(gp, C, dt);
                    } else {
                        for (int64_t k = 0; k < C; k++) gp[k] = AN_FN(sigmoid_v)(u[k]) * xi[k];
                    }
                    if (i == 0) memcpy(h, gp, sizeof(float) * (size_t)C);
                    else for (int64_t k = 0; k < C; k++) h[k] += gp[k];
                }
                for (int64_t k = 0; k < C; k++) h[k] /= (float)n; /* a division, as torch's mean: sum / n */
                AN_FN(put_row)((char *)a->out + t * C * (int64_t)es, h, C, dt, nt, stage);
            } else {
                const float *dh = AN_FN(f32_row)((const char *)a->dout + t * C * (int64_t)es, dt, sc->r[3], C);
                float *c = sc->r[5], *g = sc->r[8];
                for (int64_t k = 0; k < C; k++) c[k] = dh[k] / (float)n; /* the mean's backward: dh / n */
                for (int i = 0; i < n; i++) {
                    const size_t off_i = (size_t)t * (size_t)K * es + (size_t)i * rb;
                    const float *u = AN_FN(f32_row)(ut + (size_t)i * rb, dt, sc->r[4], C);
                    const float *xi = AN_FN(f32_row)(xt + (size_t)i * rb, dt, sc->r[0], C);
                    for (int64_t k = 0; k < C; k++) g[k] = AN_FN(sigmoid_v)(u[k]);
                    if (a->products) AN_FN(round_row)(g, C, dt); /* the gate the forward multiplied by */
                    for (int64_t k = 0; k < C; k++) o[k] = c[k] * g[k];
                    AN_FN(put_row)((char *)a->out + off_i, o, C, dt, nt, stage);  /* dN_i */
                    for (int64_t k = 0; k < C; k++) o[k] = c[k] * xi[k] * (g[k] * (1.0f - g[k]));
                    AN_FN(put_row)((char *)a->du + off_i, o, C, dt, nt, stage);   /* dU_i */
                }
            }
        }
    }
    if (block && (t1 - t0) % AN_BLOCK) AN_FN(hyper_flush_dw)(block, part, K);
}

#undef AN_FN
#undef AN_CAT
#undef AN_CAT2
