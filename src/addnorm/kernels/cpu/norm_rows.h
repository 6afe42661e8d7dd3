/* Row kernels of fused residual-add + LayerNorm / RMSNorm, forward and backward.
 *
 * Included several times by addnorm_cpu.c, each time compiled for one instruction set (AVX-512,
 * AVX2+FMA+F16C, baseline) with its functions suffixed by AN_SFX; the host picks one at load time.
 * The loops are plain C written so that gcc vectorizes them (branch-free bfloat16 rounding,
 * AN_LANES independent partial sums per reduction so the adder's latency is hidden and the
 * summation order -- hence the bits -- is fixed). Every row of a 16-bit dtype is converted once
 * into a float32 scratch row that stays in L1; float32 rows are read where they lie. So memory
 * traffic is the minimum: forward reads x (+ residual) and writes out (+ the new residual);
 * backward reads dy, the saved sum (+ the incoming residual gradient) and writes dx.
 */

#define AN_CAT2(a, b) a##b
#define AN_CAT(a, b) AN_CAT2(a, b)
#define AN_FN(name) AN_CAT(name, AN_SFX)
#define AN_LANES 32
/* The forward statistics' partial sums run over blocks of AN_SUM_BLOCK values (16 terms per lane), each block's
 * total added in float64: one float32 chain per lane over a whole row lost accuracy with the row's width (a
 * review: rstd 1.3e-5 off at D = 65536 on a constant row, 57 ulps with one channel at 1e4, where eager's
 * cascade is within 1). A row of one block sums as before: its lanes, then the tail into lane 0. */
#define AN_SUM_BLOCK 512

/* n bytes at p set to zero (n a multiple of the vector width's bytes), by vector stores written out: gcc turns a
 * per-row `float acc[AN_LANES] = {0}` (and a loop of vector stores of zero) into `rep stosq`, whose start-up cost
 * on the AMD EPYC was ~10 % of the AVX2 norm-then-add LayerNorm forward's time under `perf` (three a row). */
#if defined(AN_AVX512)
#define AN_ZERO_W 64
#elif defined(AN_AVX2)
#define AN_ZERO_W 32
#endif
static inline __attribute__((always_inline)) void AN_FN(zero_bytes)(void *p, const size_t n) {
#if defined(AN_AVX512)
#pragma GCC unroll 16
    for (size_t k = 0; k < n / AN_ZERO_W; k++) _mm512_storeu_ps((float *)((char *)p + AN_ZERO_W * k), _mm512_setzero_ps());
#elif defined(AN_AVX2)
#pragma GCC unroll 16
    for (size_t k = 0; k < n / AN_ZERO_W; k++) _mm256_storeu_ps((float *)((char *)p + AN_ZERO_W * k), _mm256_setzero_ps());
#else
    memset(p, 0, n);
#endif
}
#undef AN_ZERO_W
/* an array's every element zero (an array, not a pointer: its sizeof is its bytes) */
#define AN_ZERO(arr) AN_FN(zero_bytes)((arr), sizeof(arr))
_Static_assert(AN_LANES * sizeof(float) % 64 == 0, "AN_ZERO's stores cover a lane array whole");

/* ---- dtype conversion of whole rows ---- */

static void AN_FN(load_row)(float *restrict dst, const void *restrict src, int64_t n, int dt) {
    if (dt == AN_F32) {
        memcpy(dst, src, (size_t)n * sizeof(float));
        return;
    }
    const uint16_t *s = (const uint16_t *)src;
    int64_t i = 0;
    if (dt == AN_BF16) {
        for (; i < n; i++) dst[i] = an_bf16_to_f32(s[i]);
        return;
    }
#ifdef AN_F16C
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s + i))));
#endif
    for (; i < n; i++) dst[i] = an_f16_to_f32(s[i]);
}

static void AN_FN(store_row)(void *restrict dst, const float *restrict src, int64_t n, int dt) {
    if (dt == AN_F32) {
        memcpy(dst, src, (size_t)n * sizeof(float));
        return;
    }
    uint16_t *d = (uint16_t *)dst;
    int64_t i = 0;
    if (dt == AN_BF16) {
        for (; i < n; i++) d[i] = an_f32_to_bf16(src[i]);
        return;
    }
#ifdef AN_F16C
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(d + i), _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
#endif
    for (; i < n; i++) d[i] = an_f32_to_f16(src[i]);
}

/* Copy bytes with non-temporal stores: large outputs are written without first reading their
 * cache lines (read-for-ownership), which would add one read per written tensor. */
static void AN_FN(stream_bytes)(void *restrict dst, const void *restrict src, size_t n) {
#ifdef AN_STREAM_BYTES
    char *d = (char *)dst;
    const char *s = (const char *)src;
    size_t head = (AN_STREAM_BYTES - ((uintptr_t)d & (AN_STREAM_BYTES - 1))) & (AN_STREAM_BYTES - 1);
    if (head > n) head = n;
    memcpy(d, s, head);
    size_t i = head;
    for (; i + AN_STREAM_BYTES <= n; i += AN_STREAM_BYTES) {
#if AN_STREAM_BYTES == 64
        _mm512_stream_si512((void *)(d + i), _mm512_loadu_si512((const void *)(s + i)));
#else
        _mm256_stream_si256((__m256i *)(d + i), _mm256_loadu_si256((const __m256i *)(s + i)));
#endif
    }
    memcpy(d + i, s + i, n - i);
#else
    memcpy(dst, src, n);
#endif
}

/* The rows asked for ahead, below: every loop asks through prefetch_next, prefetch_chunk and prefetch_span, which
 * make no request where g_swpf is 0 (AMD's CPUs: addnorm_cpu.c); only the bfloat16 stream's loops call the *_always
 * forms (stream_rows.h). The measurements quoted here are the 2-core Xeon's and the AMD EPYC's of before that switch.
 *
 * [0, bytes) of up to four rows (NULL: none), into L1, a line at a time, the rows interleaved: the next row's
 * data asked for while the current row's last pass runs -- prefetch_chunk's chunks of it, or the fused forms'
 * whole next row between a row's reducing pass and its writing pass. There it beat prefetch_span two rows ahead
 * by 10-20 %: on the 2-core Xeon, caches flushed before each call, 8192 x 1024 bf16, the parallel form's
 * LayerNorm forward took 3.25 ms against 3.87, norm-then-add's 2.31 against 2.58. */
static inline void AN_FN(prefetch_next_always)(const void *a, const void *b, const void *c, const void *d,
                                               size_t bytes) {
    for (size_t o = 0; o < bytes; o += 64) {
        if (a) __builtin_prefetch((const char *)a + o, 0, 3);
        if (b) __builtin_prefetch((const char *)b + o, 0, 3);
        if (c) __builtin_prefetch((const char *)c + o, 0, 3);
        if (d) __builtin_prefetch((const char *)d + o, 0, 3);
    }
}

/* prefetch_next where the row loops prefetch at all (g_swpf: not on AMD's CPUs, whose own prefetchers do better) */
static inline void AN_FN(prefetch_next)(const void *a, const void *b, const void *c, const void *d, size_t bytes) {
    if (g_swpf) AN_FN(prefetch_next_always)(a, b, c, d, bytes);
}

/* Prefetch the chunk [c0, c0 + AN_CHUNK) of up to three rows (element size es) -- the next row's data,
 * requested while the current row's last pass runs. Narrow rows too (every dtype): the hardware prefetcher alone
 * left them latency-bound from DRAM. On the 2-core Xeon (AVX-512), 8192 x 1024 with the caches flushed before
 * each call, Add & Norm bf16 went from 0.89-0.92 of the copy floor forward to 0.96-1.06, and from 0.68-0.69 to
 * 0.83-0.93 fwd+bwd, when rows of 1024 were prefetched as well (they were left out below 1025;
 * benchmarks/results/cold/compare_before_after.md). */
#define AN_CHUNK 512
/* rows of more float32 values than this (1 MiB) stay in no core's L2: their loops keep no whole-row scratch copy */
#define AN_WIDE_ROW ((int64_t)1 << 18)
static inline void AN_FN(prefetch_chunk)(const void *a, const void *b, const void *c, int64_t c0, int64_t D, int es) {
    const int64_t c1 = c0 + AN_CHUNK < D ? c0 + AN_CHUNK : D;
    const size_t o = (size_t)(c0 * es);
    AN_FN(prefetch_next)(a ? (const char *)a + o : NULL, b ? (const char *)b + o : NULL,
                         c ? (const char *)c + o : NULL, NULL, (size_t)((c1 - c0) * es));
}

/* Ask for [p, p + bytes) into L2 (prefetcht1), a line at a time: the row or token AN_PF_AHEAD ahead of the
 * one being worked on, in one-pass loops (DyT / Derf's backward in both dtypes, the stream read) and the
 * backward of the fused forms (bf16) and of the stream write (bf16). Same
 * cause: on the 2-core Xeon, caches flushed before each call, the bf16 stream read at 8192 tokens x 4 x 1024
 * took 4.93 ms without it and 3.80 ms with it (1, 2, 4 or 8 tokens ahead alike; prefetchnta was 2-3x slower).
 * The stream write's forward takes none (float32 lost 10 % with it, bf16 gained nothing). On the AMD EPYC the
 * bf16 forwards of DyT / Derf and of the stream write ask for the next row or token in pieces instead, as
 * norm-then-add does (prefetch_chunk): DyT / Derf 0.92-0.99 of the time, the stream write 0.80-0.90 (A/B of the
 * builds, three alternating rounds; the journal has the table); the stream read lost 15-32 % that way and keeps
 * this. Since then the AMD EPYC makes none of these requests but the bfloat16 stream's (g_swpf). NULL: nothing. */
#define AN_PF_AHEAD 2
static inline void AN_FN(prefetch_span_always)(const void *p, size_t bytes) {
    if (!p) return;
    for (size_t o = 0; o < bytes; o += 64) __builtin_prefetch((const char *)p + o, 0, 2);
}

/* prefetch_span where the row loops prefetch at all (g_swpf) */
static inline void AN_FN(prefetch_span)(const void *p, size_t bytes) {
    if (g_swpf) AN_FN(prefetch_span_always)(p, bytes);
}

/* Store a float32 row in the storage dtype; streamed when nt (scratch: room for n 16-bit values). */
static void AN_FN(put_row)(void *restrict dst, const float *restrict src, int64_t n, int dt, int nt, void *restrict scratch) {
    if (!nt) {
        AN_FN(store_row)(dst, src, n, dt);
    } else if (dt == AN_F32) {
        AN_FN(stream_bytes)(dst, src, (size_t)n * 4);
    } else {
        AN_FN(store_row)(scratch, src, n, dt);
        AN_FN(stream_bytes)(dst, scratch, (size_t)n * 2);
    }
}

/* Round a float row to the storage dtype and back, in place (no-op for float32). */
static void AN_FN(round_row)(float *restrict v, int64_t n, int dt) {
    int64_t i = 0;
    if (dt == AN_BF16) {
        for (; i < n; i++) v[i] = an_bf16_round(v[i]);
    } else if (dt == AN_F16) {
#ifdef AN_F16C
        for (; i + 8 <= n; i += 8)
            _mm256_storeu_ps(v + i, _mm256_cvtph_ps(_mm256_cvtps_ph(_mm256_loadu_ps(v + i), _MM_FROUND_TO_NEAREST_INT)));
#endif
        for (; i < n; i++) v[i] = an_f16_to_f32(an_f32_to_f16(v[i]));
    }
}

/* ---- reductions with AN_LANES partial sums ---- */

/* The lanes' sum in one order on every path and in every loop: lane j + lane j + 16, then halving (16, 8, 4, 2, 1
 * lanes), the order the AVX-512 build's vectorized loop had taken. As a plain loop, built with -fassociative-math,
 * gcc chose the order per instruction set and per inlining context: the AVX2 one-row RMSNorm loop had summed in
 * 8-lane steps, and a row's rstd moved by a float32 step against the other paths. */
static inline float AN_FN(hsum)(const float *acc) {
    _Static_assert(AN_LANES == 32, "the order below is for 32 lanes");
#if defined(AN_AVX512) || defined(AN_AVX2)
    __m256 a = _mm256_add_ps(_mm256_loadu_ps(acc), _mm256_loadu_ps(acc + 16));
    __m256 b = _mm256_add_ps(_mm256_loadu_ps(acc + 8), _mm256_loadu_ps(acc + 24));
    AN_KEEP(a);
    AN_KEEP(b);
    a = _mm256_add_ps(a, b);
    AN_KEEP(a);
    __m128 c = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    AN_KEEP(c);
    c = _mm_add_ps(c, _mm_movehl_ps(c, c));
    AN_KEEP(c);
    return _mm_cvtss_f32(_mm_add_ss(c, _mm_shuffle_ps(c, c, 1)));
#else
    float v[16];
    for (int j = 0; j < 16; j++) {
        v[j] = acc[j] + acc[j + 16];
        AN_KEEP(v[j]);
    }
    for (int h = 8; h >= 1; h /= 2)
        for (int j = 0; j < h; j++) {
            v[j] = v[j] + v[j + h];
            AN_KEEP(v[j]);
        }
    return v[0];
#endif
}

/* acc's lanes added to total's (float64) and cleared: a block's end (lane by lane, so that it vectorizes) */
static inline void AN_FN(flush)(float *restrict acc, double *restrict total) {
    for (int j = 0; j < AN_LANES; j++) {
        total[j] += (double)acc[j];
        acc[j] = 0.0f;
    }
}

static inline double AN_FN(dsum)(const double *total) {
    double s = 0.0;
    for (int j = 0; j < AN_LANES; j++) s += total[j];
    return s;
}

