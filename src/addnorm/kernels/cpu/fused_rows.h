/* Row kernels of the fused forms beyond Add & Norm: norm-then-add and the parallel residual.
 *
 * Included per instruction set after norm_rows.h (whose row helpers it uses), suffixed by AN_SFX.
 *
 *   forward   t = a + m                          rounded to adt (the dtype eager `a + m` has)
 *             s = x + t                          rounded to sdt (the stream's dtype)
 *             y  = Norm(s; w1, b1)               stored in odt, or, with `post`:
 *             y  = post + round_ndt(Norm(s))     norm-then-add: the norm's output rounded to its own dtype
 *                                                (as eager stores it) before the add, rounded once to odt
 *             y2 = Norm(s; w2, b2)               a second normalized output, same statistics
 *   backward  g  = dy * (w1 + off) + dy2 * (w2 + off)
 *             ds = rstd * (g - mean(g) - xhat * mean(g * xhat)) + dres      (RMSNorm: no mean(g))
 *             dw1 += dy * xhat, db1 += dy, dw2 += dy2 * xhat, db2 += dy2
 *
 * Norm-then-add's backward is the plain norm's (the residual's gradient is dy itself); the parallel
 * residual's is one gradient for x, a and m alike. Each row is converted once into float32 scratch rows
 * (L1-resident), so one loop serves every dtype; memory traffic is still one read of each input and one
 * write of each output.
 */

#define AN_CAT2(a, b) a##b
#define AN_CAT(a, b) AN_CAT2(a, b)
#define AN_FN(name) AN_CAT(name, AN_SFX)

/* A row as float32: float32 storage read where it lies, anything else converted into `scratch`. */
static inline const float *AN_FN(f32_row)(const void *row, int dt, float *scratch, int64_t n) {
    if (dt == AN_F32) return (const float *)row;
    AN_FN(load_row)(scratch, row, n, dt);
    return scratch;
}

/* dst = (src - mean) * rstd * (w + off) + b [+ post]: one loop, w / b rows of ones / zeros when absent */
static void AN_FN(norm_post)(float *restrict dst, const float *restrict src, int64_t n, float mean, float rstd,
                             const float *restrict w, const float *restrict b, float off,
                             const float *restrict post) {
    if (post) for (int64_t i = 0; i < n; i++) dst[i] = post[i] + ((src[i] - mean) * rstd * (w[i] + off) + b[i]);
    else for (int64_t i = 0; i < n; i++) dst[i] = (src[i] - mean) * rstd * (w[i] + off) + b[i];
}

/* Row r of the inputs (x, a, m, post; each of its own dtype) into L1: one interleaved prefetch_next when their
 * element sizes agree (every float32 or bfloat16 call), else one per input. */
static inline void AN_FN(prefetch_next_any)(const an_ffwd_args *a, int64_t r) {
    const void *p[4] = {a->x, a->a, a->m, a->post};
    const int64_t rs[4] = {a->x_rs, a->a_rs, a->m_rs, a->post_rs};
    const int dt[4] = {a->xdt, a->adt, a->mdt, a->pdt};
    size_t es[4];
    int same = 1;
    for (int k = 0; k < 4; k++) {
        es[k] = an_elem_size(dt[k]);
        if (p[k]) p[k] = (const char *)p[k] + r * rs[k] * (int64_t)es[k];
        same &= !p[k] || es[k] == es[0];
    }
    if (same) {
        AN_FN(prefetch_next)(p[0], p[1], p[2], p[3], (size_t)a->D * es[0]);
        return;
    }
    for (int k = 0; k < 4; k++)
        if (p[k]) AN_FN(prefetch_next)(p[k], NULL, NULL, NULL, (size_t)a->D * es[k]);
}

/* [c0, c1) of row r of every input (x, a, m, post), each in its own element size: the next row, a chunk at a time
 * while the current row's chunks are written */
static inline void AN_FN(prefetch_chunk_any)(const an_ffwd_args *a, int64_t r, int64_t c0, int64_t c1) {
    const void *p[4] = {a->x, a->a, a->m, a->post};
    const int64_t rs[4] = {a->x_rs, a->a_rs, a->m_rs, a->post_rs};
    const int dt[4] = {a->xdt, a->adt, a->mdt, a->pdt};
    for (int k = 0; k < 4; k++) {
        if (!p[k]) continue;
        const size_t es = an_elem_size(dt[k]);
        AN_FN(prefetch_next)((const char *)p[k] + (r * rs[k] + c0) * (int64_t)es, NULL, NULL, NULL,
                             (size_t)(c1 - c0) * es);
    }
}

