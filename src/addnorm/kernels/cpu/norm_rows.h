/* Row kernels of fused residual-add + LayerNorm / RMSNorm, forward and backward.
 *
 * Included twice by addnorm_cpu.c: once compiled for AVX2+FMA+F16C, once for baseline x86-64 /
 * any other CPU, each copy suffixed by AN_SFX; the host picks one at load time. The code is
 * written so that gcc vectorizes it (float loops, associative math enabled for this file only):
 * every row is converted once into a float32 scratch row that stays in L1/L2, so memory traffic is
 * the minimum: forward reads x (+ residual) and writes out (+ the new residual); backward reads dy,
 * the saved sum (+ the incoming residual gradient) and writes dx.
 */

#define AN_CAT2(a, b) a##b
#define AN_CAT(a, b) AN_CAT2(a, b)
#define AN_FN(name) AN_CAT(name, AN_SFX)

static void AN_FN(load_row)(float *restrict dst, const void *restrict src, int64_t n, int dt) {
    if (dt == AN_F32) {
        const float *s = (const float *)src;
        for (int64_t i = 0; i < n; i++) dst[i] = s[i];
    } else if (dt == AN_BF16) {
        const uint16_t *s = (const uint16_t *)src;
        for (int64_t i = 0; i < n; i++) dst[i] = an_bf16_to_f32(s[i]);
    } else {
        const _Float16 *s = (const _Float16 *)src;
        for (int64_t i = 0; i < n; i++) dst[i] = (float)s[i];
    }
}

static void AN_FN(store_row)(void *restrict dst, const float *restrict src, int64_t n, int dt) {
    if (dt == AN_F32) {
        float *d = (float *)dst;
        for (int64_t i = 0; i < n; i++) d[i] = src[i];
    } else if (dt == AN_BF16) {
        uint16_t *d = (uint16_t *)dst;
        for (int64_t i = 0; i < n; i++) d[i] = an_f32_to_bf16(src[i]);
    } else {
        _Float16 *d = (_Float16 *)dst;
        for (int64_t i = 0; i < n; i++) d[i] = (_Float16)src[i];
    }
}

/* Round a float row to the storage dtype and back, in place (no-op for float32). */
static void AN_FN(round_row)(float *restrict v, int64_t n, int dt) {
    if (dt == AN_BF16) {
        for (int64_t i = 0; i < n; i++) v[i] = an_bf16_to_f32(an_f32_to_bf16(v[i]));
    } else if (dt == AN_F16) {
        for (int64_t i = 0; i < n; i++) v[i] = (float)(_Float16)v[i];
    }
}