static float AN_FN(row_sum)(const float *restrict v, int64_t n) {
    float acc[AN_LANES];
    AN_ZERO(acc);
    double total[AN_LANES];
    AN_ZERO(total);
    int64_t i = 0;
    while (i + AN_LANES <= n) {
        const int64_t end = i + AN_SUM_BLOCK < n ? i + AN_SUM_BLOCK : n;
        for (; i + AN_LANES <= end; i += AN_LANES)
            for (int j = 0; j < AN_LANES; j++) acc[j] += v[i + j];
        if (i + AN_LANES <= n) AN_FN(flush)(acc, total); /* another block follows */
    }
    for (; i < n; i++) acc[0] += v[i];
    AN_FN(flush)(acc, total);
    return (float)AN_FN(dsum)(total);
}

/* buf = x + r (float32), also written to res (if given) in the same pass; returns the sum */
static float AN_FN(add_rows_sum)(float *restrict buf, const float *restrict x, const float *restrict r,
                                 float *restrict res, int64_t n) {
    int64_t i = 0;
    if (res) {
        for (; i < n; i++) { float v = x[i] + r[i]; buf[i] = v; res[i] = v; }
    } else {
        for (; i < n; i++) buf[i] = x[i] + r[i];
    }
    return AN_FN(row_sum)(buf, n); /* in blocks (see AN_SUM_BLOCK), over the row just written, in cache */
}

static float AN_FN(sq_dev_sum)(const float *restrict v, float mean, int64_t n) {
    float acc[AN_LANES];
    AN_ZERO(acc);
    double total[AN_LANES];
    AN_ZERO(total);
    int64_t i = 0;
    while (i + AN_LANES <= n) {
        const int64_t end = i + AN_SUM_BLOCK < n ? i + AN_SUM_BLOCK : n;
        for (; i + AN_LANES <= end; i += AN_LANES)
            for (int j = 0; j < AN_LANES; j++) { float d = v[i + j] - mean; acc[j] += d * d; }
        if (i + AN_LANES <= n) AN_FN(flush)(acc, total);
    }
    for (; i < n; i++) { float d = v[i] - mean; acc[0] += d * d; }
    AN_FN(flush)(acc, total);
    return (float)AN_FN(dsum)(total);
}

/* LayerNorm's statistics of a row whose sum is given: from mean0 = sum / n, one pass takes s1 = sum(x - mean0)
 * (0 but for rounding) and s2 = sum((x - mean0)^2); the mean is corrected by s1 / n and the sum of squared
 * deviations is s2 - s1^2 / n (Chan, Golub and LeVeque's corrected two-pass algorithm). A constant row gets
 * its value as its mean exactly and 0 as its variance, as torch's Welford moments do: the rounded sum / n
 * alone left xhat at a few 1e-3 (eps 1e-5) or +-1 (eps 0, where torch gives NaN) for most widths. A sum of
 * squares that overflows is returned NaN, not inf (whose rstd 0 would pass for a statistic): the caller's
 * checked_stats then takes the row in float64, whose finite answer it has.
 * Returns the sum of squared deviations; *mean_out the mean. */
static float AN_FN(layer_moments)(const float *restrict v, int64_t n, float sum, float *mean_out) {
    const float m = sum / (float)n;
    float a1[AN_LANES], a2[AN_LANES];
    AN_ZERO(a1); AN_ZERO(a2);
    double l1[AN_LANES], l2[AN_LANES];
    AN_ZERO(l1); AN_ZERO(l2);
    int64_t i = 0;
    while (i + AN_LANES <= n) { /* in blocks (see AN_SUM_BLOCK) */
        const int64_t end = i + AN_SUM_BLOCK < n ? i + AN_SUM_BLOCK : n;
        for (; i + AN_LANES <= end; i += AN_LANES)
            for (int j = 0; j < AN_LANES; j++) { float d = v[i + j] - m; a1[j] += d; a2[j] += d * d; }
        if (i + AN_LANES <= n) {
            AN_FN(flush)(a1, l1);
            AN_FN(flush)(a2, l2);
        }
    }
    for (; i < n; i++) { float d = v[i] - m; a1[0] += d; a2[0] += d * d; }
    AN_FN(flush)(a1, l1);
    AN_FN(flush)(a2, l2);
    const double t1 = AN_FN(dsum)(l1), t2 = AN_FN(dsum)(l2);
    /* the correction t1 / n where t1 stands above its own rounding (each x - mean0 rounds by up to half an ulp of
     * it, and the float32 partial sums a few more; sum |x - mean0| <= sqrt(n t2) bounds their scale): a constant
     * row's (every x - mean0 exact and alike), or a sum that was off. Within that noise, the blocked sum's mean0
     * is the better mean: a review found the correction moving bfloat16 rows' means by ~40 ulps at D = 8192-16384
     * (outputs near the mean several bfloat16 steps off, eager's half a step) */
    const double noise = 16.0 * FLT_EPSILON * sqrt((double)n * t2);
    *mean_out = (t1 > noise || t1 < -noise) ? (float)((double)m + t1 / (double)n) : m;
    const float s2 = (float)t2; /* overflows to inf as the float32 sum did: NaN below */
    const float ss = isinf(s2) ? s2 : (float)(t2 - t1 * (t1 / (double)n));
    if (isinf(ss)) return NAN;
    return ss < 0.0f ? 0.0f : ss;  /* a NaN stays NaN */
}

/* The end of one block of a first pass that sums v (acc) and v^2 (sq) in float32 lanes: both added to their float64
 * totals and cleared (see AN_SUM_BLOCK). RMSNorm's pass keeps its one chain per lane (rms: nothing is flushed). */
static inline __attribute__((always_inline)) void AN_FN(pair_flush)(float *restrict acc, float *restrict sq,
                                                                    double *restrict t1, double *restrict t2,
                                                                    const int rms) {
    if (rms) return;
    AN_FN(flush)(acc, t1);
    AN_FN(flush)(sq, t2);
}

/* ---- the AVX2 bfloat16 forwards' order ----
 * AVX2 widens 8 bfloat16 values to float32 with two instructions (vpmovzxwd, vpslld), and packs 16 results back in
 * order with two more (vpackusdw, then vpermq across the 128-bit halves). Unpacking a 16-value load against zero
 * (vpunpcklwd / vpunpckhwd) widens with one, and vpackusdw alone then restores the order, but the two registers hold
 * values 0-3 and 8-11, then 4-7 and 12-15: within each 16, the middle two quads swapped. The AVX2 first pass keeps
 * that order in its float32 row (buf) over [0, n) (n: bf16_perm_n, whole steps of 32; the tail is in order), and the
 * output loop reads w + weight_offset and b in it (bf16_perm_prep, per task; a row's two scratch rows per weight,
 * so only rows up to AN_BF16_PERM_MAX_D wide take it). The sums' lanes are put back in order at each block's end,
 * and the statistics' slow paths see the row in order (perm_quads): every value, lane and sum as before, the same
 * bits. */
#define AN_BF16_PERM_MAX_D 65536

static inline int64_t AN_FN(bf16_perm_n)(int64_t D, int nf) {
#if defined(AN_AVX2)
    return (nf && D <= AN_BF16_PERM_MAX_D) ? D / AN_LANES * AN_LANES : 0;
#else
    (void)D;
    (void)nf;
    return 0;
#endif
}

/* [0, n) (a multiple of 16) between the row's order and the loops': each 16's middle two quads swapped, both ways */
static inline void AN_FN(perm_quads)(float *v, int64_t n) {
    for (int64_t g = 0; g + 16 <= n; g += 16)
        for (int j = 4; j < 8; j++) {
            const float t = v[g + j];
            v[g + j] = v[g + j + 4];
            v[g + j + 4] = t;
        }
}

/* dst[0, n) = w + off (add) or w, in the loops' order */
static inline void AN_FN(perm_row)(float *restrict dst, const float *restrict w, float off, int64_t n, int add) {
    for (int64_t g = 0; g + 16 <= n; g += 16)
        for (int j = 0; j < 16; j++) {
            const int src = (j >> 2) == 1 ? j + 4 : (j >> 2) == 2 ? j - 4 : j;
            dst[g + j] = add ? w[g + src] + off : w[g + src];
        }
}

/* the permuted weights of one output over n values, into two scratch rows (n = 0: none) */
static inline an_bf16_perm AN_FN(bf16_perm_prep)(float *restrict wrow, float *restrict brow, const float *restrict w,
                                                 const float *restrict b, float off, int64_t n) {
    an_bf16_perm p = {NULL, NULL, 0};
    if (!n) return p;
    AN_FN(perm_row)(wrow, w, off, n, 1);
    AN_FN(perm_row)(brow, b, 0.0f, n, 0); /* copied, not + 0: an absent bias is -0.0 */
    p.w = wrow;
    p.b = brow;
    p.n = n;
    return p;
}

/* the permuted weights from value c0 of a row on, for the len values there (n: how many of them are permuted) */
static inline an_bf16_perm AN_FN(perm_at)(const an_bf16_perm *p, int64_t c0, int64_t len) {
    an_bf16_perm q = {NULL, NULL, 0};
    if (p->n <= c0) return q;
    q.w = p->w + c0;
    q.b = p->b + c0;
    q.n = p->n - c0 < len ? p->n - c0 : len;
    return q;
}

/* LayerNorm's statistics from one pass: a row's sums S1 = sum v and S2 = sum v^2, each in float32 lanes over blocks
 * of AN_SUM_BLOCK added in float64 (t1, t2, after pair_flush), give the mean S1 / n and the sum of squared
 * deviations S2 - S1^2 / n. Its rounding is S2's, about 16 float32 roundings of the terms, which stays within
 * layer_moments' (the same on sum (v - mean)^2) while n mean^2 <= S2 / 16: the mean at most a quarter of the
 * row's spread, as in the rows a network normalizes. Every other row -- a large common offset, a constant row,
 * squares that overflow (inf, NaN) or that fall below float32's normal range (a mean square under 2^-100) -- is
 * left to layer_moments' second pass over v, whose answer it was before. The bfloat16 forwards' first pass
 * already holds each v in a register: LayerNorm's in-cache pass over the row, which kept it ~20 % behind RMSNorm
 * from DRAM (8192 x 1024), is then skipped. Returns the sum of squared deviations; *mean_out the mean. */
static float AN_FN(layer_moments_1p)(float *restrict v, int64_t n, const double *t1, const double *t2,
                                     float *mean_out, int64_t perm_n) {
    const double s1 = AN_FN(dsum)(t1), s2 = AN_FN(dsum)(t2), dn = (double)n;
    if (!(s2 > 0x1p-100 * dn && s2 <= 0x1p120 && s1 * s1 <= s2 * dn * 0.0625)) { /* a NaN too */
        AN_FN(perm_quads)(v, perm_n); /* the row's own order, whose lanes and order the sum's bits follow */
        const float ss = AN_FN(layer_moments)(v, n, (float)s1, mean_out);
        AN_FN(perm_quads)(v, perm_n);
        return ss;
    }
    const double mean = s1 / dn;
    *mean_out = (float)mean;
    const double ss = s2 - s1 * mean;
    return ss < 0.0 ? 0.0f : (float)ss;
}

/* ---- rows beyond float32's range: statistics and xhat in float64 ----
 * Values above ~1.8e19 overflow a float32 sum of squares (and values near float32's largest the sum itself), so
 * float32 statistics come out inf or NaN for rows whose true outputs are finite; a standard deviation above 2^96
 * leaves rstd near float32's subnormals and (x - mean) able to overflow. Such a row -- its float32 rstd not at least
 * AN_TINY_RSTD, NaN included -- is taken again in float64 (a slow path that ordinary rows never enter): its
 * statistics, and xhat rounded once to float32, which the output loops then scale by the weight as any row's. */
#define AN_TINY_RSTD 0x1p-96f

/* A row's mean (0 for RMSNorm) and sum of squared deviations from it, in float64: the slow path's two passes. */
static void AN_FN(moments64)(const float *v, int64_t n, int rms, double *mean, double *sq) {
    double sum = 0.0;
    if (!rms)
        for (int64_t i = 0; i < n; i++) sum += (double)v[i];
    const double m = rms ? 0.0 : sum / (double)n;
    double q = 0.0;
    for (int64_t i = 0; i < n; i++) {
        const double d = (double)v[i] - m;
        q += d * d;
    }
    *mean = m;
    *sq = q;
}

/* The row's mean (0 for RMSNorm) and 1 / sqrt(var + eps) in float64. Returns 0 for a row with an inf or NaN (its
 * float32 statistics stand); else 1, with big set and *mean,
 * *rstd the float32 roundings the backward is given. */
static int AN_FN(big_stats)(const float *v, int64_t n, int rms, float eps, an_big *big, float *mean, float *rstd) {
    double m, q;
    AN_FN(moments64)(v, n, rms, &m, &q);
    if (!isfinite(m) || !isfinite(q)) return 0;
    big->mean = m;
    big->rstd = 1.0 / sqrt(q / (double)n + (double)eps);
    *mean = (float)m;
    *rstd = (float)big->rstd;
    return 1;
}

/* The statistics a row is normalized with: the float32 ones when rstd >= AN_TINY_RSTD (every ordinary row: one
 * compare), else float64's (big_stats; returns big, or NULL where float32's stand) */
static inline const an_big *AN_FN(checked_stats)(const float *v, int64_t n, int rms, float eps, an_big *big,
                                                 float *mean, float *rstd) {
    if (*rstd >= AN_TINY_RSTD) return NULL;
    return AN_FN(big_stats)(v, n, rms, eps, big, mean, rstd) ? big : NULL;
}

/* checked_stats over a row held in the AVX2 loops' order over [0, perm_n): its slow path sees the row in order */
static inline const an_big *AN_FN(checked_stats_p)(float *v, int64_t n, int rms, float eps, an_big *big,
                                                   float *mean, float *rstd, int64_t perm_n) {
    if (*rstd >= AN_TINY_RSTD) return NULL;
    AN_FN(perm_quads)(v, perm_n);
    const an_big *r = AN_FN(checked_stats)(v, n, rms, eps, big, mean, rstd);
    AN_FN(perm_quads)(v, perm_n);
    return r;
}