static void AN_FN(fused_fwd_rows_any)(const an_ffwd_args *a, int64_t r0, int64_t r1, const an_rows *sc) {
    const int64_t D = a->D;
    const float inv_d = 1.0f / (float)D;
    /* no restrict: a row read in place or converted into scratch may be the row written (same index only) */
    float *buf = sc->r[0], *tmp = sc->r[1], *tmp2 = sc->r[2], *out = sc->r[3], *pbuf = sc->r[4];
    const size_t xes = an_elem_size(a->xdt), aes = an_elem_size(a->adt), mes = an_elem_size(a->mdt),
                 pes = an_elem_size(a->pdt), oes = an_elem_size(a->odt), ses = an_elem_size(a->sdt);
    for (int64_t r = r0; r < r1; r++) {
        const float *src = AN_FN(f32_row)((const char *)a->x + r * a->x_rs * xes, a->xdt, buf, D);
        if (a->a) {
            const float *av = AN_FN(f32_row)((const char *)a->a + r * a->a_rs * aes, a->adt, tmp, D);
            if (a->m) {
                const float *mv = AN_FN(f32_row)((const char *)a->m + r * a->m_rs * mes, a->mdt, tmp2, D);
                /* two loops, never one: built with -fassociative-math, gcc may regroup x + (a + m) inside one
                 * loop, and eager's bits depend on the grouping (a + m is stored first) */
                for (int64_t i = 0; i < D; i++) tmp[i] = av[i] + mv[i];
                AN_FN(round_row)(tmp, D, a->amdt);
                for (int64_t i = 0; i < D; i++) buf[i] = src[i] + tmp[i];
            } else {
                for (int64_t i = 0; i < D; i++) buf[i] = src[i] + av[i];
            }
            AN_FN(round_row)(buf, D, a->sdt);
            src = buf;
        }
        if (a->s_out) AN_FN(put_row)((char *)a->s_out + r * a->s_rs * ses, src, D, a->sdt, a->nt, tmp);
        float mean = 0.0f;
        float rstd = an_rstd(a->kind == AN_LAYER ? AN_FN(layer_moments)(src, D, AN_FN(row_sum)(src, D), &mean)
                                                   / (float)D
                                                 : AN_FN(sq_dev_sum)(src, 0.0f, D) * inv_d, a->eps);
        an_big bs; /* a row beyond float32's range: float64 statistics (see checked_stats) */
        const an_big *big = AN_FN(checked_stats)(src, D, a->kind == AN_RMS, a->eps, &bs, &mean, &rstd);
        if (a->mean) a->mean[r] = mean;
        if (a->rstd) a->rstd[r] = rstd;
        float om, os; /* the outputs' statistics (see output_row) */
        src = AN_FN(output_row)(buf, src, D, mean, rstd, big, &om, &os);
        /* the next row, while this one is written: a chunk before each chunk written where the outputs are written
         * chunk by chunk (below), else whole, here (see prefetch_next). Chunked, the float32 norm-then-add forward took
         * 0.70-0.78 of the whole-row burst's time on the AMD EPYC (8192 x 1024, benchmarks/results/prefetch_ab; the
         * Intel Xeon, caches flushed, had gained from the burst) */
        const int more = r + 1 < r1, whole = a->cast_before_weight || (a->post && a->ndt != AN_F32);
        if (more && whole) AN_FN(prefetch_next_any)(a, r + 1);
        for (int k = 0; k < 2; k++) {
            void *dst = k == 0 ? a->y : a->y2;
            if (!dst) continue;
            char *dst_row = (char *)dst + r * (k == 0 ? a->y_rs : a->y2_rs) * oes;
            const float *w = k == 0 ? a->w1 : a->w2, *b = k == 0 ? a->b1 : a->b2;
            const float off = w ? a->weight_offset : 0.0f;
            const float *post = (k == 0 && a->post)
                ? AN_FN(f32_row)((const char *)a->post + r * a->post_rs * pes, a->pdt, pbuf, D) : NULL;
            /* float32 output, not streamed: written in place in the same loop */
            float *o = (a->odt == AN_F32 && !a->nt) ? (float *)dst_row : out;
            if (a->cast_before_weight || (post && a->ndt != AN_F32)) {
                /* the norm's output rounded to its dtype where eager code stores it: before the weight (Llama's
                 * order), and before the add of norm-then-add */
                if (a->cast_before_weight) {
                    AN_FN(normalize)(out, src, D, om, os, NULL, NULL, 0.0f);
                    AN_FN(round_row)(out, D, a->ndt);
                    AN_FN(normalize)(out, out, D, 0.0f, 1.0f, w, b, a->weight_offset); /* in place: not restrict */
                } else {
                    AN_FN(norm_post)(out, src, D, om, os, w ? w : AN_ONES(sc), b ? b : AN_ZEROS(sc), off, NULL);
                }
                if (post) {
                    AN_FN(round_row)(out, D, a->ndt);
                    for (int64_t i = 0; i < D; i++) out[i] += post[i];
                }
                if (o != out) memcpy(o, out, sizeof(float) * (size_t)D);
            } else {
                const float *wr = w ? w : AN_ONES(sc), *br = b ? b : AN_ZEROS(sc);
                for (int64_t c0 = 0; c0 < D; c0 += AN_CHUNK) {
                    const int64_t c1 = c0 + AN_CHUNK < D ? c0 + AN_CHUNK : D;
                    if (k == 0 && more) AN_FN(prefetch_chunk_any)(a, r + 1, c0, c1);
                    AN_FN(norm_post)(o + c0, src + c0, c1 - c0, om, os, wr + c0, br + c0, off, post ? post + c0 : NULL);
                }
            }
            if (o == out) AN_FN(put_row)(dst_row, out, D, a->odt, a->nt, tmp);
        }
    }
}

/* ---- bfloat16 throughout: the conversions fused into three passes per row, as Add & Norm's bf16 loop ----
 * The generic loop converts every row into float32 scratch and walks it ~10 times; at two bytes an element
 * that arithmetic, not the memory bus, set the speed. */