static void AN_FN(fwd_rows)(const an_fwd_args *a, int64_t r0, int64_t r1, float *restrict buf, float *restrict tmp) {
    const int64_t D = a->D;
    const size_t es = an_elem_size(a->dtype);
    const float inv_d = 1.0f / (float)D;
    for (int64_t r = r0; r < r1; r++) {
        AN_FN(load_row)(buf, (const char *)a->x + r * a->x_rs * es, D, a->dtype);
        if (a->res) {
            AN_FN(load_row)(tmp, (const char *)a->res + r * a->res_rs * es, D, a->dtype);
            for (int64_t i = 0; i < D; i++) buf[i] += tmp[i];
            /* the new residual stream is stored in the input dtype; normalize exactly what is stored */
            AN_FN(round_row)(buf, D, a->dtype);
        }
        if (a->res_out) AN_FN(store_row)((char *)a->res_out + r * a->res_out_rs * es, buf, D, a->dtype);

        float mean = 0.0f;
        if (a->kind == AN_LAYER) {
            float s = 0.0f;
            for (int64_t i = 0; i < D; i++) s += buf[i];
            mean = s * inv_d;
        }
        float ss = 0.0f; /* two-pass: sum of squared deviations, no E[x²]−E[x]² cancellation */
        for (int64_t i = 0; i < D; i++) {
            float d = buf[i] - mean;
            ss += d * d;
        }
        float rstd = 1.0f / sqrtf(ss * inv_d + a->eps);
        if (a->mean) a->mean[r] = mean;
        if (a->rstd) a->rstd[r] = rstd;

        const float *w = a->weight, *b = a->bias;
        const float off = a->weight_offset;
        if (a->cast_before_weight && a->dtype != AN_F32) {
            /* Llama order: xhat cast to the input dtype first, then multiplied by the weight */
            for (int64_t i = 0; i < D; i++) tmp[i] = (buf[i] - mean) * rstd;
            AN_FN(round_row)(tmp, D, a->dtype);
            if (w) for (int64_t i = 0; i < D; i++) tmp[i] *= (w[i] + off);
            if (b) for (int64_t i = 0; i < D; i++) tmp[i] += b[i];
        } else if (w && b) {
            for (int64_t i = 0; i < D; i++) tmp[i] = (buf[i] - mean) * rstd * (w[i] + off) + b[i];
        } else if (w) {
            for (int64_t i = 0; i < D; i++) tmp[i] = (buf[i] - mean) * rstd * (w[i] + off);
        } else if (b) {
            for (int64_t i = 0; i < D; i++) tmp[i] = (buf[i] - mean) * rstd + b[i];
        } else {
            for (int64_t i = 0; i < D; i++) tmp[i] = (buf[i] - mean) * rstd;
        }
        AN_FN(store_row)((char *)a->out + r * a->out_rs * es, tmp, D, a->dtype);
    }
}

/* dw_acc / db_acc: this thread's float32 partial sums over its rows (D each, zeroed by caller). */
static void AN_FN(bwd_rows)(const an_bwd_args *a, int64_t r0, int64_t r1, float *restrict xs, float *restrict dy,
                            float *restrict dw_acc, float *restrict db_acc) {
    const int64_t D = a->D;
    const size_t es = an_elem_size(a->dtype);
    const float inv_d = 1.0f / (float)D;
    const float *w = a->weight;
    const float off = a->weight_offset;
    for (int64_t r = r0; r < r1; r++) {
        AN_FN(load_row)(xs, (const char *)a->s + r * a->s_rs * es, D, a->dtype);
        AN_FN(load_row)(dy, (const char *)a->dy + r * a->dy_rs * es, D, a->dtype);
        const float mean = a->mean ? a->mean[r] : 0.0f, rstd = a->rstd[r];
        /* xs becomes xhat, recomputed from the saved sum; accumulate parameter grads on the way */
        float sum_g = 0.0f, sum_gx = 0.0f;
        for (int64_t i = 0; i < D; i++) {
            float xh = (xs[i] - mean) * rstd;
            xs[i] = xh;
            float g = w ? dy[i] * (w[i] + off) : dy[i];
            sum_g += g;
            sum_gx += g * xh;
        }
        if (dw_acc) for (int64_t i = 0; i < D; i++) dw_acc[i] += dy[i] * xs[i];
        if (db_acc) for (int64_t i = 0; i < D; i++) db_acc[i] += dy[i];
        const float mg = (a->kind == AN_LAYER) ? sum_g * inv_d : 0.0f, mgx = sum_gx * inv_d;
        if (w) {
            for (int64_t i = 0; i < D; i++) dy[i] = rstd * (dy[i] * (w[i] + off) - mg - xs[i] * mgx);
        } else {
            for (int64_t i = 0; i < D; i++) dy[i] = rstd * (dy[i] - mg - xs[i] * mgx);
        }
        if (a->dres) {
            /* the gradient that arrived through the new residual stream joins here, in float32 */
            AN_FN(load_row)(xs, (const char *)a->dres + r * a->dres_rs * es, D, a->dtype);
            for (int64_t i = 0; i < D; i++) dy[i] += xs[i];
        }
        AN_FN(store_row)((char *)a->dx + r * a->dx_rs * es, dy, D, a->dtype);
    }
}

#undef AN_FN
#undef AN_CAT
#undef AN_CAT2