/* One row's backward in float64, for a row whose saved rstd is below AN_TINY_RSTD: its statistics recomputed from s
 * (the saved float32 rstd may be subnormal, s - mean may overflow float32; eps, at most 2^128, is below 2^-64 of such
 * a variance). g = dy (w1 + off1) [+ dy2 (w2 + off2)]; dst = rstd (g - mean(g) - xhat mean(g xhat)) + dres (dst may be
 * dres: same index); dw1 += dy xhat, db1 += dy, dw2, db2 likewise (each NULL when not wanted; dy NULL: none of its
 * terms). Returns 0, having written nothing, when s holds an inf or NaN. */
static int AN_FN(bwd_row_big)(const float *s, const float *dy, const float *dy2, const float *dres, const float *w1,
                              float off1, const float *w2, float off2, int rms, int64_t n, float *dw1, float *db1,
                              float *dw2, float *db2, float *dst) {
    double m, q;
    AN_FN(moments64)(s, n, rms, &m, &q);
    if (!isfinite(m) || !isfinite(q) || q == 0.0) return 0;
    const double rs = 1.0 / sqrt(q / (double)n);
    double sg = 0.0, sgx = 0.0;
    for (int64_t i = 0; i < n; i++) {
        double g = 0.0;
        if (dy) g += (double)dy[i] * ((double)(w1 ? w1[i] : 1.0f) + off1);
        if (dy2) g += (double)dy2[i] * ((double)(w2 ? w2[i] : 1.0f) + off2);
        sg += g;
        sgx += g * (((double)s[i] - m) * rs);
    }
    const double mg = rms ? 0.0 : sg / (double)n, mgx = sgx / (double)n;
    for (int64_t i = 0; i < n; i++) {
        double g = 0.0;
        if (dy) g += (double)dy[i] * ((double)(w1 ? w1[i] : 1.0f) + off1);
        if (dy2) g += (double)dy2[i] * ((double)(w2 ? w2[i] : 1.0f) + off2);
        const double xh = ((double)s[i] - m) * rs;
        const double r = dres ? (double)dres[i] : 0.0;
        dst[i] = (float)(rs * (g - mg - xh * mgx) + r);
        if (dy && dw1) dw1[i] += (float)((double)dy[i] * xh);
        if (dy && db1) db1[i] += dy[i];
        if (dy2 && dw2) dw2[i] += (float)((double)dy2[i] * xh);
        if (dy2 && db2) db2[i] += dy2[i];
    }
    return 1;
}

/* A row whose rstd is 0 -- its sum of squares overflowed, finite values above ~1.8e19: xhat = (src - mean) * 0
 * (0, or NaN where src is infinite) formed first, into dst, and returned, to be normalized with mean 0 and rstd 1.
 * Eager forms x * rsqrt(var + eps) before the weight; the output loops, built with -fassociative-math, may
 * multiply by the weight first, and (x - mean) * w overflowing to inf times 0 gave NaN where eager gives 0. */
__attribute__((noipa)) static const float *AN_FN(flat_row)(float *dst, const float *src, int64_t n, float mean,
                                                            float rstd) {
    /* rstd (0) as a value the compiler cannot see: (x - mean) * 0.0f, and the caller's rstd known to be 0 when
     * inlined, were folded to 0, an infinite x's NaN with it (noipa: neither inlined nor specialised) */
    for (int64_t i = 0; i < n; i++) dst[i] = (src[i] - mean) * rstd;
    return dst;
}

/* The row the output loops normalize, with the (mean, rstd) they use (*om, *os): src and the row's own statistics,
 * or, for a row taken in float64 (big: see checked_stats), its xhat in buf (buf may be src: same index) with 0 and 1,
 * or, where rstd is 0 (a row with an inf), flat_row's xhat in buf with 0 and 1. The saved statistics stay the row's. */
static inline const float *AN_FN(output_row)(float *buf, const float *src, int64_t n, float mean, float rstd,
                                             const an_big *big, float *om, float *os) {
    if (big) {
        for (int64_t i = 0; i < n; i++) buf[i] = (float)(((double)src[i] - big->mean) * big->rstd);
        *om = 0.0f;
        *os = 1.0f;
        return buf;
    }
    if (rstd != 0.0f) {
        *om = mean;
        *os = rstd;
        return src;
    }
    *om = 0.0f;
    *os = 1.0f;
    return AN_FN(flat_row)(buf, src, n, mean, rstd);
}

/* dst = (src - mean) * rstd * (w + off) + b, each factor optional */
static void AN_FN(normalize)(float *dst, const float *src, int64_t n, float mean, float rstd, const float *restrict w,
                             const float *restrict b, float off) {
    if (w && b) {
        for (int64_t i = 0; i < n; i++) dst[i] = (src[i] - mean) * rstd * (w[i] + off) + b[i];
    } else if (w) {
        for (int64_t i = 0; i < n; i++) dst[i] = (src[i] - mean) * rstd * (w[i] + off);
    } else if (b) {
        for (int64_t i = 0; i < n; i++) dst[i] = (src[i] - mean) * rstd + b[i];
    } else {
        for (int64_t i = 0; i < n; i++) dst[i] = (src[i] - mean) * rstd;
    }
}

/* bfloat16 x + r, rounded to bfloat16 as eager `x + r` stores it; buf gets the float value, res_out
 * (if any) the bits, which are exact (no second rounding); returns the sum of the row. */
static float AN_FN(add_bf16_rows)(float *restrict buf, const uint16_t *restrict x, const uint16_t *restrict r,
                                  uint16_t *restrict res_out, int64_t n) {
    int64_t i = 0;
    for (; i < n; i++) buf[i] = an_bf16_round(an_bf16_to_f32(x[i]) + an_bf16_to_f32(r[i]));
    if (res_out)
        for (i = 0; i < n; i++) res_out[i] = (uint16_t)(an_f32_bits(buf[i]) >> 16);
    return AN_FN(row_sum)(buf, n); /* in blocks (see AN_SUM_BLOCK) */
}

/* ---- bfloat16, specialised: conversions fused into the arithmetic, two or three passes per row ----
 * Absent weight / bias / incoming residual gradient / parameter-gradient accumulators are replaced by
 * rows of ones / zeros / a discarded accumulator, so that each pass is one branch-free loop. The forward takes
 * float16 too (f16: a constant), its conversions in place of bfloat16's: through the general loop (a row
 * converted, added, rounded, summed, normalized and converted back, pass by pass) a float16 LayerNorm forward
 * had trailed eager's (0.70x at 64 x 768, 0.93x at 8192 x 1024, AMD EPYC). */

/* The bfloat16 forwards' first pass: x, or x + r rounded to bfloat16 as eager's `x + r` stores it (with r2: t = r + r2
 * rounded, then x + t rounded), as float32 in buf and, with a residual, its bits in ro. Its sums go to AN_LANES
 * float32 lanes: RMSNorm's squares in one chain per lane into acc (the caller adds the lanes); LayerNorm's v and
 * v^2 in blocks of AN_SUM_BLOCK, whose lanes pair_flush adds into t1, t2 (float64; see layer_moments_1p). */
static inline __attribute__((always_inline)) float AN_FN(bf16_first_value)(const uint16_t *restrict x,
                                                                           const uint16_t *restrict rs,
                                                                           const uint16_t *restrict rs2, int64_t k) {
    const float v = an_bf16_to_f32(x[k]);
    if (rs2) return an_bf16_round_nf(v + an_bf16_round_nf(an_bf16_to_f32(rs[k]) + an_bf16_to_f32(rs2[k])));
    if (rs) return an_bf16_round_nf(v + an_bf16_to_f32(rs[k]));
    return v;
}

/* the values [i, D) after the whole groups of AN_LANES, into lane 0; then the last block's lanes flushed */
static inline __attribute__((always_inline)) void AN_FN(bf16_first_tail)(
    float *restrict buf, uint16_t *restrict ro, const uint16_t *restrict x, const uint16_t *restrict rs,
    const uint16_t *restrict rs2, int64_t i, int64_t D, const int rms, float *restrict acc, float *restrict sq,
    double *restrict t1, double *restrict t2) {
    for (; i < D; i++) {
        const float v = AN_FN(bf16_first_value)(x, rs, rs2, i);
        buf[i] = v;
        if (rs) ro[i] = (uint16_t)(an_f32_bits(v) >> 16);
        acc[0] += rms ? v * v : v;
        sq[0] += v * v;
    }
    AN_FN(pair_flush)(acc, sq, t1, t2, rms);
}

static inline __attribute__((always_inline)) void AN_FN(bf16_first_pass)(float *restrict buf, uint16_t *restrict ro,
                                                                         const uint16_t *restrict x,
                                                                         const uint16_t *restrict rs,
                                                                         const uint16_t *restrict rs2, int64_t D,
                                                                         const int rms, float *restrict acc,
                                                                         double *restrict t1, double *restrict t2) {
    float sq[AN_LANES];
    AN_ZERO(sq);
    int64_t i = 0;
    while (i + AN_LANES <= D) {
        const int64_t e = i + AN_SUM_BLOCK < D ? i + AN_SUM_BLOCK : D;
        for (; i + AN_LANES <= e; i += AN_LANES)
            for (int j = 0; j < AN_LANES; j++) {
                const float v = AN_FN(bf16_first_value)(x, rs, rs2, i + j);
                buf[i + j] = v;
                if (rs) ro[i + j] = (uint16_t)(an_f32_bits(v) >> 16);
                acc[j] += rms ? v * v : v;
                sq[j] += v * v;
            }
        AN_FN(pair_flush)(acc, sq, t1, t2, rms);
    }
    AN_FN(bf16_first_tail)(buf, ro, x, rs, rs2, i, D, rms, acc, sq, t1, t2);
}

/* outputs [i, n) one at a time: (buf - om) os (w + off) + b -- with post (norm-then-add), that rounded to bfloat16
 * and post added -- rounded to bfloat16 (nf: see AN_TO_BF16). The portable loop, and the vector loops' tails. */
static inline __attribute__((always_inline)) void AN_FN(bf16_out_scalar)(uint16_t *restrict dst,
                                                                        const float *restrict buf, int64_t i,
                                                                        int64_t n, float om, float os,
                                                                        const float *restrict w,
                                                                        const float *restrict b, float off,
                                                                        const uint16_t *restrict post, const int nf) {
    for (; i < n; i++) {
        float t = (buf[i] - om) * os;
        AN_KEEP(t); /* the product as written, on every path */
        float v = t * (w[i] + off) + b[i];
        if (post) v = AN_BF16_ROUND(nf, v) + an_bf16_to_f32(post[i]);
        dst[i] = AN_TO_BF16(nf, v);
    }
}

#ifdef AN_AVX512
/* 16 bfloat16 values as float32 */
static inline __attribute__((always_inline)) __m512 AN_FN(bf16x16_load)(const uint16_t *p) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16));
}

/* an_bf16_round_nf, 16 lanes */
static inline __attribute__((always_inline)) __m512 AN_FN(bf16x16_round)(__m512 f) {
    const __m512i u = _mm512_castps_si512(f);
    const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    return _mm512_castsi512_ps(_mm512_and_si512(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), odd),
                                                _mm512_set1_epi32((int)0xffff0000u)));
}

/* bf16_first_pass in AVX-512 registers, its sums' lanes in registers (gcc kept the array loop's in memory, a chain
 * through the store buffer every 32 values), the bits of x + r streamed straight into ro when nt (ro then 64-byte
 * aligned). The same values, lanes and order as bf16_first_pass: the same bits. */
static inline __attribute__((always_inline)) void AN_FN(bf16_first_pass_vec)(
    float *restrict buf, uint16_t *restrict ro, const uint16_t *restrict x, const uint16_t *restrict rs,
    const uint16_t *restrict rs2, int64_t D, const int rms, float *restrict acc, double *restrict t1,
    double *restrict t2, const int nt, const int avx2_order) {
    _Static_assert(AN_LANES == 32, "two 16-lane registers a step");
    (void)avx2_order; /* AVX2's (bf16_perm_n) */
    float sq[AN_LANES];
    AN_ZERO(sq);
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, q0 = a0, q1 = a0;
    const __m512i perm = _mm512_set_epi16(63, 61, 59, 57, 55, 53, 51, 49, 47, 45, 43, 41, 39, 37, 35, 33, 31, 29, 27, 25,
                                          23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1);
    int64_t i = 0;
    while (i + AN_LANES <= D) {
        const int64_t e = i + AN_SUM_BLOCK < D ? i + AN_SUM_BLOCK : D;
        for (; i + AN_LANES <= e; i += AN_LANES) {
            __m512 v0 = AN_FN(bf16x16_load)(x + i), v1 = AN_FN(bf16x16_load)(x + i + 16);
            if (rs) {
                __m512 r0 = AN_FN(bf16x16_load)(rs + i), r1 = AN_FN(bf16x16_load)(rs + i + 16);
                if (rs2) {
                    r0 = AN_FN(bf16x16_round)(_mm512_add_ps(r0, AN_FN(bf16x16_load)(rs2 + i)));
                    r1 = AN_FN(bf16x16_round)(_mm512_add_ps(r1, AN_FN(bf16x16_load)(rs2 + i + 16)));
                }
                v0 = AN_FN(bf16x16_round)(_mm512_add_ps(v0, r0));
                v1 = AN_FN(bf16x16_round)(_mm512_add_ps(v1, r1));
                /* the odd 16-bit halves of v0 then v1: their bfloat16 bits, in order */
                const __m512i bits = _mm512_permutex2var_epi16(_mm512_castps_si512(v0), perm, _mm512_castps_si512(v1));
                if (nt) _mm512_stream_si512((void *)(ro + i), bits);
                else _mm512_storeu_si512((void *)(ro + i), bits);
            }
            _mm512_storeu_ps(buf + i, v0);
            _mm512_storeu_ps(buf + i + 16, v1);
            if (rms) {
                a0 = _mm512_add_ps(a0, _mm512_mul_ps(v0, v0));
                a1 = _mm512_add_ps(a1, _mm512_mul_ps(v1, v1));
            } else {
                a0 = _mm512_add_ps(a0, v0);
                a1 = _mm512_add_ps(a1, v1);
                q0 = _mm512_add_ps(q0, _mm512_mul_ps(v0, v0));
                q1 = _mm512_add_ps(q1, _mm512_mul_ps(v1, v1));
            }
        }
        if (!rms) { /* a block's end */
            _mm512_storeu_ps(acc, a0);
            _mm512_storeu_ps(acc + 16, a1);
            _mm512_storeu_ps(sq, q0);
            _mm512_storeu_ps(sq + 16, q1);
            AN_FN(pair_flush)(acc, sq, t1, t2, 0);
            a0 = a1 = q0 = q1 = _mm512_setzero_ps();
        }
    }
    _mm512_storeu_ps(acc, a0);
    _mm512_storeu_ps(acc + 16, a1);
    AN_FN(bf16_first_tail)(buf, ro, x, rs, rs2, i, D, rms, acc, sq, t1, t2);
}
#endif