static inline __attribute__((always_inline)) void AN_FN(fused_fwd_rows_bf16_body)(const an_ffwd_args *a,
                                                                                   int64_t r0, int64_t r1,
                                                                                   const an_rows *sc, const int nf,
                                                                                   const int rms) {
    const int64_t D = a->D;
    const float inv_d = 1.0f / (float)D;
    float *restrict buf = sc->r[0];
    uint16_t *restrict s16 = (uint16_t *)sc->r[1], *restrict o16 = (uint16_t *)sc->r[2];
    /* AVX2: the first pass's row and each output's weights in the loops' order (bf16_perm_n) */
    const int64_t pn = AN_FN(bf16_perm_n)(D, nf);
    an_bf16_perm pm[2] = {{NULL, NULL, 0}, {NULL, NULL, 0}};
    for (int k = 0; k < 2 && pn; k++) {
        if (!(k == 0 ? a->y : a->y2)) continue;
        const float *w = k == 0 ? a->w1 : a->w2, *b = k == 0 ? a->b1 : a->b2;
        pm[k] = AN_FN(bf16_perm_prep)(sc->r[3 + 2 * k], sc->r[4 + 2 * k], w ? w : AN_ONES(sc), b ? b : AN_ZEROS(sc),
                                      w ? a->weight_offset : 0.0f, pn);
    }
    for (int64_t r = r0; r < r1; r++) {
        const uint16_t *restrict x = (const uint16_t *)a->x + r * a->x_rs;
        const uint16_t *av = a->a ? (const uint16_t *)a->a + r * a->a_rs : NULL;
        const uint16_t *mv = a->m ? (const uint16_t *)a->m + r * a->m_rs : NULL;
        uint16_t *s_row = a->s_out ? (uint16_t *)a->s_out + r * a->s_rs : NULL;
        const int s_direct = s_row && AN_FN(stream_direct)(s_row, a->nt); /* streamed in the first pass */
        uint16_t *restrict so = (s_row && (!a->nt || s_direct)) ? s_row : s16;
        float acc[AN_LANES];
        AN_ZERO(acc);
        double t1[AN_LANES], t2[AN_LANES]; /* LayerNorm's sums of v and v^2 (bf16_first_pass) */
        AN_ZERO(t1); AN_ZERO(t2);
        /* the stream, rounded as eager stores it: t = round(a + m), s = round(x + t) */
        AN_FN(bf16_first_pass_vec)(buf, so, x, av, av ? mv : NULL, D, rms, acc, t1, t2, s_direct, pn != 0);
        if (s_row && a->nt && !s_direct) AN_FN(stream_bytes)(s_row, s16, (size_t)D * 2);
        float mean = 0.0f;
        /* RMSNorm: the sum of squares in one float32 chain per lane, as Add & Norm's (fwd_rows_bf16_body);
         * LayerNorm: the first pass's sums in blocks (layer_moments_1p) */
        float rstd = an_rstd(rms ? AN_FN(hsum)(acc) * inv_d : AN_FN(layer_moments_1p)(buf, D, t1, t2, &mean, pn) / (float)D,
                             a->eps);
        an_big bs; /* a row beyond float32's range: float64 statistics (see checked_stats) */
        const an_big *big = AN_FN(checked_stats_p)(buf, D, rms, a->eps, &bs, &mean, &rstd, pn);
        if (a->mean) a->mean[r] = mean;
        if (a->rstd) a->rstd[r] = rstd;
        float om, os; /* the outputs' statistics (see output_row) */
        AN_FN(output_row)(buf, buf, D, mean, rstd, big, &om, &os);
        const int more = r + 1 < r1;
        /* the parallel forms: the next row whole, while this one is written (prefetch_next); norm-then-add: a chunk
         * before each chunk written, below. On the AMD EPYC (prefetch_ab/burst_vs_chunked) chunked norm-then-add took
         * 0.84-0.88 of the burst's time on AVX-512 and 1.05-1.06 on AVX2, within that run's spread (unchanged code
         * read 0.87-1.06); the parallel forms stay whole: chunked, one earlier comparison had them up to 19 % slower */
        if (more && !a->post) AN_FN(prefetch_next_any)(a, r + 1);
        for (int k = 0; k < 2; k++) {
            void *dst = k == 0 ? a->y : a->y2;
            if (!dst) continue;
            uint16_t *dst_row = (uint16_t *)dst + r * (k == 0 ? a->y_rs : a->y2_rs);
            const uint16_t *restrict p = (k == 0 && a->post) ? (const uint16_t *)a->post + r * a->post_rs : NULL;
            /* the vector output loop (its post form: nf only), streamed straight into the row where it is aligned */
            const int vec = AN_FN(bf16_vec_out)(nf) && (nf || !p);
            const int direct = vec && AN_FN(stream_direct)(dst_row, a->nt);
            uint16_t *restrict d = (a->nt && !direct) ? o16 : dst_row;
            const float *restrict w = (k == 0 ? a->w1 : a->w2), *restrict b = (k == 0 ? a->b1 : a->b2);
            const float off = w ? a->weight_offset : 0.0f;
            w = w ? w : AN_ONES(sc);
            b = b ? b : AN_ZEROS(sc);
            if (vec) {
                for (int64_t c0 = 0; c0 < D; c0 += AN_CHUNK) {
                    const int64_t c1 = c0 + AN_CHUNK < D ? c0 + AN_CHUNK : D;
                    if (p && more) AN_FN(prefetch_chunk_any)(a, r + 1, c0, c1);
                    const an_bf16_perm pc = AN_FN(perm_at)(&pm[k], c0, c1 - c0);
                    AN_FN(bf16_out_vec)(d + c0, buf + c0, c1 - c0, om, os, w + c0, b + c0, off, p ? p + c0 : NULL, nf,
                                        &pc, direct);
                }
            } else if (p) { /* norm-then-add: the norm rounded to bf16, then the add, rounded once */
                for (int64_t c0 = 0; c0 < D; c0 += AN_CHUNK) {
                    const int64_t c1 = c0 + AN_CHUNK < D ? c0 + AN_CHUNK : D;
                    if (more) AN_FN(prefetch_chunk_any)(a, r + 1, c0, c1);
                    AN_FN(bf16_out_scalar)(d, buf, c0, c1, om, os, w, b, off, p, nf);
                }
            } else {
                AN_FN(bf16_out_scalar)(d, buf, 0, D, om, os, w, b, off, NULL, nf);
            }
            if (a->nt && !direct) AN_FN(stream_bytes)(dst_row, o16, (size_t)D * 2);
        }
    }
}

/* the stream's sums rounded without the NaN test always (bfloat16 operands: see an_f32_to_bf16_nf); the
 * outputs too when the float32 operands (weights, biases, weight_offset, eps) hold no NaN that would need it */
static void AN_FN(fused_fwd_rows_bf16)(const an_ffwd_args *a, int64_t r0, int64_t r1, const an_rows *sc) {
    const int64_t D = a->D;
    const int nf = an_nan_safe(a->w1, D) && an_nan_safe(a->b1, D) && an_nan_safe(a->w2, D) &&
                   an_nan_safe(a->b2, D) && an_scalar_nan_safe(a->weight_offset) && an_scalar_nan_safe(a->eps);
    if (a->kind == AN_LAYER) {
        if (nf) AN_FN(fused_fwd_rows_bf16_body)(a, r0, r1, sc, 1, 0);
        else AN_FN(fused_fwd_rows_bf16_body)(a, r0, r1, sc, 0, 0);
    } else {
        if (nf) AN_FN(fused_fwd_rows_bf16_body)(a, r0, r1, sc, 1, 1);
        else AN_FN(fused_fwd_rows_bf16_body)(a, r0, r1, sc, 0, 1);
    }
}

static void AN_FN(fused_fwd_rows)(const an_ffwd_args *a, int64_t r0, int64_t r1, const an_rows *sc) {
    if (a->uniform_bf16 && !a->cast_before_weight) {
        AN_FN(fused_fwd_rows_bf16)(a, r0, r1, sc);
        return;
    }
    AN_FN(fused_fwd_rows_any)(a, r0, r1, sc);
}

/* acc[i] += d[i] * ((s[i] - mean) * rstd), or += d[i] when s is NULL */
static void AN_FN(accumulate)(float *restrict acc, const float *restrict d, const float *restrict s, float mean,
                              float rstd, int64_t n) {
    if (s) for (int64_t i = 0; i < n; i++) acc[i] += d[i] * ((s[i] - mean) * rstd);
    else for (int64_t i = 0; i < n; i++) acc[i] += d[i];
}

