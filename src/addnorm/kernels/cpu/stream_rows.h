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
    float acc[AN_LANES] = {0};
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

static void AN_FN(stream_rows)(const an_stream_args *a, int64_t r0, int64_t r1, const an_rows *sc) {
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