#ifdef AN_AVX2
/* The AVX2 path's own first pass and output loop for bfloat16 LayerNorm and RMSNorm, for the reasons of the AVX-512
 * ones (bf16_first_pass_vec): the sums' 32 lanes in four registers each, and the stream's and the outputs' bits
 * streamed straight into their rows (32 bytes a store) where those are 32-byte aligned. The same values, lanes and
 * order as the portable loops: the same bits. */
static inline __attribute__((always_inline)) __m256 AN_FN(bf16x8_load)(const uint16_t *p) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
}

/* an_bf16_round_nf, 8 lanes */
static inline __attribute__((always_inline)) __m256 AN_FN(bf16x8_round)(__m256 f) {
    const __m256i u = _mm256_castps_si256(f);
    const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    return _mm256_castsi256_ps(_mm256_and_si256(_mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), odd),
                                                _mm256_set1_epi32((int)0xffff0000u)));
}

/* an_f32_to_bf16_nf, 8 lanes: each value's bfloat16 bits in the low half of its lane (bf16x16_pack_avx2 packs them;
 * an_bf16_round_nf's mask would go with the shift, so an output that is only stored skips it) */
static inline __attribute__((always_inline)) __m256i AN_FN(bf16x8_bits)(__m256 f) {
    const __m256i u = _mm256_castps_si256(f);
    const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    return _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), odd), 16);
}

/* 16 values' bits from bf16x8_bits (b0 the first 8), in order */
static inline __attribute__((always_inline)) __m256i AN_FN(bf16x16_pack_avx2)(__m256i b0, __m256i b1) {
    return _mm256_permute4x64_epi64(_mm256_packus_epi32(b0, b1), 0xd8); /* packus works within 128-bit lanes */
}

/* the bfloat16 bits of 16 values already rounded (v0 the first 8), in order */
static inline __attribute__((always_inline)) __m256i AN_FN(bf16x16_bits_avx2)(__m256 v0, __m256 v1) {
    const __m256i p = _mm256_packus_epi32(_mm256_srli_epi32(_mm256_castps_si256(v0), 16),
                                          _mm256_srli_epi32(_mm256_castps_si256(v1), 16));
    return _mm256_permute4x64_epi64(p, 0xd8); /* packus works within 128-bit lanes */
}

static inline __attribute__((always_inline)) void AN_FN(bf16x16_put_avx2)(uint16_t *p, __m256i bits, const int nt) {
    if (nt) _mm256_stream_si256((__m256i *)p, bits);
    else _mm256_storeu_si256((__m256i *)p, bits);
}

/* 16 bfloat16 values as float32 in the permuted order (see bf16_perm_n): values 0-3 and 8-11 (hi = 0), or 4-7 and
 * 12-15 (hi = 1) */
static inline __attribute__((always_inline)) __m256 AN_FN(bf16x16_half_p)(__m256i v, const int hi) {
    return _mm256_castsi256_ps(hi ? _mm256_unpackhi_epi16(_mm256_setzero_si256(), v)
                                  : _mm256_unpacklo_epi16(_mm256_setzero_si256(), v));
}

/* 8 of the 16 bfloat16 values at p as float32: the h-th register of the permuted order (perm), or values 8h to 8h + 7
 * in order */
static inline __attribute__((always_inline)) __m256 AN_FN(bf16x8_of16)(const uint16_t *p, const int h,
                                                                      const int perm) {
    if (perm) return AN_FN(bf16x16_half_p)(_mm256_loadu_si256((const __m256i *)p), h);
    return AN_FN(bf16x8_load)(p + 8 * h);
}

/* 16 results' bits (bf16x8_bits of the two registers) in the row's order: vpackusdw alone from the permuted order */
static inline __attribute__((always_inline)) __m256i AN_FN(bf16x16_pack_any)(__m256i b0, __m256i b1, const int perm) {
    return perm ? _mm256_packus_epi32(b0, b1) : AN_FN(bf16x16_pack_avx2)(b0, b1);
}

/* four 8-lane registers: 32 values from p, in order or permuted */
static inline __attribute__((always_inline)) void AN_FN(bf16x32_load4)(__m256 v[4], const uint16_t *p,
                                                                      const int perm) {
    for (int k = 0; k < 4; k++) v[k] = AN_FN(bf16x8_of16)(p + 16 * (k >> 1), k & 1, perm);
}

/* four sums' registers stored in the row's order at p (32 lanes) */
static inline __attribute__((always_inline)) void AN_FN(lanes4_store)(float *p, const __m256 v[4], const int perm) {
    for (int h = 0; h < 2; h++) {
        if (perm) {
            _mm256_storeu_ps(p + 16 * h, _mm256_permute2f128_ps(v[2 * h], v[2 * h + 1], 0x20));
            _mm256_storeu_ps(p + 16 * h + 8, _mm256_permute2f128_ps(v[2 * h], v[2 * h + 1], 0x31));
        } else {
            _mm256_storeu_ps(p + 16 * h, v[2 * h]);
            _mm256_storeu_ps(p + 16 * h + 8, v[2 * h + 1]);
        }
    }
}

/* the bits of 16 rounded values (v0, v1: the first and second 8, or the permuted halves), in the row's order */
static inline __attribute__((always_inline)) __m256i AN_FN(bf16x16_bits_any)(__m256 v0, __m256 v1, const int perm) {
    return AN_FN(bf16x16_pack_any)(_mm256_srli_epi32(_mm256_castps_si256(v0), 16),
                                   _mm256_srli_epi32(_mm256_castps_si256(v1), 16), perm);
}

static inline __attribute__((always_inline)) void AN_FN(bf16_first_pass_vec_k)(
    float *restrict buf, uint16_t *restrict ro, const uint16_t *restrict x, const uint16_t *restrict rs,
    const uint16_t *restrict rs2, int64_t D, const int rms, float *restrict acc, double *restrict t1,
    double *restrict t2, const int nt, const int perm) {
    _Static_assert(AN_LANES == 32, "four 8-lane registers a step");
    float sq[AN_LANES];
    AN_ZERO(sq);
    __m256 a[4], q[4];
    for (int k = 0; k < 4; k++) a[k] = q[k] = _mm256_setzero_ps();
    int64_t i = 0;
    while (i + AN_LANES <= D) {
        const int64_t e = i + AN_SUM_BLOCK < D ? i + AN_SUM_BLOCK : D;
        for (; i + AN_LANES <= e; i += AN_LANES) {
            __m256 v[4], r[4], r2[4];
            AN_FN(bf16x32_load4)(v, x + i, perm);
            if (rs) AN_FN(bf16x32_load4)(r, rs + i, perm);
            if (rs2) AN_FN(bf16x32_load4)(r2, rs2 + i, perm);
            for (int k = 0; k < 4; k++) {
                if (rs) {
                    if (rs2) r[k] = AN_FN(bf16x8_round)(_mm256_add_ps(r[k], r2[k]));
                    v[k] = AN_FN(bf16x8_round)(_mm256_add_ps(v[k], r[k]));
                }
                _mm256_storeu_ps(buf + i + 8 * k, v[k]);
                if (rms) {
                    a[k] = _mm256_add_ps(a[k], _mm256_mul_ps(v[k], v[k]));
                } else {
                    a[k] = _mm256_add_ps(a[k], v[k]);
                    q[k] = _mm256_add_ps(q[k], _mm256_mul_ps(v[k], v[k]));
                    AN_KEEP(q[k]);
                }
                AN_KEEP(a[k]); /* one chain per lane, as the other paths sum: gcc regrouped the one-row loop's */
            }
            if (rs) {
                AN_FN(bf16x16_put_avx2)(ro + i, AN_FN(bf16x16_bits_any)(v[0], v[1], perm), nt);
                AN_FN(bf16x16_put_avx2)(ro + i + 16, AN_FN(bf16x16_bits_any)(v[2], v[3], perm), nt);
            }
        }
        if (!rms) { /* a block's end */
            AN_FN(lanes4_store)(acc, a, perm);
            AN_FN(lanes4_store)(sq, q, perm);
            for (int k = 0; k < 4; k++) a[k] = q[k] = _mm256_setzero_ps();
            AN_FN(pair_flush)(acc, sq, t1, t2, 0);
        }
    }
    AN_FN(lanes4_store)(acc, a, perm);
    AN_FN(bf16_first_tail)(buf, ro, x, rs, rs2, i, D, rms, acc, sq, t1, t2);
}

/* one loop per kind of row (x alone, x + r, x + (r + r2)), each with the registers it needs: one loop for the three,
 * its residual tests inside, kept a sum's register on the stack on AVX2 (16 registers), a chain through the store
 * buffer every 32 values */
static inline __attribute__((always_inline)) void AN_FN(bf16_first_pass_vec)(
    float *restrict buf, uint16_t *restrict ro, const uint16_t *restrict x, const uint16_t *restrict rs,
    const uint16_t *restrict rs2, int64_t D, const int rms, float *restrict acc, double *restrict t1,
    double *restrict t2, const int nt, const int perm) {
#define AN_FP_KINDS(P)                                                                              \
    do {                                                                                            \
        if (!rs) AN_FN(bf16_first_pass_vec_k)(buf, ro, x, NULL, NULL, D, rms, acc, t1, t2, nt, P);  \
        else if (!rs2) AN_FN(bf16_first_pass_vec_k)(buf, ro, x, rs, NULL, D, rms, acc, t1, t2, nt, P); \
        else AN_FN(bf16_first_pass_vec_k)(buf, ro, x, rs, rs2, D, rms, acc, t1, t2, nt, P);        \
    } while (0)
    if (perm) AN_FP_KINDS(1);
    else AN_FP_KINDS(0);
#undef AN_FP_KINDS
}

/* 16 outputs from value i: the permuted order's (perm: buf and post permuted, the weights from pm) or the row's */
static inline __attribute__((always_inline)) void AN_FN(bf16_out_step16)(uint16_t *restrict dst,
                                                                         const float *restrict buf, int64_t i,
                                                                         __m256 vm, __m256 vs, __m256 vo,
                                                                         const float *restrict w,
                                                                         const float *restrict b,
                                                                         const uint16_t *restrict post,
                                                                         const an_bf16_perm *pm, const int nt,
                                                                         const int perm) {
    __m256 o[2];
    for (int h = 0; h < 2; h++) {
        const int64_t k = i + 8 * h;
        __m256 t = _mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(buf + k), vm), vs);
        AN_KEEP(t); /* the product as written (bf16_out_scalar) */
        const __m256 wv = perm ? _mm256_loadu_ps(pm->w + k) : _mm256_add_ps(_mm256_loadu_ps(w + k), vo);
        o[h] = _mm256_add_ps(_mm256_mul_ps(t, wv), _mm256_loadu_ps((perm ? pm->b : b) + k));
        if (post) o[h] = _mm256_add_ps(AN_FN(bf16x8_round)(o[h]), AN_FN(bf16x8_of16)(post + i, h, perm));
    }
    AN_FN(bf16x16_put_avx2)(dst + i, AN_FN(bf16x16_pack_any)(AN_FN(bf16x8_bits)(o[0]), AN_FN(bf16x8_bits)(o[1]), perm),
                            nt);
}

/* n outputs (buf - om) os (w + off) + b (with post: rounded, then post added, as norm-then-add's loop) rounded to
 * bfloat16 without the NaN test (callers: nf only), streamed when nt (dst 32-byte aligned); [0, pm->n) in the
 * permuted order */
static inline __attribute__((always_inline)) void AN_FN(bf16_out_vec_k)(uint16_t *restrict dst,
                                                                        const float *restrict buf, int64_t n,
                                                                        float om, float os, const float *restrict w,
                                                                        const float *restrict b, float off,
                                                                        const uint16_t *restrict post,
                                                                        const an_bf16_perm *pm, const int nt) {
    const __m256 vm = _mm256_set1_ps(om), vs = _mm256_set1_ps(os), vo = _mm256_set1_ps(off);
    int64_t i = 0;
    for (; i + 16 <= pm->n; i += 16) AN_FN(bf16_out_step16)(dst, buf, i, vm, vs, vo, w, b, post, pm, nt, 1);
    for (; i + 16 <= n; i += 16) AN_FN(bf16_out_step16)(dst, buf, i, vm, vs, vo, w, b, post, pm, nt, 0);
    AN_FN(bf16_out_scalar)(dst, buf, i, n, om, os, w, b, off, post, 1);
}

/* one loop with post and one without, each with its registers and no test inside (see bf16_first_pass_vec); pm: the
 * permuted weights from dst's first value on (perm_at) */
static inline __attribute__((always_inline)) void AN_FN(bf16_out_vec)(uint16_t *restrict dst,
                                                                      const float *restrict buf, int64_t n,
                                                                      float om, float os, const float *restrict w,
                                                                      const float *restrict b, float off,
                                                                      const uint16_t *restrict post, const int nf,
                                                                      const an_bf16_perm *pm, const int nt) {
    (void)nf; /* callers: nf only (bf16_vec_out) */
    if (post) AN_FN(bf16_out_vec_k)(dst, buf, n, om, os, w, b, off, post, pm, nt);
    else AN_FN(bf16_out_vec_k)(dst, buf, n, om, os, w, b, off, NULL, pm, nt);
}
#endif