/* acc[4] (dw1, db1, dw2, db2): this block's float32 sums, each NULL when not wanted */
static void AN_FN(fused_bwd_block)(const an_fbwd_args *a, int64_t r0, int64_t r1, const an_rows *sc, float **acc) {
    const int64_t D = a->D;
    const float inv_d = 1.0f / (float)D;
    float *restrict g = sc->r[3], *restrict t = sc->r[4];
    const float *w1 = a->w1 ? a->w1 : AN_ONES(sc), *w2 = a->w2 ? a->w2 : AN_ONES(sc);
    const float off1 = a->w1 ? a->weight_offset : 0.0f, off2 = a->w2 ? a->weight_offset : 0.0f;
    const size_t ses = an_elem_size(a->sdt), dyes = an_elem_size(a->dydt), dy2es = an_elem_size(a->dy2dt),
                 dres_es = an_elem_size(a->dresdt), oes = an_elem_size(a->odt);
    for (int64_t r = r0; r < r1; r++) {
        /* float32 rows read where they lie, others converted into scratch rows 0..2, 5 */
        const float *s = AN_FN(f32_row)((const char *)a->s + r * a->s_rs * ses, a->sdt, sc->r[0], D);
        const float *dy = a->dy ? AN_FN(f32_row)((const char *)a->dy + r * a->dy_rs * dyes, a->dydt, sc->r[1], D)
                                : NULL;
        const float *dy2 = a->dy2 ? AN_FN(f32_row)((const char *)a->dy2 + r * a->dy2_rs * dy2es, a->dy2dt, sc->r[2], D)
                                  : NULL;
        const float *dres = a->dres ? AN_FN(f32_row)((const char *)a->dres + r * a->dres_rs * dres_es, a->dresdt,
                                                     sc->r[5], D) : AN_ZEROS(sc);
        const float mean = a->mean ? a->mean[r] : 0.0f, rstd = a->rstd[r];
        char *ds_row = (char *)a->ds + r * a->ds_rs * oes;
        if (!(rstd >= AN_TINY_RSTD) && /* beyond float32's range: in float64 (see bwd_row_big), into g */
            AN_FN(bwd_row_big)(s, dy, dy2, a->dres ? dres : NULL, w1, off1, w2, off2, a->kind == AN_RMS, D, acc[0],
                               acc[1], acc[2], acc[3], g)) {
            AN_FN(put_row)(ds_row, g, D, a->odt, a->nt, t);
            continue;
        }
        if (dy && dy2) for (int64_t i = 0; i < D; i++) g[i] = dy[i] * (w1[i] + off1) + dy2[i] * (w2[i] + off2);
        else if (dy) for (int64_t i = 0; i < D; i++) g[i] = dy[i] * (w1[i] + off1);
        else for (int64_t i = 0; i < D; i++) g[i] = dy2[i] * (w2[i] + off2);
        float acc_g[AN_LANES], acc_gx[AN_LANES];
        AN_ZERO(acc_g); AN_ZERO(acc_gx);
        int64_t i = 0;
        for (; i + AN_LANES <= D; i += AN_LANES)
            for (int j = 0; j < AN_LANES; j++) {
                acc_g[j] += g[i + j];
                acc_gx[j] += g[i + j] * ((s[i + j] - mean) * rstd);
            }
        for (; i < D; i++) {
            acc_g[0] += g[i];
            acc_gx[0] += g[i] * ((s[i] - mean) * rstd);
        }
        const float mg = a->kind == AN_LAYER ? AN_FN(hsum)(acc_g) * inv_d : 0.0f;
        const float mgx = AN_FN(hsum)(acc_gx) * inv_d;
        /* float32, not streamed: ds written in place in the same loop */
        float *o = (a->odt == AN_F32 && !a->nt) ? (float *)ds_row : g;
        for (i = 0; i < D; i++) o[i] = rstd * (g[i] - mg - (s[i] - mean) * rstd * mgx) + dres[i];
        if (o == g) AN_FN(put_row)(ds_row, g, D, a->odt, a->nt, t);
        if (dy && acc[0]) AN_FN(accumulate)(acc[0], dy, s, mean, rstd, D);
        if (dy && acc[1]) AN_FN(accumulate)(acc[1], dy, NULL, 0.0f, 0.0f, D);
        if (dy2 && acc[2]) AN_FN(accumulate)(acc[2], dy2, s, mean, rstd, D);
        if (dy2 && acc[3]) AN_FN(accumulate)(acc[3], dy2, NULL, 0.0f, 0.0f, D);
    }
}

/* The bfloat16 fused backward's second pass, one value at a time over [i, D): ds = rstd (g - mean(g) - xhat
 * mean(g xhat)) + dres rounded to bfloat16, dw1 += dy xhat, db1 += dy (wantb), and with t2 (a second output)
 * dw2 += dy2 xhat, db2 += dy2 (wantb). The portable loop and the vector loops' tails. */
static inline __attribute__((always_inline)) void AN_FN(fused_bwd_out_scalar)(
    uint16_t *restrict d, const float *restrict g, const uint16_t *restrict s, const uint16_t *restrict dy,
    const uint16_t *restrict dres, float *restrict a0, float *restrict a1, int64_t i, int64_t D, float mean,
    float rstd, float mg, float mgx, const int wantb, const int nf, const an_fbwd_two *t2) {
    for (; i < D; i++) {
        const float xh = (an_bf16_to_f32(s[i]) - mean) * rstd;
        float t = g[i] - mg;
        AN_KEEP(t); /* the order as written, on every path (see AN_KEEP) */
        d[i] = AN_TO_BF16(nf, rstd * (t - xh * mgx) + an_bf16_to_f32(dres[i]));
        const float d1 = an_bf16_to_f32(dy[i]);
        a0[i] += d1 * xh;
        if (wantb) a1[i] += d1;
        if (t2) {
            const float d2 = an_bf16_to_f32(t2->dy2[i]);
            t2->a2[i] += d2 * xh;
            if (wantb) t2->a3[i] += d2;
        }
    }
}

#ifdef AN_AVX512
/* The fused backward's first pass with its sums' lanes in registers (the array loop kept them in memory): g = dy (w1 +
 * off1) [+ dy2 (w2 + off2)] into the scratch row, the lanes of sum g and sum g xhat into acc_g, acc_gx -- the same
 * values, lanes and order as the array loop. Whole groups of 32; returns where it stopped. */
static inline __attribute__((always_inline)) int64_t AN_FN(fused_bwd_sums_vec)(
    const uint16_t *restrict s, const uint16_t *restrict dy, const uint16_t *restrict dy2, const float *restrict w1,
    float off1, const float *restrict w2, float off2, float *restrict g, int64_t D, float mean, float rstd,
    const int has2, float *restrict acc_g, float *restrict acc_gx, const an_bf16_perm *pm) {
    (void)pm; /* AVX2's (bf16_perm_n) */
    const __m512 vm = _mm512_set1_ps(mean), vr = _mm512_set1_ps(rstd), vo1 = _mm512_set1_ps(off1),
                 vo2 = _mm512_set1_ps(off2);
    __m512 sg[2] = {_mm512_setzero_ps(), _mm512_setzero_ps()}, sx[2] = {sg[0], sg[0]};
    int64_t i = 0;
    for (; i + 32 <= D; i += 32)
        for (int h = 0; h < 2; h++) {
            const int64_t k = i + 16 * h;
            __m512 gv = _mm512_mul_ps(AN_FN(bf16x16_load)(dy + k), _mm512_add_ps(_mm512_loadu_ps(w1 + k), vo1));
            if (has2)
                gv = _mm512_add_ps(gv, _mm512_mul_ps(AN_FN(bf16x16_load)(dy2 + k),
                                                     _mm512_add_ps(_mm512_loadu_ps(w2 + k), vo2)));
            _mm512_storeu_ps(g + k, gv);
            sg[h] = _mm512_add_ps(sg[h], gv);
            const __m512 xh = _mm512_mul_ps(_mm512_sub_ps(AN_FN(bf16x16_load)(s + k), vm), vr);
            sx[h] = _mm512_add_ps(sx[h], _mm512_mul_ps(gv, xh));
        }
    for (int h = 0; h < 2; h++) {
        _mm512_storeu_ps(acc_g + 16 * h, sg[h]);
        _mm512_storeu_ps(acc_gx + 16 * h, sx[h]);
    }
    return i;
}

/* fused_bwd_out_scalar 32 values at a time, ds stored by bf16x32_put (streamed when nt),
 * and with t2 the second output's sums (an_fbwd_two) in the same pass; returns where it stopped */
static inline __attribute__((always_inline)) int64_t AN_FN(fused_bwd_out_vec)(
    uint16_t *restrict d, const float *restrict g, const uint16_t *restrict s, const uint16_t *restrict dy,
    const uint16_t *restrict dres, float *restrict a0, float *restrict a1, int64_t D, float mean, float rstd,
    float mg, float mgx, const int wantb, const int nf, const an_bf16_perm *pm, const int nt,
    const an_fbwd_two *t2) {
    (void)pm; /* AVX2's (bf16_perm_n) */
    const __m512 vm = _mm512_set1_ps(mean), vr = _mm512_set1_ps(rstd), vmg = _mm512_set1_ps(mg),
                 vmx = _mm512_set1_ps(mgx);
    int64_t i = 0;
    for (; i + 32 <= D; i += 32) {
        __m512 o[2];
        for (int h = 0; h < 2; h++) {
            const int64_t k = i + 16 * h;
            const __m512 xh = _mm512_mul_ps(_mm512_sub_ps(AN_FN(bf16x16_load)(s + k), vm), vr);
            __m512 t = _mm512_sub_ps(_mm512_loadu_ps(g + k), vmg);
            AN_KEEP(t); /* the order as written (fused_bwd_out_scalar) */
            const __m512 gv = _mm512_sub_ps(t, _mm512_mul_ps(xh, vmx));
            o[h] = _mm512_add_ps(_mm512_mul_ps(vr, gv), AN_FN(bf16x16_load)(dres + k));
            const __m512 d1 = AN_FN(bf16x16_load)(dy + k);
            _mm512_storeu_ps(a0 + k, _mm512_add_ps(_mm512_loadu_ps(a0 + k), _mm512_mul_ps(d1, xh)));
            if (wantb) _mm512_storeu_ps(a1 + k, _mm512_add_ps(_mm512_loadu_ps(a1 + k), d1));
            if (t2) {
                const __m512 d2 = AN_FN(bf16x16_load)(t2->dy2 + k);
                _mm512_storeu_ps(t2->a2 + k, _mm512_add_ps(_mm512_loadu_ps(t2->a2 + k), _mm512_mul_ps(d2, xh)));
                if (wantb) _mm512_storeu_ps(t2->a3 + k, _mm512_add_ps(_mm512_loadu_ps(t2->a3 + k), d2));
            }
        }
        AN_FN(bf16x32_put)(d + i, o[0], o[1], nf, nt);
    }
    return i;
}
#endif

#ifdef AN_AVX2
/* fused_bwd_sums_vec's AVX2 form (the same bits). With pm (pm->n: a whole number of steps of 32, the row's values in
 * the forwards' permuted order, see bf16_perm_n): s, dy and dy2 widened by one unpack each 16, the weights read
 * permuted with their offset added, g written permuted; the sums' lanes put back in order at the end. */
static inline __attribute__((always_inline)) int64_t AN_FN(fused_bwd_sums_vec_k)(
    const uint16_t *restrict s, const uint16_t *restrict dy, const uint16_t *restrict dy2, const float *restrict w1,
    float off1, const float *restrict w2, float off2, float *restrict g, int64_t D, float mean, float rstd,
    const int has2, float *restrict acc_g, float *restrict acc_gx, const an_bf16_perm *pm, const int perm) {
    const __m256 vm = _mm256_set1_ps(mean), vr = _mm256_set1_ps(rstd), vo1 = _mm256_set1_ps(off1),
                 vo2 = _mm256_set1_ps(off2);
    __m256 sg[4], sx[4];
    for (int h = 0; h < 4; h++) sg[h] = sx[h] = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 32 <= D; i += 32)
        for (int hh = 0; hh < 2; hh++) { /* 16 values at a time: with 32, dy2's registers spilled */
            const int64_t k16 = i + 16 * hh;
            for (int h2 = 0; h2 < 2; h2++) {
                const int h = 2 * hh + h2;
                const int64_t k = k16 + 8 * h2;
                const __m256 wv1 = perm ? _mm256_loadu_ps(pm->w + k) : _mm256_add_ps(_mm256_loadu_ps(w1 + k), vo1);
                __m256 gv = _mm256_mul_ps(AN_FN(bf16x8_of16)(dy + k16, h2, perm), wv1);
                if (has2) {
                    const __m256 wv2 = perm ? _mm256_loadu_ps(pm->b + k) : _mm256_add_ps(_mm256_loadu_ps(w2 + k), vo2);
                    gv = _mm256_add_ps(gv, _mm256_mul_ps(AN_FN(bf16x8_of16)(dy2 + k16, h2, perm), wv2));
                }
                _mm256_storeu_ps(g + k, gv);
                sg[h] = _mm256_add_ps(sg[h], gv);
                const __m256 xh = _mm256_mul_ps(_mm256_sub_ps(AN_FN(bf16x8_of16)(s + k16, h2, perm), vm), vr);
                sx[h] = _mm256_add_ps(sx[h], _mm256_mul_ps(gv, xh));
                AN_KEEP(sg[h]); /* one chain per lane, as the other paths sum */
                AN_KEEP(sx[h]);
            }
        }
    AN_FN(lanes4_store)(acc_g, sg, perm);
    AN_FN(lanes4_store)(acc_gx, sx, perm);
    return i;
}