/* float16's first pass: x, or x + r rounded to float16 as eager's `x + r` stores it (its bits in ro), as float32 in
 * buf; returns their sum (RMSNorm: of squares), eight float32 lanes within blocks of AN_SUM_BLOCK, float64 across
 * them. The conversions are F16C's, eight values an instruction (gcc leaves _Float16's scalar in these loops) */
static float AN_FN(f16_first_pass)(float *restrict buf, uint16_t *restrict ro, const uint16_t *restrict x,
                                   const uint16_t *restrict rs, int64_t D, int rms) {
    double total = 0.0;
    int64_t i = 0;
#ifdef AN_F16C
    while (i + 8 <= D) {
        const int64_t end = i + AN_SUM_BLOCK < D ? i + AN_SUM_BLOCK : D;
        __m256 acc = _mm256_setzero_ps();
        for (; i + 8 <= end; i += 8) {
            __m256 v = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(x + i)));
            if (rs) {
                const __m256 t = _mm256_add_ps(v, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(rs + i))));
                const __m128i h = _mm256_cvtps_ph(t, _MM_FROUND_TO_NEAREST_INT);
                _mm_storeu_si128((__m128i *)(ro + i), h);
                v = _mm256_cvtph_ps(h);
            }
            _mm256_storeu_ps(buf + i, v);
            acc = rms ? _mm256_fmadd_ps(v, v, acc) : _mm256_add_ps(acc, v);
        }
        float lanes[8];
        _mm256_storeu_ps(lanes, acc);
        for (int j = 0; j < 8; j++) total += (double)lanes[j];
    }
#endif
    float tail = 0.0f;
    for (; i < D; i++) {
        float v = an_f16_to_f32(x[i]);
        if (rs) {
            const uint16_t h = an_f32_to_f16(v + an_f16_to_f32(rs[i]));
            ro[i] = h;
            v = an_f16_to_f32(h);
        }
        buf[i] = v;
        tail += rms ? v * v : v;
    }
    return (float)(total + (double)tail);
}

/* n <= AN_CHUNK outputs (buf - om) os (w + off) + b, as the bfloat16 loop computes them, stored as float16 */
static void AN_FN(f16_out_chunk)(uint16_t *restrict dst, const float *restrict buf, int64_t n, float om, float os,
                                 const float *restrict w, const float *restrict b, float off) {
    float stage[AN_CHUNK]; /* 2 KiB */
    for (int64_t i = 0; i < n; i++) stage[i] = (buf[i] - om) * os * (w[i] + off) + b[i];
    AN_FN(store_row)(dst, stage, n, AN_F16);
}

#ifdef AN_AVX512
/* vcvtne2ps2bf16: 32 float32 values (lo the first 16) to bfloat16 in order, rounded to nearest even, a NaN made
 * (its top half | 0x40) as an_f32_to_bf16 makes it; but a subnormal input reads as zero (the instruction's DAZ),
 * which bf16_out_vec rules out. Inline assembly: these functions are compiled for AVX-512 alone, and run only
 * where the CPU has AVX512_BF16 (g_bf16_native). */
static inline __attribute__((always_inline)) __m512i AN_FN(cvtne2ps_bf16)(__m512 lo, __m512 hi) {
    __m512i r;
    __asm__("vcvtne2ps2bf16 %2, %1, %0" : "=v"(r) : "v"(hi), "v"(lo));
    return r;
}

/* 32 float32 values (lo the first 16) stored as bfloat16 at p by cvtne2ps_bf16, streamed when nt (p then 64-byte
 * aligned: a whole cache line); a group holding a subnormal value rounded as the portable loops round it
 * (AN_TO_BF16(nf, .)), exact where the instruction reads it as zero. The AVX512_BF16 output loops' one store. */
static inline __attribute__((always_inline)) void AN_FN(bf16x32_put_native)(uint16_t *p, __m512 lo, __m512 hi,
                                                                          const int nf, const int nt) {
    if (__builtin_expect((_mm512_fpclass_ps_mask(lo, 0x20) | _mm512_fpclass_ps_mask(hi, 0x20)) != 0, 0)) {
        float t[32];
        _mm512_storeu_ps(t, lo);
        _mm512_storeu_ps(t + 16, hi);
        for (int j = 0; j < 32; j++) p[j] = AN_TO_BF16(nf, t[j]);
        return;
    }
    if (nt) _mm512_stream_si512((void *)p, AN_FN(cvtne2ps_bf16)(lo, hi));
    else _mm512_storeu_si512((void *)p, AN_FN(cvtne2ps_bf16)(lo, hi));
}

/* the high halves of 32 lanes (lo's 16 first), in order: the bits of 32 values rounded to bfloat16 */
static inline __attribute__((always_inline)) __m512i AN_FN(bf16x32_high_halves)(__m512i lo, __m512i hi) {
    const __m512i perm = _mm512_set_epi16(63, 61, 59, 57, 55, 53, 51, 49, 47, 45, 43, 41, 39, 37, 35, 33, 31, 29, 27,
                                          25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1);
    return _mm512_permutex2var_epi16(lo, perm, hi);
}

/* 32 float32 values (lo the first 16) rounded to bfloat16 by an_f32_to_bf16_nf's integer rounding (no NaN test:
 * callers nf only), their bits in order: each lane's rounded bits land in its high half (no mask needed) */
static inline __attribute__((always_inline)) __m512i AN_FN(bf16x32_bits_nf)(__m512 lo, __m512 hi) {
    __m512i u[2] = {_mm512_castps_si512(lo), _mm512_castps_si512(hi)};
    for (int k = 0; k < 2; k++) {
        const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u[k], 16), _mm512_set1_epi32(1));
        u[k] = _mm512_add_epi32(_mm512_add_epi32(u[k], _mm512_set1_epi32(0x7fff)), odd);
    }
    return AN_FN(bf16x32_high_halves)(u[0], u[1]);
}

/* The AVX-512 output loops' one store: 32 float32 values (lo the first 16) stored as bfloat16 at p, streamed when
 * nt (p then 64-byte aligned). AVX512_BF16's conversion where the CPU has it (bf16x32_put_native); elsewhere (an
 * AVX-512 CPU without it: Skylake-SP to Ice Lake) the integer rounding without the NaN test, as AVX2's loops round:
 * bf16_vec_out then sends only nf calls here. Without this, those CPUs took the portable loops, whose product held
 * in the order as written (AN_KEEP) gcc does not vectorize: 3-7 times AVX2's time a row. */
static inline __attribute__((always_inline)) void AN_FN(bf16x32_put)(uint16_t *p, __m512 lo, __m512 hi, const int nf,
                                                                   const int nt) {
    if (g_bf16_native) {
        AN_FN(bf16x32_put_native)(p, lo, hi, nf, nt);
        return;
    }
    const __m512i bits = AN_FN(bf16x32_bits_nf)(lo, hi);
    if (nt) _mm512_stream_si512((void *)p, bits);
    else _mm512_storeu_si512((void *)p, bits);
}

/* n outputs (buf - om) os (w + off) + b stored as bfloat16 in dst, 32 a conversion instruction, with streaming
 * stores when nt (dst then 64-byte aligned: each 32 a whole cache line). With post (norm-then-add; nf only), each
 * output rounded to bfloat16 first and post added, as the portable loop does. A group of 32 holding a subnormal
 * value is rounded as the portable loop rounds it (exact where the instruction is not); nf as there (AN_TO_BF16). */
static inline __attribute__((always_inline)) void AN_FN(bf16_out_vec)(uint16_t *restrict dst,
                                                                        const float *restrict buf, int64_t n,
                                                                        float om, float os,
                                                                        const float *restrict w,
                                                                        const float *restrict b, float off,
                                                                        const uint16_t *restrict post,
                                                                        const int nf, const an_bf16_perm *pm,
                                                                        const int nt) {
    (void)pm; /* AVX2's (bf16_perm_n) */
    const __m512 vm = _mm512_set1_ps(om), vs = _mm512_set1_ps(os), vo = _mm512_set1_ps(off);
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        __m512 tl = _mm512_mul_ps(_mm512_sub_ps(_mm512_loadu_ps(buf + i), vm), vs),
               th = _mm512_mul_ps(_mm512_sub_ps(_mm512_loadu_ps(buf + i + 16), vm), vs);
        AN_KEEP(tl); /* the product as written (bf16_out_scalar) */
        AN_KEEP(th);
        __m512 lo = _mm512_add_ps(_mm512_mul_ps(tl, _mm512_add_ps(_mm512_loadu_ps(w + i), vo)), _mm512_loadu_ps(b + i));
        __m512 hi = _mm512_add_ps(_mm512_mul_ps(th, _mm512_add_ps(_mm512_loadu_ps(w + i + 16), vo)),
                                  _mm512_loadu_ps(b + i + 16));
        if (post) {
            lo = _mm512_add_ps(AN_FN(bf16x16_round)(lo), AN_FN(bf16x16_load)(post + i));
            hi = _mm512_add_ps(AN_FN(bf16x16_round)(hi), AN_FN(bf16x16_load)(post + i + 16));
        }
        AN_FN(bf16x32_put)(dst + i, lo, hi, nf, nt);
    }
    AN_FN(bf16_out_scalar)(dst, buf, i, n, om, os, w, b, off, post, nf);
}
#endif

/* The vector loops of the bfloat16 norms (the *_vec functions) come in each instruction set's own form: AVX-512's
 * (AVX512_BF16's conversion where the CPU has it, else AVX2's rounding: nf only), AVX2's (which rounds without the
 * NaN test: nf only), and for the baseline build the portable loops under the same names. bf16_vec_out: whether a call's outputs take the vector
 * output loop; stream_direct: whether a row takes that loop's streaming stores itself (nt, the row aligned to a whole
 * store), not a scratch row copied out after. */
static inline int AN_FN(bf16_vec_out)(const int nf) {
#if defined(AN_AVX512)
    return g_bf16_native || nf; /* bf16x32_put */
#elif defined(AN_AVX2)
    return nf;
#else
    (void)nf;
    return 0;
#endif
}

static inline int AN_FN(stream_direct)(const void *row, int nt) {
#if defined(AN_AVX512) || defined(AN_AVX2)
    return nt && ((uintptr_t)row & (AN_STREAM_BYTES - 1)) == 0;
#else
    (void)row;
    (void)nt;
    return 0;
#endif
}

#if !defined(AN_AVX512) && !defined(AN_AVX2)
static inline __attribute__((always_inline)) void AN_FN(bf16_first_pass_vec)(
    float *restrict buf, uint16_t *restrict ro, const uint16_t *restrict x, const uint16_t *restrict rs,
    const uint16_t *restrict rs2, int64_t D, const int rms, float *restrict acc, double *restrict t1,
    double *restrict t2, const int nt, const int perm) {
    (void)nt;
    (void)perm;
    AN_FN(bf16_first_pass)(buf, ro, x, rs, rs2, D, rms, acc, t1, t2);
}

static inline __attribute__((always_inline)) void AN_FN(bf16_out_vec)(uint16_t *restrict dst, const float *restrict buf,
                                                                     int64_t n, float om, float os,
                                                                     const float *restrict w, const float *restrict b,
                                                                     float off, const uint16_t *restrict post,
                                                                     const int nf, const an_bf16_perm *pm,
                                                                     const int nt) {
    (void)nt;
    (void)pm;
    AN_FN(bf16_out_scalar)(dst, buf, 0, n, om, os, w, b, off, post, nf);
}
#endif