/* pm: the first (w1 + off1, in .w) and second output's (w2 + off2, in .b) weights permuted, or n = 0 */
static inline __attribute__((always_inline)) int64_t AN_FN(fused_bwd_sums_vec)(
    const uint16_t *restrict s, const uint16_t *restrict dy, const uint16_t *restrict dy2, const float *restrict w1,
    float off1, const float *restrict w2, float off2, float *restrict g, int64_t D, float mean, float rstd,
    const int has2, float *restrict acc_g, float *restrict acc_gx, const an_bf16_perm *pm) {
    if (pm->n) return AN_FN(fused_bwd_sums_vec_k)(s, dy, dy2, w1, off1, w2, off2, g, D, mean, rstd, has2, acc_g, acc_gx,
                                                  pm, 1);
    return AN_FN(fused_bwd_sums_vec_k)(s, dy, dy2, w1, off1, w2, off2, g, D, mean, rstd, has2, acc_g, acc_gx, pm, 0);
}

/* 16 values of ds from value i, dw1 and db1 summed: the permuted order's (perm: g, a0 and a1 held so) or the row's */
static inline __attribute__((always_inline)) void AN_FN(fused_bwd_step16)(
    uint16_t *restrict d, const float *restrict g, const uint16_t *restrict s, const uint16_t *restrict dy,
    const uint16_t *restrict dres, float *restrict a0, float *restrict a1, int64_t i, __m256 vm, __m256 vr,
    __m256 vmg, __m256 vmx, const int wantb, const int nt, const int perm, const an_fbwd_two *t2) {
    __m256 o[2];
    for (int h = 0; h < 2; h++) {
        const int64_t k = i + 8 * h;
        const __m256 xh = _mm256_mul_ps(_mm256_sub_ps(AN_FN(bf16x8_of16)(s + i, h, perm), vm), vr);
        __m256 t = _mm256_sub_ps(_mm256_loadu_ps(g + k), vmg);
        AN_KEEP(t); /* the order as written (fused_bwd_out_scalar) */
        const __m256 gv = _mm256_sub_ps(t, _mm256_mul_ps(xh, vmx));
        o[h] = _mm256_add_ps(_mm256_mul_ps(vr, gv), AN_FN(bf16x8_of16)(dres + i, h, perm));
        const __m256 d1 = AN_FN(bf16x8_of16)(dy + i, h, perm);
        _mm256_storeu_ps(a0 + k, _mm256_add_ps(_mm256_loadu_ps(a0 + k), _mm256_mul_ps(d1, xh)));
        if (wantb) _mm256_storeu_ps(a1 + k, _mm256_add_ps(_mm256_loadu_ps(a1 + k), d1));
        if (t2) {
            const __m256 d2 = AN_FN(bf16x8_of16)(t2->dy2 + i, h, perm);
            _mm256_storeu_ps(t2->a2 + k, _mm256_add_ps(_mm256_loadu_ps(t2->a2 + k), _mm256_mul_ps(d2, xh)));
            if (wantb) _mm256_storeu_ps(t2->a3 + k, _mm256_add_ps(_mm256_loadu_ps(t2->a3 + k), d2));
        }
    }
    AN_FN(bf16x16_put_avx2)(d + i, AN_FN(bf16x16_pack_any)(AN_FN(bf16x8_bits)(o[0]), AN_FN(bf16x8_bits)(o[1]), perm),
                            nt);
}

/* fused_bwd_out_scalar 16 values at a time, rounding without the NaN test (callers: nf only), streamed when nt (d
 * then 32-byte aligned), with has2 the second output's sums too; [0, pm->n) in the permuted order (t2's sums held
 * so as a0's); returns where it stopped */
static inline __attribute__((always_inline)) int64_t AN_FN(fused_bwd_out_vec)(
    uint16_t *restrict d, const float *restrict g, const uint16_t *restrict s, const uint16_t *restrict dy,
    const uint16_t *restrict dres, float *restrict a0, float *restrict a1, int64_t D, float mean, float rstd,
    float mg, float mgx, const int wantb, const int nf, const an_bf16_perm *pm, const int nt,
    const an_fbwd_two *t2) {
    (void)nf; /* callers: nf only (bf16_vec_out) */
    const __m256 vm = _mm256_set1_ps(mean), vr = _mm256_set1_ps(rstd), vmg = _mm256_set1_ps(mg),
                 vmx = _mm256_set1_ps(mgx);
    int64_t i = 0;
    for (; i + 16 <= pm->n; i += 16)
        AN_FN(fused_bwd_step16)(d, g, s, dy, dres, a0, a1, i, vm, vr, vmg, vmx, wantb, nt, 1, t2);
    for (; i + 16 <= D; i += 16)
        AN_FN(fused_bwd_step16)(d, g, s, dy, dres, a0, a1, i, vm, vr, vmg, vmx, wantb, nt, 0, t2);
    return i;
}
#endif

#if !defined(AN_AVX512) && !defined(AN_AVX2)
/* the baseline build's stand-ins (see bf16_vec_out): no whole groups summed ahead; the portable second pass */
static inline __attribute__((always_inline)) int64_t AN_FN(fused_bwd_sums_vec)(
    const uint16_t *restrict s, const uint16_t *restrict dy, const uint16_t *restrict dy2, const float *restrict w1,
    float off1, const float *restrict w2, float off2, float *restrict g, int64_t D, float mean, float rstd,
    const int has2, float *restrict acc_g, float *restrict acc_gx, const an_bf16_perm *pm) {
    (void)s, (void)dy, (void)dy2, (void)w1, (void)off1, (void)w2, (void)off2, (void)g, (void)D, (void)mean;
    (void)rstd, (void)has2, (void)acc_g, (void)acc_gx, (void)pm;
    return 0;
}

static inline __attribute__((always_inline)) int64_t AN_FN(fused_bwd_out_vec)(
    uint16_t *restrict d, const float *restrict g, const uint16_t *restrict s, const uint16_t *restrict dy,
    const uint16_t *restrict dres, float *restrict a0, float *restrict a1, int64_t D, float mean, float rstd,
    float mg, float mgx, const int wantb, const int nf, const an_bf16_perm *pm, const int nt,
    const an_fbwd_two *t2) {
    (void)d, (void)g, (void)s, (void)dy, (void)dres, (void)a0, (void)a1, (void)D, (void)mean, (void)rstd;
    (void)mg, (void)mgx, (void)wantb, (void)nf, (void)pm, (void)nt, (void)t2;
    return 0;
}
#endif

/* The backward's parameter sums between the permuted order and the row's own over [0, pn) (perm_quads: its own
 * inverse), those the block sums: dw1 (a0), db1 (a1, wantb), dw2 (a2, has2), db2 (a3, has2 and wantb) */
static inline void AN_FN(fused_bwd_perm_sums)(float *a0, float *a1, float *a2, float *a3, int64_t pn, const int has2,
                                              const int wantb) {
    if (!pn) return;
    AN_FN(perm_quads)(a0, pn);
    if (wantb) AN_FN(perm_quads)(a1, pn);
    if (has2) AN_FN(perm_quads)(a2, pn);
    if (has2 && wantb) AN_FN(perm_quads)(a3, pn);
}

/* bfloat16 throughout: two passes over each row's bf16 inputs, converted where they are read; the parameter
 * gradients are summed in the second pass. Compiled per (nf, has2: a second output's gradient dy2, wantb: a bias
 * gradient): a form with one output computes no dy2 terms and one without biases no db sums. An accumulator that
 * is not wanted (or whose dy is absent) sums into a discarded scratch row of its own. */
static inline __attribute__((always_inline)) void AN_FN(fused_bwd_block_bf16_body)(const an_fbwd_args *a,
                                                                                     int64_t r0, int64_t r1,
                                                                                     const an_rows *sc, float **acc,
                                                                                     const int nf, const int has2,
                                                                                     const int wantb) {
    const int64_t D = a->D;
    const float inv_d = 1.0f / (float)D;
    float *restrict g = sc->r[3];
    uint16_t *restrict o16 = (uint16_t *)sc->r[4];
    /* dw1, db1, dw2, db2: scratch rows 0, 1, 2 and 5 (unused by this loop) where not wanted */
    float *restrict a0 = (acc[0] && a->dy) ? acc[0] : sc->r[0], *restrict a1 = (acc[1] && a->dy) ? acc[1] : sc->r[1];
    float *restrict a2 = (acc[2] && a->dy2) ? acc[2] : sc->r[2], *restrict a3 = (acc[3] && a->dy2) ? acc[3] : sc->r[5];
    /* without dy the first output's weight is a row of zeros: 0 * (w1 + off) would be NaN for an infinite w1,
     * where that output, not used, contributes nothing */
    const float *restrict w1 = a->dy ? (a->w1 ? a->w1 : AN_ONES(sc)) : AN_ZEROS(sc);
    const float *restrict w2 = a->w2 ? a->w2 : AN_ONES(sc);
    const float off1 = (a->dy && a->w1) ? a->weight_offset : 0.0f, off2 = a->w2 ? a->weight_offset : 0.0f;
    const uint16_t *zeros16 = (const uint16_t *)AN_ZEROS(sc);
    /* AVX2: the rows' values in the forwards' permuted order (bf16_perm_n) over [0, pn): the weights with their
     * offsets permuted once (w1 + off1 in .w, w2 + off2 in .b), g and the dw1 / db1 sums held permuted in between */
    const int64_t pn = AN_FN(bf16_perm_n)(D, nf);
    an_bf16_perm pm = {NULL, NULL, 0};
    if (pn) {
        float *wp1 = sc->r[12], *wp2 = sc->r[13];
        AN_FN(perm_row)(wp1, w1, off1, pn, 1);
        if (has2) AN_FN(perm_row)(wp2, w2, off2, pn, 1);
        pm.w = wp1;
        pm.b = wp2;
        pm.n = pn;
        AN_FN(fused_bwd_perm_sums)(a0, a1, a2, a3, pn, has2, wantb);
    }
    for (int64_t r = r0; r < r1; r++) {
        if (r + AN_PF_AHEAD < r1) { /* a later row's inputs (see prefetch_span) */
            const int64_t f = r + AN_PF_AHEAD;
            AN_FN(prefetch_span)((const uint16_t *)a->s + f * a->s_rs, (size_t)D * 2);
            AN_FN(prefetch_span)(a->dy ? (const uint16_t *)a->dy + f * a->dy_rs : NULL, (size_t)D * 2);
            AN_FN(prefetch_span)((has2 && a->dy2) ? (const uint16_t *)a->dy2 + f * a->dy2_rs : NULL, (size_t)D * 2);
            AN_FN(prefetch_span)(a->dres ? (const uint16_t *)a->dres + f * a->dres_rs : NULL, (size_t)D * 2);
        }
        const uint16_t *restrict s = (const uint16_t *)a->s + r * a->s_rs;
        const uint16_t *restrict dy = a->dy ? (const uint16_t *)a->dy + r * a->dy_rs : zeros16;
        const uint16_t *restrict dy2 = (has2 && a->dy2) ? (const uint16_t *)a->dy2 + r * a->dy2_rs : zeros16;
        const uint16_t *restrict dres = a->dres ? (const uint16_t *)a->dres + r * a->dres_rs : zeros16;
        const float mean = a->mean ? a->mean[r] : 0.0f, rstd = a->rstd[r];
        uint16_t *ds_row = (uint16_t *)a->ds + r * a->ds_rs;
        if (!(rstd >= AN_TINY_RSTD)) { /* beyond float32's range: in float64 (see bwd_row_big), from rows 8..11 */
            float *fs = sc->r[8], *fdy = sc->r[9], *fdy2 = sc->r[10], *fo = sc->r[11];
            AN_FN(load_row)(fs, s, D, AN_BF16);
            AN_FN(load_row)(fdy, dy, D, AN_BF16);
            AN_FN(load_row)(fdy2, dy2, D, AN_BF16);
            AN_FN(load_row)(fo, dres, D, AN_BF16);
            AN_FN(fused_bwd_perm_sums)(a0, a1, a2, a3, pn, has2, wantb); /* in order for the slow path */
            const int done = AN_FN(bwd_row_big)(fs, fdy, has2 ? fdy2 : NULL, fo, w1, off1, w2, off2, a->kind == AN_RMS,
                                                D, a0, wantb ? a1 : NULL, has2 ? a2 : NULL, (has2 && wantb) ? a3 : NULL,
                                                fo);
            AN_FN(fused_bwd_perm_sums)(a0, a1, a2, a3, pn, has2, wantb);
            if (done) {
                AN_FN(put_row)(ds_row, fo, D, AN_BF16, a->nt, fs);
                continue;
            }
        }
        float acc_g[AN_LANES], acc_gx[AN_LANES];
        AN_ZERO(acc_g); AN_ZERO(acc_gx);
        int64_t i = AN_FN(fused_bwd_sums_vec)(s, dy, dy2, w1, off1, w2, off2, g, D, mean, rstd, has2, acc_g, acc_gx,
                                              &pm);
        for (; i + AN_LANES <= D; i += AN_LANES)
            for (int j = 0; j < AN_LANES; j++) {
                float gv = an_bf16_to_f32(dy[i + j]) * (w1[i + j] + off1);
                if (has2) gv += an_bf16_to_f32(dy2[i + j]) * (w2[i + j] + off2);
                g[i + j] = gv;
                acc_g[j] += gv;
                acc_gx[j] += gv * ((an_bf16_to_f32(s[i + j]) - mean) * rstd);
            }
        for (; i < D; i++) {
            float gv = an_bf16_to_f32(dy[i]) * (w1[i] + off1);
            if (has2) gv += an_bf16_to_f32(dy2[i]) * (w2[i] + off2);
            g[i] = gv;
            acc_g[0] += gv;
            acc_gx[0] += gv * ((an_bf16_to_f32(s[i]) - mean) * rstd);
        }
        const float mg = a->kind == AN_LAYER ? AN_FN(hsum)(acc_g) * inv_d : 0.0f;
        const float mgx = AN_FN(hsum)(acc_gx) * inv_d;
        const int vec = AN_FN(bf16_vec_out)(nf);
        const int direct = vec && AN_FN(stream_direct)(ds_row, a->nt); /* streamed in the pass */
        uint16_t *restrict d = (a->nt && !direct) ? o16 : ds_row;
        const an_fbwd_two t2 = {dy2, a2, a3};
        i = vec ? AN_FN(fused_bwd_out_vec)(d, g, s, dy, dres, a0, a1, D, mean, rstd, mg, mgx, wantb, nf, &pm, direct,
                                           has2 ? &t2 : NULL)
                : 0;
        AN_FN(fused_bwd_out_scalar)(d, g, s, dy, dres, a0, a1, i, D, mean, rstd, mg, mgx, wantb, nf,
                                    has2 ? &t2 : NULL);
        if (a->nt && !direct) AN_FN(stream_bytes)(ds_row, o16, (size_t)D * 2);
    }
    AN_FN(fused_bwd_perm_sums)(a0, a1, a2, a3, pn, has2, wantb); /* the sums back in order */
}