static inline __attribute__((always_inline)) void AN_FN(fwd_rows_bf16_body)(const an_fwd_args *a, int64_t r0,
                                                                              int64_t r1, const an_rows *sc,
                                                                              const int nf, const int rms,
                                                                              const int f16) {
    const int64_t D = a->D;
    const float inv_d = 1.0f / (float)D;
    float *restrict buf = sc->r[0];
    uint16_t *restrict o16 = (uint16_t *)sc->r[1], *restrict res16 = (uint16_t *)sc->r[2];
    const float *restrict w = a->weight ? a->weight : AN_ONES(sc);
    const float *restrict b = a->bias ? a->bias : AN_NZEROS(sc);
    const float off = a->weight ? a->weight_offset : 0.0f;
    /* AVX2: the first pass's row and the output loop's weights in the loops' order (bf16_perm_n) */
    const int64_t pn = f16 ? 0 : AN_FN(bf16_perm_n)(D, nf);
    const an_bf16_perm pm = AN_FN(bf16_perm_prep)(sc->r[3], sc->r[4], w, b, off, pn);
    for (int64_t r = r0; r < r1; r++) {
        const uint16_t *restrict x = (const uint16_t *)a->x + r * a->x_rs;
        uint16_t *out_row = (uint16_t *)a->out + r * a->out_rs;
        float acc[AN_LANES];
        AN_ZERO(acc);
        double t1[AN_LANES], t2[AN_LANES]; /* LayerNorm's sums of v and v^2 (bf16_first_pass) */
        AN_ZERO(t1); AN_ZERO(t2);
        const uint16_t *restrict rs = a->res ? (const uint16_t *)a->res + r * a->res_rs : NULL;
        uint16_t *res_row = (rs && a->res_out) ? (uint16_t *)a->res_out + r * a->res_out_rs : NULL;
        const int res_direct = !f16 && res_row && AN_FN(stream_direct)(res_row, a->nt); /* streamed in the pass */
        uint16_t *restrict ro = (res_row && (!a->nt || res_direct)) ? res_row : res16;
        if (f16) {
            acc[0] = AN_FN(f16_first_pass)(buf, ro, x, rs, D, rms);
        } else {
            AN_FN(bf16_first_pass_vec)(buf, ro, x, rs, NULL, D, rms, acc, t1, t2, res_direct, pn != 0);
        }
        if (res_row && a->nt && !res_direct) AN_FN(stream_bytes)(res_row, res16, (size_t)D * 2);
        /* RMSNorm's sum of squares in one float32 chain per lane, not in blocks: blocking it cost the bfloat16
         * forwards 7-18 % (caches flushed, 8192 x 1024), and a bfloat16 output rounds away its error (D = 65536
         * with a channel at 300: the same bits as eager's); float16's, three more bits, in blocks (f16_first_pass).
         * LayerNorm's sums in blocks, whose statistics layer_moments_1p takes (float16: layer_moments) */
        float mean = 0.0f;
        const float first = AN_FN(hsum)(acc);
        float rstd = an_rstd((rms ? first * inv_d
                              : f16 ? AN_FN(layer_moments)(buf, D, first, &mean) / (float)D
                                    : AN_FN(layer_moments_1p)(buf, D, t1, t2, &mean, pn) / (float)D), a->eps);
        an_big bs;
        const an_big *big = AN_FN(checked_stats_p)(buf, D, rms, a->eps, &bs, &mean, &rstd, pn);
        if (a->mean) a->mean[r] = mean;
        if (a->rstd) a->rstd[r] = rstd;
        float om, os; /* the output's statistics (see output_row) */
        AN_FN(output_row)(buf, buf, D, mean, rstd, big, &om, &os);
        const int vec = !f16 && AN_FN(bf16_vec_out)(nf);
        /* streamed stores straight into the row, a line at a time among the arithmetic (not a burst after it) */
        const int direct = vec && AN_FN(stream_direct)(out_row, a->nt);
        uint16_t *restrict dst = (a->nt && !direct) ? o16 : out_row;
        const uint16_t *nx = r + 1 < r1 ? x + a->x_rs : NULL;
        const uint16_t *nr = (r + 1 < r1 && a->res) ? (const uint16_t *)a->res + (r + 1) * a->res_rs : NULL;
        for (int64_t c0 = 0; c0 < D; c0 += AN_CHUNK) {
            /* wide rows: fetch the next row while this one is written, or the bus idles meanwhile */
            AN_FN(prefetch_chunk)(nx, nr, NULL, c0, D, 2);
            const int64_t c1 = c0 + AN_CHUNK < D ? c0 + AN_CHUNK : D;
            if (f16) {
                AN_FN(f16_out_chunk)(dst + c0, buf + c0, c1 - c0, om, os, w + c0, b + c0, off);
                continue;
            }
            const an_bf16_perm pc = AN_FN(perm_at)(&pm, c0, c1 - c0);
            if (vec) AN_FN(bf16_out_vec)(dst + c0, buf + c0, c1 - c0, om, os, w + c0, b + c0, off, NULL, nf, &pc, direct);
            else AN_FN(bf16_out_scalar)(dst, buf, c0, c1, om, os, w, b, off, NULL, nf);
        }
        if (a->nt && !direct) AN_FN(stream_bytes)(out_row, o16, (size_t)D * 2);
    }
}

/* x + r is rounded without the NaN test always (both are bfloat16: see an_f32_to_bf16_nf); the output too when
 * the float32 operands (weight, bias, weight_offset, eps) hold no NaN that would need it */
static void AN_FN(fwd_rows_bf16)(const an_fwd_args *a, int64_t r0, int64_t r1, const an_rows *sc) {
    const int nf = an_nan_safe(a->weight, a->D) && an_nan_safe(a->bias, a->D) &&
                   an_scalar_nan_safe(a->weight_offset) && an_scalar_nan_safe(a->eps);
    if (a->kind == AN_RMS) {
        if (nf) AN_FN(fwd_rows_bf16_body)(a, r0, r1, sc, 1, 1, 0);
        else AN_FN(fwd_rows_bf16_body)(a, r0, r1, sc, 0, 1, 0);
    } else {
        if (nf) AN_FN(fwd_rows_bf16_body)(a, r0, r1, sc, 1, 0, 0);
        else AN_FN(fwd_rows_bf16_body)(a, r0, r1, sc, 0, 0, 0);
    }
}

/* float16 throughout: the same loop with float16's first pass and stores (whose conversions keep a NaN a NaN) */
static void AN_FN(fwd_rows_f16)(const an_fwd_args *a, int64_t r0, int64_t r1, const an_rows *sc) {
    if (a->kind == AN_RMS) AN_FN(fwd_rows_bf16_body)(a, r0, r1, sc, 0, 1, 1);
    else AN_FN(fwd_rows_bf16_body)(a, r0, r1, sc, 0, 0, 1);
}

/* Compiled per (nf, rms, want_db): RMSNorm (mean 0) takes no sum of g and no mean subtractions, and a call
 * without a bias gradient no db pass -- the same values, bit for bit, as the general form (s - 0 and
 * x - 0 are exact) with fewer operations per element. The weight plus offset is formed once per block, here:
 * formed once per chunk by the caller instead, the loops below read it 5x slower (gcc no longer vectorized them). */
/* The bfloat16 backward's second pass over [i, c1) one value at a time: dw += dy xhat, db += dy (want_db), dx = rstd
 * (dy (w + off) - mean(g) - xhat mean(g xhat)) + dres rounded to bfloat16 (nf: see AN_TO_BF16). The portable loop,
 * and the vector loops' tails. */
static inline __attribute__((always_inline)) void AN_FN(bf16_bwd_out_scalar)(
    uint16_t *restrict dx, float *restrict dw, float *restrict db, const uint16_t *restrict s,
    const uint16_t *restrict dy, const uint16_t *restrict dres, const float *restrict wo, int64_t i, int64_t c1,
    float mean, float rstd, float mg, float mgx, const int rms, const int want_db, const int nf) {
    for (; i < c1; i++) {
        float d = an_bf16_to_f32(dy[i]);
        float xh = (rms ? an_bf16_to_f32(s[i]) : an_bf16_to_f32(s[i]) - mean) * rstd;
        dw[i] += d * xh;
        if (want_db) db[i] += d;
        /* the gradient arriving through the new residual stream joins in float32 */
        float t = rms ? d * wo[i] : d * wo[i] - mg;
        AN_KEEP(t); /* the order as written, on every path (see AN_KEEP) */
        const float gv = t - xh * mgx;
        dx[i] = AN_TO_BF16(nf, rstd * gv + an_bf16_to_f32(dres[i]));
    }
}

#ifdef AN_AVX512
/* The bfloat16 backward's first pass in AVX-512 registers (the array loop's lanes lived in memory): the lanes of
 * sum g and sum g xhat, g = dy (w + off), into acc_g and acc_gx, lane j taking elements j, j + 32, ... as the array
 * loop does (the same bits). Whole groups of 32; the caller takes the tail. Returns where it stopped. */
static inline __attribute__((always_inline)) int64_t AN_FN(bf16_bwd_sums_vec)(
    const uint16_t *restrict s, const uint16_t *restrict dy, const float *restrict wo, int64_t D, float mean,
    float rstd, const int rms, float *restrict acc_g, float *restrict acc_gx, const int64_t pn) {
    (void)pn; /* AVX2's (bf16_perm_n) */
    const __m512 vm = _mm512_set1_ps(mean), vr = _mm512_set1_ps(rstd);
    __m512 g0 = _mm512_setzero_ps(), g1 = g0, x0 = g0, x1 = g0;
    int64_t i = 0;
    for (; i + 32 <= D; i += 32) {
        __m512 s0 = AN_FN(bf16x16_load)(s + i), s1 = AN_FN(bf16x16_load)(s + i + 16);
        if (!rms) {
            s0 = _mm512_sub_ps(s0, vm);
            s1 = _mm512_sub_ps(s1, vm);
        }
        const __m512 xh0 = _mm512_mul_ps(s0, vr), xh1 = _mm512_mul_ps(s1, vr);
        const __m512 d0 = _mm512_mul_ps(AN_FN(bf16x16_load)(dy + i), _mm512_loadu_ps(wo + i));
        const __m512 d1 = _mm512_mul_ps(AN_FN(bf16x16_load)(dy + i + 16), _mm512_loadu_ps(wo + i + 16));
        if (!rms) {
            g0 = _mm512_add_ps(g0, d0);
            g1 = _mm512_add_ps(g1, d1);
        }
        x0 = _mm512_add_ps(x0, _mm512_mul_ps(d0, xh0));
        x1 = _mm512_add_ps(x1, _mm512_mul_ps(d1, xh1));
    }
    _mm512_storeu_ps(acc_g, g0);
    _mm512_storeu_ps(acc_g + 16, g1);
    _mm512_storeu_ps(acc_gx, x0);
    _mm512_storeu_ps(acc_gx + 16, x1);
    return i;
}

/* The bfloat16 backward's second pass over [c0, c1) with AVX512_BF16's conversion (see bf16_out_vec): dw += dy
 * xhat, db += dy (want_db), dx = rstd (dy (w + off) - mean(g) - xhat mean(g xhat)) + dres, streamed when nt (dx then
 * 64-byte aligned). A group of 32 holding a subnormal dx is rounded by the portable rounding. */
static inline __attribute__((always_inline)) void AN_FN(bf16_bwd_out_vec)(
    uint16_t *restrict dx, float *restrict dw, float *restrict db, const uint16_t *restrict s,
    const uint16_t *restrict dy, const uint16_t *restrict dres, const float *restrict wo, int64_t c0, int64_t c1,
    float mean, float rstd, float mg, float mgx, const int rms, const int want_db, const int nf, const int64_t pn,
    const int nt) {
    (void)pn; /* AVX2's (bf16_perm_n) */
    const __m512 vm = _mm512_set1_ps(mean), vr = _mm512_set1_ps(rstd), vmg = _mm512_set1_ps(mg),
                 vmx = _mm512_set1_ps(mgx);
    int64_t i = c0;
    for (; i + 32 <= c1; i += 32) {
        __m512 o[2];
        for (int h = 0; h < 2; h++) {
            const int64_t k = i + 16 * h;
            const __m512 d = AN_FN(bf16x16_load)(dy + k);
            __m512 sv = AN_FN(bf16x16_load)(s + k);
            if (!rms) sv = _mm512_sub_ps(sv, vm);
            const __m512 xh = _mm512_mul_ps(sv, vr);
            _mm512_storeu_ps(dw + k, _mm512_add_ps(_mm512_loadu_ps(dw + k), _mm512_mul_ps(d, xh)));
            if (want_db) _mm512_storeu_ps(db + k, _mm512_add_ps(_mm512_loadu_ps(db + k), d));
            __m512 gv = _mm512_mul_ps(d, _mm512_loadu_ps(wo + k));
            if (!rms) gv = _mm512_sub_ps(gv, vmg);
            AN_KEEP(gv); /* the order as written (bf16_bwd_out_scalar) */
            gv = _mm512_sub_ps(gv, _mm512_mul_ps(xh, vmx));
            o[h] = _mm512_add_ps(_mm512_mul_ps(vr, gv), AN_FN(bf16x16_load)(dres + k));
        }
        AN_FN(bf16x32_put)(dx + i, o[0], o[1], nf, nt);
    }
    AN_FN(bf16_bwd_out_scalar)(dx, dw, db, s, dy, dres, wo, i, c1, mean, rstd, mg, mgx, rms, want_db, nf);
}
#endif

#ifdef AN_AVX2
/* bf16_bwd_sums_vec's AVX2 form: the 32 lanes of sum g and sum g xhat in four registers each (the same bits). perm:
 * over the whole steps of 32, s and dy widened by one unpack each 16 and wo read in the permuted order (see
 * bf16_perm_n); the lanes put back in order at the end */
static inline __attribute__((always_inline)) int64_t AN_FN(bf16_bwd_sums_vec_k)(
    const uint16_t *restrict s, const uint16_t *restrict dy, const float *restrict wo, int64_t D, float mean,
    float rstd, const int rms, float *restrict acc_g, float *restrict acc_gx, const int perm) {
    const __m256 vm = _mm256_set1_ps(mean), vr = _mm256_set1_ps(rstd);
    __m256 g[4], x[4];
    for (int k = 0; k < 4; k++) g[k] = x[k] = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 32 <= D; i += 32)
        for (int hh = 0; hh < 2; hh++) {
            const int64_t k16 = i + 16 * hh;
            for (int h2 = 0; h2 < 2; h2++) {
                const int k = 2 * hh + h2;
                const int64_t e = k16 + 8 * h2;
                __m256 sv = AN_FN(bf16x8_of16)(s + k16, h2, perm);
                if (!rms) sv = _mm256_sub_ps(sv, vm);
                const __m256 xh = _mm256_mul_ps(sv, vr);
                const __m256 d = _mm256_mul_ps(AN_FN(bf16x8_of16)(dy + k16, h2, perm), _mm256_loadu_ps(wo + e));
                if (!rms) g[k] = _mm256_add_ps(g[k], d);
                x[k] = _mm256_add_ps(x[k], _mm256_mul_ps(d, xh));
                AN_KEEP(g[k]); /* one chain per lane, as the other paths sum */
                AN_KEEP(x[k]);
            }
        }
    AN_FN(lanes4_store)(acc_g, g, perm);
    AN_FN(lanes4_store)(acc_gx, x, perm);
    return i;
}

static inline __attribute__((always_inline)) int64_t AN_FN(bf16_bwd_sums_vec)(
    const uint16_t *restrict s, const uint16_t *restrict dy, const float *restrict wo, int64_t D, float mean,
    float rstd, const int rms, float *restrict acc_g, float *restrict acc_gx, const int64_t pn) {
    if (pn) return AN_FN(bf16_bwd_sums_vec_k)(s, dy, wo, D, mean, rstd, rms, acc_g, acc_gx, 1);
    return AN_FN(bf16_bwd_sums_vec_k)(s, dy, wo, D, mean, rstd, rms, acc_g, acc_gx, 0);
}