/* nf: fused_bwd_rows' verdict on the chunk (ds rounded without the NaN test when no float32 operand needs it) */
static void AN_FN(fused_bwd_block_bf16)(const an_fbwd_args *a, int64_t r0, int64_t r1, const an_rows *sc,
                                        float **acc, const int nf) {
    const int has2 = a->dy2 != NULL, wantb = acc[1] != NULL || acc[3] != NULL;
#define AN_FBWD_CASE(NF, H2, WB) \
    if (nf == NF && has2 == H2 && wantb == WB) AN_FN(fused_bwd_block_bf16_body)(a, r0, r1, sc, acc, NF, H2, WB);
    AN_FBWD_CASE(1, 0, 1) else AN_FBWD_CASE(1, 0, 0) else AN_FBWD_CASE(1, 1, 1) else AN_FBWD_CASE(1, 1, 0)
    else AN_FBWD_CASE(0, 0, 1) else AN_FBWD_CASE(0, 0, 0) else AN_FBWD_CASE(0, 1, 1) else AN_FBWD_CASE(0, 1, 0)
#undef AN_FBWD_CASE
}

/* Parameter gradients: float32 sums over blocks of AN_BLOCK rows (scratch rows 6..9), each block added
 * into the chunk's float64 partial rows, as the Add & Norm backward does (and, as there, straight into float32
 * partial rows where each chunk is one block: sc->f32_partials). */
static void AN_FN(fused_bwd_rows)(const an_fbwd_args *a, int64_t r0, int64_t r1, const an_rows *sc,
                                  double *const *partial) {
    const int64_t D = a->D;
    const int direct = sc->f32_partials;
    float *acc[4];
    for (int k = 0; k < 4; k++) acc[k] = partial[k] ? (direct ? (float *)partial[k] : sc->r[6 + k]) : NULL;
    /* once per chunk: the NaN verdict over the float32 operands (weights, weight_offset, the saved statistics) */
    const int nf = a->uniform_bf16 && an_nan_safe(a->w1, D) && an_nan_safe(a->w2, D) &&
                   an_scalar_nan_safe(a->weight_offset) && an_nan_safe(a->mean ? a->mean + r0 : NULL, r1 - r0) &&
                   an_nan_safe(a->rstd + r0, r1 - r0);
    for (int64_t b0 = r0; b0 < r1; b0 += AN_BLOCK) {
        const int64_t b1 = b0 + AN_BLOCK < r1 ? b0 + AN_BLOCK : r1;
        for (int k = 0; k < 4; k++) if (acc[k] && !direct) memset(acc[k], 0, sizeof(float) * (size_t)D);
        if (a->uniform_bf16) AN_FN(fused_bwd_block_bf16)(a, b0, b1, sc, acc, nf);
        else AN_FN(fused_bwd_block)(a, b0, b1, sc, acc);
        if (direct) continue;
        for (int k = 0; k < 4; k++)
            if (acc[k]) for (int64_t i = 0; i < D; i++) partial[k][i] += (double)acc[k][i];
    }
}

#undef AN_FN
#undef AN_CAT
#undef AN_CAT2