/* 16 values of dx from value i, dw and db summed: the permuted order's (perm: wo, dw and db held so) or the row's */
static inline __attribute__((always_inline)) void AN_FN(bf16_bwd_step16)(
    uint16_t *restrict dx, float *restrict dw, float *restrict db, const uint16_t *restrict s,
    const uint16_t *restrict dy, const uint16_t *restrict dres, const float *restrict wo, int64_t i, __m256 vm,
    __m256 vr, __m256 vmg, __m256 vmx, const int rms, const int want_db, const int nt, const int perm) {
    __m256 o[2];
    for (int h = 0; h < 2; h++) {
        const int64_t k = i + 8 * h;
        const __m256 d = AN_FN(bf16x8_of16)(dy + i, h, perm);
        __m256 sv = AN_FN(bf16x8_of16)(s + i, h, perm);
        if (!rms) sv = _mm256_sub_ps(sv, vm);
        const __m256 xh = _mm256_mul_ps(sv, vr);
        _mm256_storeu_ps(dw + k, _mm256_add_ps(_mm256_loadu_ps(dw + k), _mm256_mul_ps(d, xh)));
        if (want_db) _mm256_storeu_ps(db + k, _mm256_add_ps(_mm256_loadu_ps(db + k), d));
        __m256 gv = _mm256_mul_ps(d, _mm256_loadu_ps(wo + k));
        if (!rms) gv = _mm256_sub_ps(gv, vmg);
        AN_KEEP(gv); /* the order as written (bf16_bwd_out_scalar) */
        gv = _mm256_sub_ps(gv, _mm256_mul_ps(xh, vmx));
        o[h] = _mm256_add_ps(_mm256_mul_ps(vr, gv), AN_FN(bf16x8_of16)(dres + i, h, perm));
    }
    AN_FN(bf16x16_put_avx2)(dx + i, AN_FN(bf16x16_pack_any)(AN_FN(bf16x8_bits)(o[0]), AN_FN(bf16x8_bits)(o[1]), perm),
                            nt);
}

/* bf16_bwd_out_vec's AVX2 form, rounding without the NaN test (callers: nf only), streamed when nt (dx 32-byte
 * aligned); [c0, pn) in the permuted order */
static inline __attribute__((always_inline)) void AN_FN(bf16_bwd_out_vec)(
    uint16_t *restrict dx, float *restrict dw, float *restrict db, const uint16_t *restrict s,
    const uint16_t *restrict dy, const uint16_t *restrict dres, const float *restrict wo, int64_t c0, int64_t c1,
    float mean, float rstd, float mg, float mgx, const int rms, const int want_db, const int nf, const int64_t pn,
    const int nt) {
    (void)nf; /* callers: nf only (bf16_vec_out) */
    const __m256 vm = _mm256_set1_ps(mean), vr = _mm256_set1_ps(rstd), vmg = _mm256_set1_ps(mg),
                 vmx = _mm256_set1_ps(mgx);
    int64_t i = c0;
    const int64_t pe = pn < c1 ? pn : c1;
    for (; i + 16 <= pe; i += 16)
        AN_FN(bf16_bwd_step16)(dx, dw, db, s, dy, dres, wo, i, vm, vr, vmg, vmx, rms, want_db, nt, 1);
    for (; i + 16 <= c1; i += 16)
        AN_FN(bf16_bwd_step16)(dx, dw, db, s, dy, dres, wo, i, vm, vr, vmg, vmx, rms, want_db, nt, 0);
    AN_FN(bf16_bwd_out_scalar)(dx, dw, db, s, dy, dres, wo, i, c1, mean, rstd, mg, mgx, rms, want_db, 1);
}
#endif

#if !defined(AN_AVX512) && !defined(AN_AVX2)
/* the baseline build's stand-ins (see bf16_vec_out): no whole groups summed ahead; the portable second pass */
static inline __attribute__((always_inline)) int64_t AN_FN(bf16_bwd_sums_vec)(
    const uint16_t *restrict s, const uint16_t *restrict dy, const float *restrict wo, int64_t D, float mean,
    float rstd, const int rms, float *restrict acc_g, float *restrict acc_gx, const int64_t pn) {
    (void)s, (void)dy, (void)wo, (void)D, (void)mean, (void)rstd, (void)rms, (void)acc_g, (void)acc_gx, (void)pn;
    return 0;
}

static inline __attribute__((always_inline)) void AN_FN(bf16_bwd_out_vec)(
    uint16_t *restrict dx, float *restrict dw, float *restrict db, const uint16_t *restrict s,
    const uint16_t *restrict dy, const uint16_t *restrict dres, const float *restrict wo, int64_t c0, int64_t c1,
    float mean, float rstd, float mg, float mgx, const int rms, const int want_db, const int nf, const int64_t pn,
    const int nt) {
    (void)nt;
    (void)pn;
    AN_FN(bf16_bwd_out_scalar)(dx, dw, db, s, dy, dres, wo, c0, c1, mean, rstd, mg, mgx, rms, want_db, nf);
}
#endif

static inline __attribute__((always_inline)) void AN_FN(bwd_rows_bf16_body)(const an_bwd_args *a, int64_t r0,
                                                                              int64_t r1, const an_rows *sc,
                                                                              float *dw_acc, float *db_acc,
                                                                              const int nf, const int rms,
                                                                              const int want_db) {
    const int64_t D = a->D;
    const float inv_d = 1.0f / (float)D;
    uint16_t *restrict o16 = (uint16_t *)sc->r[2];
    float *restrict dw = dw_acc ? dw_acc : sc->r[3];
    float *restrict db = db_acc;
    float *restrict wo = sc->r[5];
    if (a->weight) {
        const float *restrict w = a->weight;
        const float off = a->weight_offset;
        for (int64_t i = 0; i < D; i++) wo[i] = w[i] + off;
    } else {
        for (int64_t i = 0; i < D; i++) wo[i] = 1.0f;
    }
    /* AVX2: the rows' values in the forwards' permuted order over [0, pn) (bf16_perm_n): wo permuted, dw and db held
     * so in between (back in order at the end, and around the slow path below) */
    const int64_t pn = AN_FN(bf16_perm_n)(D, nf);
    AN_FN(perm_quads)(wo, pn);
    AN_FN(perm_quads)(dw, pn);
    if (want_db) AN_FN(perm_quads)(db, pn);
    const uint16_t *zeros16 = (const uint16_t *)AN_ZEROS(sc);
    for (int64_t r = r0; r < r1; r++) {
        const uint16_t *restrict s = (const uint16_t *)a->s + r * a->s_rs;
        const uint16_t *restrict dy = (const uint16_t *)a->dy + r * a->dy_rs;
        const uint16_t *restrict dres = a->dres ? (const uint16_t *)a->dres + r * a->dres_rs : zeros16;
        uint16_t *dx_row = (uint16_t *)a->dx + r * a->dx_rs;
        const float mean = (!rms && a->mean) ? a->mean[r] : 0.0f, rstd = a->rstd[r];
        if (!(rstd >= AN_TINY_RSTD)) { /* beyond float32's range: in float64 (see bwd_row_big), from rows 0, 1, 4 */
            float *fs = sc->r[0], *fdy = sc->r[1], *fo = sc->r[4];
            AN_FN(load_row)(fs, s, D, AN_BF16);
            AN_FN(load_row)(fdy, dy, D, AN_BF16);
            AN_FN(load_row)(fo, dres, D, AN_BF16);
            AN_FN(perm_quads)(wo, pn); /* in order for the slow path, whatever it finds */
            AN_FN(perm_quads)(dw, pn);
            if (want_db) AN_FN(perm_quads)(db, pn);
            const int done = AN_FN(bwd_row_big)(fs, fdy, NULL, fo, wo, 0.0f, NULL, 0.0f, rms, D, dw,
                                                want_db ? db : NULL, NULL, NULL, fo);
            AN_FN(perm_quads)(wo, pn);
            AN_FN(perm_quads)(dw, pn);
            if (want_db) AN_FN(perm_quads)(db, pn);
            if (done) {
                AN_FN(put_row)(dx_row, fo, D, AN_BF16, a->nt, fs);
                continue;
            }
        }
        /* pass 1 only reduces; pass 2 re-reads the (now L1-resident) bfloat16 rows: fewer stores */
        float acc_g[AN_LANES], acc_gx[AN_LANES];
        AN_ZERO(acc_g); AN_ZERO(acc_gx);
        int64_t i = AN_FN(bf16_bwd_sums_vec)(s, dy, wo, D, mean, rstd, rms, acc_g, acc_gx, pn);
        for (; i + AN_LANES <= D; i += AN_LANES)
            for (int j = 0; j < AN_LANES; j++) {
                float xh = (rms ? an_bf16_to_f32(s[i + j]) : an_bf16_to_f32(s[i + j]) - mean) * rstd;
                float g = an_bf16_to_f32(dy[i + j]) * wo[i + j];
                if (!rms) acc_g[j] += g;
                acc_gx[j] += g * xh;
            }
        for (; i < D; i++) {
            float xh = (rms ? an_bf16_to_f32(s[i]) : an_bf16_to_f32(s[i]) - mean) * rstd;
            float g = an_bf16_to_f32(dy[i]) * wo[i];
            if (!rms) acc_g[0] += g;
            acc_gx[0] += g * xh;
        }
        const float mg = rms ? 0.0f : AN_FN(hsum)(acc_g) * inv_d;
        const float mgx = AN_FN(hsum)(acc_gx) * inv_d;
        const int vec = AN_FN(bf16_vec_out)(nf);
        const int direct = vec && AN_FN(stream_direct)(dx_row, a->nt); /* streamed in the pass */
        uint16_t *restrict dst = (a->nt && !direct) ? o16 : dx_row;
        const int more = r + 1 < r1;
        for (int64_t c0 = 0; c0 < D; c0 += AN_CHUNK) {
            AN_FN(prefetch_chunk)(more ? s + a->s_rs : NULL, more ? dy + a->dy_rs : NULL,
                                  (more && a->dres) ? dres + a->dres_rs : NULL, c0, D, 2);
            const int64_t c1 = c0 + AN_CHUNK < D ? c0 + AN_CHUNK : D;
            if (vec)
                AN_FN(bf16_bwd_out_vec)(dst, dw, db, s, dy, dres, wo, c0, c1, mean, rstd, mg, mgx, rms, want_db, nf,
                                        pn, direct);
            else
                AN_FN(bf16_bwd_out_scalar)(dst, dw, db, s, dy, dres, wo, c0, c1, mean, rstd, mg, mgx, rms, want_db, nf);
        }
        if (a->nt && !direct) AN_FN(stream_bytes)(dx_row, o16, (size_t)D * 2);
    }
    AN_FN(perm_quads)(dw, pn); /* the sums back in order */
    if (want_db) AN_FN(perm_quads)(db, pn);
}

/* nf: bwd_rows' verdict on the chunk (dx rounded without the NaN test when no float32 operand needs it) */
static void AN_FN(bwd_rows_bf16)(const an_bwd_args *a, int64_t r0, int64_t r1, const an_rows *sc, float *dw_acc,
                                 float *db_acc, const int nf) {
    const int rms = a->kind == AN_RMS, db = db_acc != NULL;
#define AN_BWD_CASE(NF, RMS, DB) \
    if (nf == NF && rms == RMS && db == DB) AN_FN(bwd_rows_bf16_body)(a, r0, r1, sc, dw_acc, db_acc, NF, RMS, DB);
    AN_BWD_CASE(1, 0, 1) else AN_BWD_CASE(1, 0, 0) else AN_BWD_CASE(1, 1, 1) else AN_BWD_CASE(1, 1, 0)
    else AN_BWD_CASE(0, 0, 1) else AN_BWD_CASE(0, 0, 0) else AN_BWD_CASE(0, 1, 1) else AN_BWD_CASE(0, 1, 0)
#undef AN_BWD_CASE
}

/* dst = rstd * (dy * (w + off) - mg - xh * mgx) + dres with xh = (s - mean) * rstd; accumulates dw, db.
 * A function of its own so that every pointer is a restrict parameter and the loop vectorizes. */
static void AN_FN(bwd_out_f32)(float *restrict dst, float *restrict dw, float *restrict db, const float *restrict s,
                               const float *restrict dy, const float *restrict dres, const float *restrict w,
                               float off, float mean, float rstd, float mg, float mgx, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        float d = dy[i], xh = (s[i] - mean) * rstd;
        dw[i] += d * xh;
        db[i] += d;
        dst[i] = rstd * (d * (w[i] + off) - mg - xh * mgx) + dres[i];
    }
}

/* ---- float32 backward, specialised like the bfloat16 one: two passes, inputs read where they lie ---- */
/* One row's backward from float32 rows (the storage itself for float32, converted rows for float16):
 * pass 1 reduces sum(g) and sum(g * xhat), pass 2 writes dst and accumulates dw, db. nxt_*: the next
 * row's storage (element size es), prefetched chunk by chunk while this one is written. */
static void AN_FN(bwd_row_f32)(const an_bwd_args *a, const float *restrict s, const float *restrict dy,
                               const float *restrict dres, const float *restrict w, float off, float mean, float rstd,
                               float *restrict dw, float *restrict db, float *restrict dst, float *stream_to,
                               const void *nxt_s, const void *nxt_dy, const void *nxt_dres, int es) {
    const int64_t D = a->D;
    const float inv_d = 1.0f / (float)D;
    float acc_g[AN_LANES], acc_gx[AN_LANES];
    AN_ZERO(acc_g); AN_ZERO(acc_gx);
    int64_t i = 0;
    for (; i + AN_LANES <= D; i += AN_LANES)
        for (int j = 0; j < AN_LANES; j++) {
            float g = dy[i + j] * (w[i + j] + off);
            acc_g[j] += g;
            acc_gx[j] += g * ((s[i + j] - mean) * rstd);
        }
    for (; i < D; i++) {
        float g = dy[i] * (w[i] + off);
        acc_g[0] += g;
        acc_gx[0] += g * ((s[i] - mean) * rstd);
    }
    const float mg = (a->kind == AN_LAYER) ? AN_FN(hsum)(acc_g) * inv_d : 0.0f;
    const float mgx = AN_FN(hsum)(acc_gx) * inv_d;
    for (int64_t c0 = 0; c0 < D; c0 += AN_CHUNK) {
        AN_FN(prefetch_chunk)(nxt_s, nxt_dy, nxt_dres, c0, D, es);
        const int64_t c1 = c0 + AN_CHUNK < D ? c0 + AN_CHUNK : D;
        if (stream_to) { /* dst is one chunk of scratch, streamed out while it is still in L1 */
            AN_FN(bwd_out_f32)(dst, dw + c0, db + c0, s + c0, dy + c0, dres + c0, w + c0, off, mean, rstd, mg, mgx,
                               c1 - c0);
            AN_FN(stream_bytes)(stream_to + c0, dst, (size_t)(c1 - c0) * 4);
        } else {
            AN_FN(bwd_out_f32)(dst + c0, dw + c0, db + c0, s + c0, dy + c0, dres + c0, w + c0, off, mean, rstd, mg,
                               mgx, c1 - c0);
        }
    }
}

/* Backward over rows of any dtypes but bfloat16 throughout (which has its own loop): float32 rows read where
 * they lie, others converted into scratch rows first. Absent weight / incoming residual gradient / accumulators are rows of ones / zeros / a discarded row. */
static void AN_FN(bwd_rows_f32)(const an_bwd_args *a, int64_t r0, int64_t r1, const an_rows *sc, float *dw_acc,
                                float *db_acc) {
    const int64_t D = a->D;
    /* float32 throughout: rows read where they lie; anything else (float16, a float32 stream beside a 16-bit
     * dy, a second dx in the branch input's dtype) is converted into float32 scratch rows first */
    const int f32 = a->uniform && a->dtype == AN_F32;
    const size_t ses = an_elem_size(a->sdt), dyes = an_elem_size(a->dydt), x2es = an_elem_size(a->dx2dt);
    float *restrict dw = dw_acc ? dw_acc : sc->r[3];
    float *restrict db = db_acc ? db_acc : sc->r[4];
    float *restrict o32 = sc->r[5];
    const float *restrict w = a->weight ? a->weight : AN_ONES(sc);
    const float off = a->weight ? a->weight_offset : 0.0f;
    for (int64_t r = r0; r < r1; r++) {
        const char *s_row = (const char *)a->s + r * a->s_rs * ses;
        const char *dy_row = (const char *)a->dy + r * a->dy_rs * dyes;
        const char *dres_row = a->dres ? (const char *)a->dres + r * a->dres_rs * ses : NULL;
        char *dx_row = (char *)a->dx + r * a->dx_rs * ses;
        const float *s = (const float *)s_row, *dy = (const float *)dy_row;
        const float *dres = dres_row ? (const float *)dres_row : AN_ZEROS(sc);
        if (!f32) {
            AN_FN(load_row)(sc->r[0], s_row, D, a->sdt);
            AN_FN(load_row)(sc->r[1], dy_row, D, a->dydt);
            s = sc->r[0];
            dy = sc->r[1];
            if (dres_row) {
                AN_FN(load_row)(sc->r[2], dres_row, D, a->sdt);
                dres = sc->r[2];
            }
        }
        const int more = r + 1 < r1;
        /* float32: dx written in place, or streamed a chunk at a time; otherwise converted from o32 */
        float *dst = (f32 && !a->nt) ? (float *)dx_row : o32;
        float *stream_to = (f32 && a->nt) ? (float *)dx_row : NULL;
        const float rstd = a->rstd[r];
        if (!(rstd >= AN_TINY_RSTD) && /* beyond float32's range: in float64, into o32 */
            AN_FN(bwd_row_big)(s, dy, NULL, dres, w, off, NULL, 0.0f, a->kind == AN_RMS, D, dw, db, NULL, NULL, o32)) {
            if (f32 && a->nt) AN_FN(stream_bytes)(dx_row, o32, (size_t)D * 4);
            else if (f32) memcpy(dx_row, o32, (size_t)D * 4);
            else {
                AN_FN(put_row)(dx_row, o32, D, a->sdt, a->nt, sc->r[0]);
                if (a->dx2) AN_FN(put_row)((char *)a->dx2 + r * a->dx2_rs * x2es, o32, D, a->dx2dt, a->nt, sc->r[0]);
            }
            continue;
        }
        /* prefetch takes one element size: dy's next row only when it shares the stream's */
        AN_FN(bwd_row_f32)(a, s, dy, dres, w, off, a->mean ? a->mean[r] : 0.0f, a->rstd[r], dw, db, dst, stream_to,
                           more ? s_row + a->s_rs * ses : NULL, (more && dyes == ses) ? dy_row + a->dy_rs * dyes : NULL,
                           (more && dres_row) ? dres_row + a->dres_rs * ses : NULL, (int)ses);
        if (!f32) {
            AN_FN(put_row)(dx_row, dst, D, a->sdt, a->nt, sc->r[0]); /* r[0] is free by now */
            if (a->dx2) AN_FN(put_row)((char *)a->dx2 + r * a->dx2_rs * x2es, dst, D, a->dx2dt, a->nt, sc->r[0]);
        }
    }
}

/* ---- forward ---- */

/* Every tensor has its own dtype (see an_fwd_args). Float32 throughout and bfloat16 throughout take
 * specialised loops; anything else -- float16, a float32 residual stream beside 16-bit branch outputs, an
 * explicit output dtype -- converts each row into float32 scratch, sums, rounds to the stream's dtype as the
 * stored sum will be, normalizes and stores in the output dtype: still one pass. */
static void AN_FN(fwd_rows)(const an_fwd_args *a, int64_t r0, int64_t r1, const an_rows *sc) {
    if (a->uniform && a->dtype == AN_BF16 && !a->cast_before_weight) {
        AN_FN(fwd_rows_bf16)(a, r0, r1, sc);
        return;
    }
    if (a->uniform && a->dtype == AN_F16 && !a->cast_before_weight) {
        AN_FN(fwd_rows_f16)(a, r0, r1, sc);
        return;
    }
    float *restrict buf = sc->r[0], *restrict tmp = sc->r[1];
    const int64_t D = a->D;
    const int f32 = a->uniform && a->dtype == AN_F32, bf16 = a->uniform && a->dtype == AN_BF16;
    const size_t xes = an_elem_size(a->xdt), res = an_elem_size(a->rdt), oes = an_elem_size(a->odt),
                 ses = an_elem_size(a->sdt);
    const float inv_d = 1.0f / (float)D;
    for (int64_t r = r0; r < r1; r++) {
        const void *x_row = (const char *)a->x + r * a->x_rs * xes;
        const void *r_row = a->res ? (const char *)a->res + r * a->res_rs * res : NULL;
        void *out_row = (char *)a->out + r * a->out_rs * oes;
        const float *src; /* the row to normalize, as float32 */
        float sum = 0.0f;
        int res_done = 0;
        if (f32 && r_row) {
            /* unstreamed float32: the new residual is written in the same pass as the sum. A row wider than
             * AN_WIDE_ROW, which no cache keeps, is summed into the new residual itself (stored, not streamed) and
             * normalized from there: a scratch copy cost one very wide row another row-size of memory */
            const int wide = D > AN_WIDE_ROW;
            float *ro = (a->res_out && (!a->nt || wide)) ? (float *)((char *)a->res_out + r * a->res_out_rs * ses)
                                                         : NULL;
            sum = (ro && wide) ? AN_FN(add_rows_sum)(ro, x_row, r_row, NULL, D)
                               : AN_FN(add_rows_sum)(buf, x_row, r_row, ro, D);
            res_done = ro != NULL;
            src = (ro && wide) ? ro : buf;
        } else if (f32) {
            src = x_row;
            if (a->kind == AN_LAYER) sum = AN_FN(row_sum)(src, D);
        } else if (bf16 && r_row) {
            void *ro = a->res_out ? (char *)a->res_out + r * a->res_out_rs * ses : NULL;
            sum = AN_FN(add_bf16_rows)(buf, x_row, r_row, (ro && a->nt) ? (uint16_t *)tmp : ro, D);
            if (ro && a->nt) AN_FN(stream_bytes)(ro, tmp, (size_t)D * 2);
            res_done = 1;
            src = buf;
        } else {
            AN_FN(load_row)(buf, x_row, D, a->xdt);
            if (r_row) {
                AN_FN(load_row)(tmp, r_row, D, a->rdt);
                for (int64_t i = 0; i < D; i++) buf[i] += tmp[i];
                /* the new residual stream is stored in its own dtype: normalize exactly what is stored */
                AN_FN(round_row)(buf, D, a->sdt);
            }
            if (a->kind == AN_LAYER) sum = AN_FN(row_sum)(buf, D);
            src = buf;
        }
        if (a->res_out && !res_done)
            AN_FN(put_row)((char *)a->res_out + r * a->res_out_rs * ses, src, D, a->sdt, a->nt, tmp);

        /* two passes: the sum of squared deviations, no E[x²]−E[x]² cancellation */
        float mean = 0.0f;
        float rstd = an_rstd(a->kind == AN_LAYER ? AN_FN(layer_moments)(src, D, sum, &mean) / (float)D
                                                 : AN_FN(sq_dev_sum)(src, 0.0f, D) * inv_d, a->eps);
        an_big bs;
        const an_big *big = AN_FN(checked_stats)(src, D, a->kind == AN_RMS, a->eps, &bs, &mean, &rstd);
        if (a->mean) a->mean[r] = mean;
        if (a->rstd) a->rstd[r] = rstd;
        float om, os; /* the output's statistics (see output_row) */
        src = AN_FN(output_row)(buf, src, D, mean, rstd, big, &om, &os);

        if (a->cast_before_weight && a->sdt != AN_F32) {
            /* Llama order: xhat cast to the dtype of what the norm reads (x, or the stream x + r) first -- HF's
             * weight * h.to(input_dtype) -- then multiplied by the weight, rounded once more to the output dtype */
            AN_FN(normalize)(tmp, src, D, om, os, NULL, NULL, 0.0f);
            AN_FN(round_row)(tmp, D, a->sdt);
            AN_FN(normalize)(tmp, tmp, D, 0.0f, 1.0f, a->weight, a->bias, a->weight_offset);
            AN_FN(put_row)(out_row, tmp, D, a->odt, a->nt, buf);
        } else if (f32 && !a->nt) {
            /* src may be out_row itself (out=x): each element is read before it is written */
            const int more = r + 1 < r1;
            for (int64_t c0 = 0; c0 < D; c0 += AN_CHUNK) {
                AN_FN(prefetch_chunk)(more ? (const char *)x_row + a->x_rs * xes : NULL,
                                      (more && r_row) ? (const char *)r_row + a->res_rs * res : NULL, NULL, c0, D, 4);
                const int64_t c1 = c0 + AN_CHUNK < D ? c0 + AN_CHUNK : D;
                const float *wc = a->weight ? a->weight + c0 : NULL, *bc = a->bias ? a->bias + c0 : NULL;
                AN_FN(normalize)((float *)out_row + c0, src + c0, c1 - c0, om, os, wc, bc, a->weight_offset);
            }
        } else {
            /* a chunk at a time, normalized into tmp and stored (streamed) from there while it is in L1: a whole
             * normalized row in scratch cost one very wide row another row-size of memory */
            float *restrict stage = sc->r[2]; /* put_row's 16-bit staging */
            for (int64_t c0 = 0; c0 < D; c0 += AN_CHUNK) {
                const int64_t c1 = c0 + AN_CHUNK < D ? c0 + AN_CHUNK : D;
                const float *wc = a->weight ? a->weight + c0 : NULL, *bc = a->bias ? a->bias + c0 : NULL;
                AN_FN(normalize)(tmp, src + c0, c1 - c0, om, os, wc, bc, a->weight_offset);
                AN_FN(put_row)((char *)out_row + c0 * (int64_t)oes, tmp, c1 - c0, a->odt, a->nt, stage);
            }
        }
    }
}

/* Parameter gradients are summed over a block of AN_BLOCK rows in float32 (in r[6], r[7]), and the block
 * sums into the chunk's float64 partial row: the error stays that of a 32-term float32 sum at any row
 * count, where one float32 sum per chunk grew with its rows. Where every chunk is one block (sc->f32_partials)
 * the block's float32 sums are the chunk's: summed straight into its partial rows, zeroed and read as float32 by the
 * caller -- the same values, without two more rows of D floats and the float64 rows (a single very wide row
 * would otherwise need six row-sizes of scratch). */
#define AN_BLOCK 32
static void AN_FN(bwd_rows)(const an_bwd_args *a, int64_t r0, int64_t r1, const an_rows *sc, double *restrict dw_acc,
                            double *restrict db_acc) {
    const int direct = sc->f32_partials;
    float *restrict bw = dw_acc ? (direct ? (float *)dw_acc : sc->r[6]) : NULL;
    float *restrict bb = db_acc ? (direct ? (float *)db_acc : sc->r[7]) : NULL;
    const int64_t D = a->D;
    const int bf16 = a->uniform && a->dtype == AN_BF16;
    int nf = 0;
    if (bf16) /* once per chunk, not per block: the NaN verdict over its float32 operands */
        nf = an_nan_safe(a->weight, D) && an_scalar_nan_safe(a->weight_offset) &&
             an_nan_safe(a->mean ? a->mean + r0 : NULL, r1 - r0) && an_nan_safe(a->rstd + r0, r1 - r0);
    for (int64_t b0 = r0; b0 < r1; b0 += AN_BLOCK) {
        const int64_t b1 = b0 + AN_BLOCK < r1 ? b0 + AN_BLOCK : r1;
        if (bw && !direct) memset(bw, 0, sizeof(float) * (size_t)D);
        if (bb && !direct) memset(bb, 0, sizeof(float) * (size_t)D);
        if (bf16) AN_FN(bwd_rows_bf16)(a, b0, b1, sc, bw, bb, nf);
        else AN_FN(bwd_rows_f32)(a, b0, b1, sc, bw, bb);
        if (direct) continue;
        if (bw) for (int64_t i = 0; i < D; i++) dw_acc[i] += (double)bw[i];
        if (bb) for (int64_t i = 0; i < D; i++) db_acc[i] += (double)bb[i];
    }
}

#undef AN_FN
#undef AN_CAT
#undef AN_CAT2
