/* addnorm's CPU kernels: fused residual-add + LayerNorm / RMSNorm, forward and backward.
 *
 * Design: Add & Norm does ~10 flops per element, so its speed is bytes moved / memory bandwidth.
 * One pass over memory forward (read x, residual; write out, new residual; per-row mean/rstd),
 * one pass backward (read dy, saved sum, incoming residual grad; write dx). Statistics and
 * accumulation in float32 for every storage dtype (float32, bfloat16, float16).
 *
 * ABI: plain C entry points (addnorm_forward / addnorm_backward, usable from ctypes or any FFI);
 * nothing here links against torch. Python calls them through two METH_FASTCALL wrappers at the
 * end of this file (a few hundred nanoseconds, where ctypes' argument marshalling cost microseconds
 * -- most of a small call).
 *
 * Threads: the caller passes the thread count (torch's); rows are split into contiguous chunks run by
 * OpenMP -- which, with torch loaded, is torch's own libgomp and thread pool, so the kernels never
 * oversubscribe the cores or start threads per call (pthreads when built without OpenMP). Large work
 * is cut into several chunks per thread, taken in turn, so a thread slowed by another process does
 * not hold up the call. Parameter gradients are summed per chunk and then reduced in chunk order, so
 * dweight/dbias have the same bits on every run for a given thread count.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <float.h>
#include <math.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif
#include <pthread.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__linux__)
#include <sys/mman.h>
#endif

enum { AN_F32 = 0, AN_BF16 = 1, AN_F16 = 2 };
enum { AN_LAYER = 0, AN_RMS = 1 };
#define AN_MAX_THREADS 256
/* the task table lives on the heap above AN_STACK_TASKS tasks: a caller's thread may have a small stack (a
 * Python thread made with threading.stack_size(32768)), and 512 tasks of 96 bytes on it overran it */
#define AN_MAX_CHUNKS 512
#define AN_STACK_TASKS 8
/* work of at least this many elements is cut into AN_CHUNKS_PER_THREAD chunks per thread */
#define AN_BALANCE_MIN ((int64_t)1 << 20)
#define AN_CHUNKS_PER_THREAD 8
/* fewer elements than this run on one thread: torch's own grain size (at::internal::GRAIN_SIZE) */
#define AN_MIN_PARALLEL 32768

/* Dtypes: x has xdt, the residual rdt, the normed output odt, the residual sum sdt (the dtype the new
 * stream is formed and stored in: the residual's). `uniform` says all four are `dtype`: the specialised
 * row loops need that; a float32 stream beside 16-bit branch outputs takes the generic loop. */
typedef struct {
    int kind, dtype, cast_before_weight;
    int xdt, rdt, odt, sdt, uniform;
    int64_t N, D;
    const void *x; int64_t x_rs;
    const void *res; int64_t res_rs;      /* NULL: plain norm */
    const float *weight, *bias;           /* float32, NULL when absent */
    float weight_offset, eps;
    void *out; int64_t out_rs;
    void *res_out; int64_t res_out_rs;    /* NULL: the sum is not written */
    float *mean, *rstd;                   /* per row; NULL when not wanted */
    int nt;                               /* stream the outputs (non-temporal stores) */
} an_fwd_args;

/* Dtypes: dy has dydt, the saved sum, the incoming residual gradient and dx have sdt; dx2 (optional)
 * receives the same gradient in dx2dt -- the branch input's dtype when it is narrower than the stream. */
typedef struct {
    int kind, dtype;
    int dydt, sdt, dx2dt, uniform;
    int64_t N, D;
    const void *dy; int64_t dy_rs;
    const void *s; int64_t s_rs;          /* the normalized input (the residual sum) */
    const float *mean, *rstd;             /* mean may be NULL (RMSNorm) */
    const float *weight; float weight_offset;
    const void *dres; int64_t dres_rs;    /* gradient of the new residual, NULL when none */
    void *dx; int64_t dx_rs;
    void *dx2; int64_t dx2_rs;            /* NULL when not wanted */
    int nt;
} an_bwd_args;

/* The fused forms (fused_rows.h): norm-then-add and the parallel residual. Each tensor has its own dtype;
 * optional ones are NULL. amdt: the dtype `a + m` is stored in; ndt: the norm output's before `post`. */
typedef struct {
    int kind, cast_before_weight;
    int xdt, adt, mdt, amdt, sdt, pdt, odt, ndt;
    int64_t N, D;
    const void *x; int64_t x_rs;
    const void *a; int64_t a_rs;
    const void *m; int64_t m_rs;
    const void *post; int64_t post_rs;
    const float *w1, *b1, *w2, *b2;
    float weight_offset, eps;
    void *y; int64_t y_rs;
    void *y2; int64_t y2_rs;
    void *s_out; int64_t s_rs;
    float *mean, *rstd;
    int nt;
    int uniform_bf16;                     /* every activation bfloat16: the specialised loop */
} an_ffwd_args;

/* DyT / Derf fused with the add (pointwise_rows.h): rows of D, x / residual / y with their own row strides
 * (s, dy... contiguous); alpha and shift are float32 scalars. */
enum { AN_DYT = 0, AN_DERF = 1 };
typedef struct {
    int kind, nt;
    int xdt, rdt, sdt, odt, dydt, dresdt;
    int64_t N, D;
    const void *x; int64_t x_rs;
    const void *res; int64_t res_rs;
    const float *weight, *bias;
    float alpha, shift;
    void *y;                              /* forward: y (contiguous) */
    void *s_out;                          /* forward: the sum (contiguous), NULL without a residual */
    const void *s;                        /* backward: the stream the forward normalized (contiguous) */
    const void *dy; int64_t dy_rs;
    const void *dres; int64_t dres_rs;
    void *ds;                             /* backward: contiguous, in sdt */
} an_pw_args;

/* The widened stream (stream_rows.h): per token n rows of C, contiguous ((N, n, C) and (N, C) tensors of one
 * dtype); the per-token coefficients and their gradients are float32. */
#define AN_STREAM_MAX_N 8
enum { AN_STREAM_READ = 0, AN_STREAM_READ_BWD = 1, AN_STREAM_WRITE = 2, AN_STREAM_WRITE_BWD = 3 };
typedef struct {
    int op, n, dt, nt;
    int64_t N, C;
    const void *x;        /* READ*, WRITE: the stream X; WRITE_BWD: dX' */
    const void *y;        /* READ_BWD: dh; WRITE*: the branch output y */
    const void *xin;      /* WRITE_BWD: the stream X the write read */
    const void *xout;     /* WRITE_BWD: X' (only with dq) */
    void *out;            /* READ: h; READ_BWD: dX; WRITE: X'; WRITE_BWD: dX */
    void *dy;             /* WRITE_BWD: dy */
    const float *h_pre, *h_post, *h_res;
    float *q;             /* WRITE: per-token sum of squares of X' (NULL: not wanted) */
    const float *dq;      /* WRITE_BWD: its gradient (NULL: none) */
    float *d_pre, *d_post, *d_res;
} an_stream_args;

/* mHC's pre step (mhc_rows.h): x (N, n, C) contiguous in dt; phi float32 (K, mp) zero-padded (mp: m rounded up to
 * a multiple of 8), phiT (m, K);
 * per-token outputs and gradients float32 and contiguous. WFWD: the write of the stream before the read, in the
 * same pass (x is then the stream the write reads; its result X' is written to x2 and read). WBWD: the backward of
 * both in one pass: the read's backward on X' (x = X'), its dX' kept in float32, plus the dX' given (dx2), then
 * the write's backward from that sum. */
enum { AN_MHC_FWD = 0, AN_MHC_BWD = 1, AN_MHC_WFWD = 2, AN_MHC_WBWD = 3 };
#define AN_MHC_MAX_M 128
#define AN_MHC_MAX_ITERS 64
typedef struct {
    int op, n, dt, nt, m, mp, r, iters;
    int64_t N, C, K;
    const void *x;
    const float *phi, *phiT;
    float a[3];               /* a_pre, a_post, a_res */
    const float *bias;        /* (m): b_pre, b_post, b_res */
    const int32_t *perm;      /* (r, n): mHC-lite's permutations; NULL: Sinkhorn-Knopp (r = n^2) */
    float eps;
    float pre_eps, res_eps;   /* a model's convention (ops/mhc/convention.py): + pre_eps on H_pre; Sinkhorn's */
    int res_t;                /* first result + res_eps, every later sum + res_eps; res_t: its logits transposed */
    float post_scale, post_eps; /* H_post = post_scale sigmoid(.) + post_eps (the paper's: 2 and 0) */
    int groups;               /* 3: H_pre, H_post, H_res (m = 2n + r); 2: no H_res (m = 2n, r = 0); 1: H_pre (m = n) */
    const void *wy;           /* WFWD: the branch output y (N, C) in dt */
    const float *w_post, *w_res; /* WFWD: (N, n) and (N, n, n); w_res NULL: X'_i = X_i + H_post[i] y, no mixing */
    int w_products;           /* WFWD without mixing: H_post[i] y rounded to dt before the add (eager 16-bit's) */
    void *x2;                 /* WFWD: X' (N, n, C) in dt */
    const void *wx, *dx2;     /* WBWD: the stream the write read (only with w_res); the gradient of X' (NULL: none) */
    void *wdx, *wdy;          /* WBWD: dX (N, n, C) and dy (N, C) in dt */
    float *wd_post, *wd_res;  /* WBWD: (N, n) and (N, n, n) (with w_res) */
    void *h;                  /* FWD outputs */
    float *h_pre, *h_post, *h_res, *p, *rstd;
    float *st;                /* FWD: Sinkhorn-Knopp's rounds per token (AN_MHC_STATE floats; NULL: not kept) */
    const void *dh;           /* BWD inputs (the gradients NULL when absent) */
    const float *dh_pre, *dh_post, *dh_res, *p_in, *rstd_in;
    const float *st_in;       /* BWD: the rounds the forward kept (NULL: recomputed from p) */
    void *dx;                 /* BWD outputs */
    float *dlogits, *dphi_part; /* dphi_part: per chunk (K, mp) partial sums */
    double *dcoef_part; /* per chunk 2 mp: the sums of dlogits and of dlogits * p over its tokens (NULL: none) */
} an_mhc_args;
/* Sinkhorn-Knopp's rounds of one token, as mhc_sinkhorn_tile keeps them: M0, then per round A (n^2), r (n), c (n) */
#define AN_MHC_STATE(n, iters) ((1 + (iters)) * (n) * (n) + 2 * (iters) * (n))

/* Attention Residuals' depth mix (attn_res_rows.h): S sources of N contiguous rows of C, one dtype, given as an array
 * of S row pointers; u = query * key-norm weight in float32 (C); alpha and rstd (N, S) float32. Backward writes dv
 * (S row pointers) and sums du = sum over tokens and sources of c_s v_s per chunk (float64). */
#define AN_ATTN_MAX_S 64
enum { AN_ATTN_FWD = 0, AN_ATTN_BWD = 1 };
typedef struct {
    int op, dt, S;
    int64_t N, C;
    const void *const *v;
    const float *u;
    float eps;
    void *h;                          /* FWD outputs */
    float *alpha, *rstd;
    const void *dh;                   /* BWD inputs */
    const float *alpha_in, *rstd_in;
    void *const *dv;                  /* BWD outputs */
} an_attn_args;

/* Qwen4-exp's gated read and the write before it (hyper_rows.h): per token n rows of C, contiguous, one dtype; the
 * norm's weight (n, C) and the write's H_post (N, n) and dH_post float32. dw_part: per chunk K = nC float64 partial
 * sums of dw (NULL: not wanted). */
enum { AN_HYPER_NORM = 0, AN_HYPER_NORM_BWD = 1, AN_HYPER_WNORM = 2, AN_HYPER_WNORM_BWD = 3, AN_HYPER_GATE = 4,
       AN_HYPER_GATE_BWD = 5 };
typedef struct {
    int op, n, dt, nt, products;
    int64_t N, C;
    const void *x;        /* NORM*, WNORM: the stream X; WNORM_BWD: X'; GATE*: the normed streams N */
    const void *y;        /* WNORM*: the branch output y */
    const void *u;        /* GATE*: the gate logits U */
    const float *w;       /* NORM*, WNORM*: the weights (n, C) */
    float off, eps;
    const float *h_post;  /* WNORM*: (N, n) */
    void *out;            /* NORM, WNORM: N; GATE: h; NORM_BWD, WNORM_BWD: dX; GATE_BWD: dN */
    void *x2;             /* WNORM: X' */
    const void *dout;     /* NORM_BWD, WNORM_BWD: dN; GATE_BWD: dh */
    const void *dx2;      /* WNORM_BWD: dX' (NULL: none) */
    void *dy;             /* WNORM_BWD: dy */
    void *du;             /* GATE_BWD: dU */
    float *d_post;        /* WNORM_BWD: (N, n) */
    double *dw_part;      /* NORM_BWD, WNORM_BWD */
} an_hyper_args;

typedef struct {
    int kind;
    int sdt, dydt, dy2dt, dresdt, odt;
    int64_t N, D;
    const void *s; int64_t s_rs;
    const float *mean, *rstd;
    const void *dy; int64_t dy_rs;        /* NULL: only dy2 */
    const void *dy2; int64_t dy2_rs;
    const float *w1, *w2; float weight_offset;
    const void *dres; int64_t dres_rs;
    void *ds; int64_t ds_rs;
    int nt;
    int uniform_bf16;                     /* every tensor bfloat16: the specialised loop */
} an_fbwd_args;

/* per-thread float32 scratch rows; rows of ones/zeros stand in for an absent weight/bias/gradient. An absent bias in
 * an output is nzeros, -0.0f: x + (-0) is x for every x, -0 included, where x + (+0) turned eager's -0 outputs to +0.
 * The three are filled on first use (AN_ONES etc.), not per task: a loop that never reads them leaves their pages
 * untouched, so one very wide row does not cost three more row-sizes of memory. */
enum { AN_CONST_ONES = 0, AN_CONST_ZEROS = 1, AN_CONST_NZEROS = 2 };
/* mHC's per-tile buffers (a tile of AN_MHC_TILE tokens' projections z and their gradients dz, their logits and maps,
 * and Sinkhorn's rounds that a backward recomputes): 92 KiB, in the task's scratch block, not on the stack of a
 * thread that may have 32 KiB. Four tokens: Sinkhorn-Knopp runs a tile's tokens in the lanes of a 4-wide vector */
#define AN_MHC_TILE 4
#define AN_MHC_SINKHORN_FLOATS ((1 + AN_MHC_MAX_ITERS) * AN_STREAM_MAX_N * AN_STREAM_MAX_N + \
                                2 * AN_MHC_MAX_ITERS * AN_STREAM_MAX_N)
/* z, dz, the logits and mHC-lite's weights (AN_MHC_MAX_M a token), H_res, dL and transposed logits (n^2 a token)
 * and the rounds, for each token of a tile */
#define AN_MHC_SCRATCH_FLOATS (AN_MHC_TILE * (4 * AN_MHC_MAX_M + 3 * AN_STREAM_MAX_N * AN_STREAM_MAX_N + \
                                              AN_MHC_SINKHORN_FLOATS))
typedef struct {
    float *r[14]; /* r[6..9]: a block of rows' float32 parameter-gradient sums (backward); r[12..13]: the AVX2
                   * bfloat16 backward's permuted weights (fused_rows.h) */
    float *consts[3]; /* ones, zeros, nzeros: read them through AN_ONES, AN_ZEROS, AN_NZEROS */
    int *filled;      /* filled[k]: consts[k] holds its value */
    int64_t D;
    float *mhc;   /* AN_MHC_SCRATCH_FLOATS (mHC's tasks only; NULL otherwise) */
    int f32_partials; /* backward: each chunk is one block, its parameter-gradient rows float32 (see an_f32_partials) */
} an_rows;

static const float *an_const_row(const an_rows *sc, int k) {
    float *row = sc->consts[k];
    if (!sc->filled[k]) {
        /* as bits: built with -fno-signed-zeros, gcc may take a -0.0f constant for +0 */
        const uint32_t v = k == AN_CONST_ONES ? 0x3f800000u : k == AN_CONST_ZEROS ? 0u : 0x80000000u;
        for (int64_t i = 0; i < sc->D; i++) memcpy(row + i, &v, 4);
        sc->filled[k] = 1;
    }
    return row;
}
#define AN_ONES(sc) an_const_row((sc), AN_CONST_ONES)
#define AN_ZEROS(sc) an_const_row((sc), AN_CONST_ZEROS)
#define AN_NZEROS(sc) an_const_row((sc), AN_CONST_NZEROS)

/* v formed here, before what follows uses it. Built with -fassociative-math, gcc may regroup a product such as
 * (x - mean) * rstd * w as (x - mean) * (rstd * w), in one loop and not in another: the bfloat16 output loops of
 * the instruction sets then parted on one output in ~10^5 (a float32 step at a bfloat16 tie). An empty asm, no
 * instruction. */
#if defined(__x86_64__) || defined(__i386__)
#define AN_KEEP(v) __asm__("" : "+v"(v))
#elif defined(__aarch64__)
#define AN_KEEP(v) __asm__("" : "+w"(v))
#else
#define AN_KEEP(v) __asm__("" : "+m"(v))
#endif

/* a row's float64 statistics, where float32's cannot be formed (norm_rows.h: checked_stats) */
typedef struct {
    double mean, rstd;
} an_big;

/* The AVX2 bfloat16 forwards' weights in their loops' order (norm_rows.h: bf16_perm_n): w + weight_offset and b for
 * [0, n), each 16 values' middle two quads swapped; n = 0 where the loops keep the row's own order */
typedef struct {
    const float *w, *b;
    int64_t n;
} an_bf16_perm;

/* The fused backward's second output in its output pass (fused_rows.h: fused_bwd_out_vec): dy2's row and the
 * dw2 (a2) and db2 (a3) sums */
typedef struct {
    const uint16_t *dy2;
    float *a2, *a3;
} an_fbwd_two;

static inline size_t an_elem_size(int dt) { return dt == AN_F32 ? 4 : 2; }

static inline float an_bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint32_t an_f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static inline float an_bf16_to_f32(uint16_t h) { return an_bits_f32((uint32_t)h << 16); }

/* float32 -> bfloat16 bits, round to nearest even as torch does; NaN stays a (quiet) NaN.
 * Branch-free so that gcc vectorizes the loops that call it. */
static inline uint16_t an_f32_to_bf16(float f) {
    uint32_t u = an_f32_bits(f);
    uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    uint32_t quiet_nan = (u >> 16) | 0x40u;
    return (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded);
}

/* 1 / sqrt(var + eps), rounded once (in double: once per row, so free), where float32 would round the
 * sum, the square root and the quotient each */
static inline float an_rstd(float var, float eps) { return (float)(1.0 / sqrt((double)var + (double)eps)); }

static inline float an_bf16_round(float f) { return an_bf16_to_f32(an_f32_to_bf16(f)); }

/* The same rounding without the NaN test, exact for every value but a NaN whose low 16 bits are not all zero:
 * adding at most 0x8000 cannot carry out of a low half that is zero, so any other NaN stays the same NaN. In the
 * bfloat16 loops every NaN is of that kind when their float32 operands are (an_nan_safe, checked per call):
 * arithmetic returns one operand's NaN, quieted, or the default NaN 0xffc00000, and a bfloat16 value's low half
 * is zero. The test costs the AVX2 loops about a third of their time (three more vector operations in ten). */
static inline uint16_t an_f32_to_bf16_nf(float f) {
    uint32_t u = an_f32_bits(f);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

static inline float an_bf16_round_nf(float f) {
    uint32_t u = an_f32_bits(f);
    return an_bits_f32((u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u);
}

/* nf: a constant 0 or 1 in the loops that are compiled both ways (an always-inline body called with each) */
#define AN_TO_BF16(nf, f) ((nf) ? an_f32_to_bf16_nf(f) : an_f32_to_bf16(f))
#define AN_BF16_ROUND(nf, f) ((nf) ? an_bf16_round_nf(f) : an_bf16_round(f))

/* 1 when none of p[0..n) (NULL: none) is a NaN with a nonzero low half: the loops may then round without the
 * NaN test (an_f32_to_bf16_nf) */
static int an_nan_safe(const float *p, int64_t n) {
    uint32_t bad = 0;
    for (int64_t i = 0; p && i < n; i++) {
        uint32_t u = an_f32_bits(p[i]);
        bad |= ((u & 0x7fffffffu) > 0x7f800000u) & ((u & 0xffffu) != 0);
    }
    return bad == 0;
}

static int an_scalar_nan_safe(float v) { return an_nan_safe(&v, 1); }

static inline float an_f16_to_f32(uint16_t h) {
    _Float16 v;
    memcpy(&v, &h, 2);
    return (float)v;
}

static inline uint16_t an_f32_to_f16(float f) {
    _Float16 v = (_Float16)f;
    uint16_t h;
    memcpy(&h, &v, 2);
    return h;
}

/* 1 where the AVX-512 loops may convert float32 to bfloat16 with the AVX512_BF16 instruction (an_pick_isa) */
static int g_bf16_native = 0;
/* 1 where the row loops ask for the rows ahead themselves (prefetch_next and prefetch_span in norm_rows.h;
 * an_pick_isa): not on AMD's CPUs, whose own prefetchers keep up with these loops and where the requests cost more
 * than they brought. With the caches flushed, 8192 x 1024, four rounds in alternating order on a 2-core AMD EPYC,
 * the time without them over the time with them was 0.94 on the median of 88 cells, where cells that ask for nothing
 * either way read 0.99-1.03 (0.64-0.81 for norm-then-add's float32 on AVX2); docs/performance-journal.md, "Software
 * prefetch on the AMD EPYC". The bfloat16 stream write and read (prefetch_next_always, prefetch_span_always: the
 * write's forward took 1.09-1.22 times as long without) and mHC's projection loops (an_mhc_pf_at) keep theirs
 * everywhere. Every other vendor's CPUs keep every one (Intel's
 * measured on a 2-core Xeon: norm_rows.h). ADDNORM_CPU_PREFETCH=1 or 0 overrides. */
static int g_swpf = 1;

#if defined(__x86_64__)
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c,prefer-vector-width=512")
#define AN_SFX _avx512
#define AN_F16C 1
#define AN_MAD(a, b, c) __builtin_fmaf((a), (b), (c))
#define AN_STREAM_BYTES 64
#define AN_AVX512 1
#include "norm_rows.h"
#include "fused_rows.h"
#include "stream_rows.h"
#include "mhc_rows.h"
#include "pointwise_rows.h"
#include "attn_res_rows.h"
#include "hyper_rows.h"
#undef AN_STREAM_BYTES
#undef AN_AVX512
#undef AN_SFX
#undef AN_MAD
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#define AN_SFX _avx2
#define AN_MAD(a, b, c) __builtin_fmaf((a), (b), (c))
#define AN_STREAM_BYTES 32
#define AN_AVX2 1
#include "norm_rows.h"
#include "fused_rows.h"
#include "stream_rows.h"
#include "mhc_rows.h"
#include "pointwise_rows.h"
#include "attn_res_rows.h"
#include "hyper_rows.h"
#undef AN_AVX2
#undef AN_STREAM_BYTES
#undef AN_SFX
#undef AN_F16C
#undef AN_MAD
#pragma GCC pop_options
#endif

#define AN_SFX _base
#define AN_MAD(a, b, c) ((a) * (b) + (c))
#include "norm_rows.h"
#include "fused_rows.h"
#include "stream_rows.h"
#include "mhc_rows.h"
#include "pointwise_rows.h"
#include "attn_res_rows.h"
#include "hyper_rows.h"
#undef AN_SFX

typedef void (*an_fwd_fn)(const an_fwd_args *, int64_t, int64_t, const an_rows *);
typedef void (*an_bwd_fn)(const an_bwd_args *, int64_t, int64_t, const an_rows *, double *, double *);
typedef void (*an_ffwd_fn)(const an_ffwd_args *, int64_t, int64_t, const an_rows *);
typedef void (*an_fbwd_fn)(const an_fbwd_args *, int64_t, int64_t, const an_rows *, double *const *);
typedef void (*an_stream_fn)(const an_stream_args *, int64_t, int64_t, const an_rows *);
typedef void (*an_mhc_fn)(const an_mhc_args *, int64_t, int64_t, const an_rows *, int);
typedef void (*an_pwf_fn)(const an_pw_args *, int64_t, int64_t, const an_rows *);
typedef void (*an_pwb_fn)(const an_pw_args *, int64_t, int64_t, const an_rows *, double *const *);
typedef void (*an_attn_fn)(const an_attn_args *, int64_t, int64_t, const an_rows *, double *);
typedef void (*an_hyper_fn)(const an_hyper_args *, int64_t, int64_t, const an_rows *, int);

static an_fwd_fn g_fwd = fwd_rows_base;
static an_bwd_fn g_bwd = bwd_rows_base;
static an_ffwd_fn g_ffwd = fused_fwd_rows_base;
static an_fbwd_fn g_fbwd = fused_bwd_rows_base;
static an_stream_fn g_stream = stream_rows_base;
static an_mhc_fn g_mhc = mhc_rows_base;
static an_pwf_fn g_pwf = pw_fwd_rows_base;
static an_pwb_fn g_pwb = pw_bwd_rows_base;
static an_attn_fn g_attn = attn_rows_base;
static an_hyper_fn g_hyper = hyper_rows_base;
/* whole rows converted between a 16-bit dtype and float32 (the host's parameters and parameter gradients): the
 * picked instruction set's, whose float16 conversions are F16C's -- this file's own code is built for the
 * baseline, where a float16 value converts through a library call (8-10 us for a 768-wide weight and bias: a
 * float16 LayerNorm call at 64 x 768 took 26 us against bfloat16's 15) */
typedef void (*an_row_fn)(void *, const void *, int64_t, int);
static void an_load_row_base(void *d, const void *s, int64_t n, int dt) { load_row_base((float *)d, s, n, dt); }
static void an_store_row_base(void *d, const void *s, int64_t n, int dt) { store_row_base(d, (const float *)s, n, dt); }
#if defined(__x86_64__)
static void an_load_row_avx2(void *d, const void *s, int64_t n, int dt) { load_row_avx2((float *)d, s, n, dt); }
static void an_store_row_avx2(void *d, const void *s, int64_t n, int dt) { store_row_avx2(d, (const float *)s, n, dt); }
static void an_load_row_avx512(void *d, const void *s, int64_t n, int dt) { load_row_avx512((float *)d, s, n, dt); }
static void an_store_row_avx512(void *d, const void *s, int64_t n, int dt) {
    store_row_avx512(d, (const float *)s, n, dt);
}
#endif
static an_row_fn g_load_row = an_load_row_base, g_store_row = an_store_row_base;
static int g_isa = 0; /* 0 baseline, 1 avx2, 2 avx512, 3 avx512 with AVX512_BF16's conversions */

static void an_pick_isa(void) {
    static int done = 0;
    if (done) return;
#if defined(__x86_64__)
    __builtin_cpu_init();
    g_swpf = !__builtin_cpu_is("amd");
    /* ADDNORM_CPU_ISA=avx512|avx2|baseline caps the instruction set, native leaves the best (for tests and
     * comparisons; library.py refuses any other value by name; avx512: without
     * AVX512_BF16's conversions, as on CPUs that lack them) */
    const char *cap = getenv("ADDNORM_CPU_ISA");
    int max_isa = cap == NULL                  ? 3
                  : strcmp(cap, "avx512") == 0 ? 2
                  : strcmp(cap, "avx2") == 0   ? 1
                  : strcmp(cap, "baseline") == 0 ? 0
                                                 : 3;
    if (max_isa >= 1 && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c")) {
        g_fwd = fwd_rows_avx2;
        g_bwd = bwd_rows_avx2;
        g_ffwd = fused_fwd_rows_avx2;
        g_fbwd = fused_bwd_rows_avx2;
        g_stream = stream_rows_avx2;
        g_mhc = mhc_rows_avx2;
        g_pwf = pw_fwd_rows_avx2;
        g_pwb = pw_bwd_rows_avx2;
        g_attn = attn_rows_avx2;
        g_hyper = hyper_rows_avx2;
        g_load_row = an_load_row_avx2;
        g_store_row = an_store_row_avx2;
        g_isa = 1;
    }
    if (max_isa >= 2 && g_isa == 1 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq")) {
        g_fwd = fwd_rows_avx512;
        g_bwd = bwd_rows_avx512;
        g_ffwd = fused_fwd_rows_avx512;
        g_fbwd = fused_bwd_rows_avx512;
        g_stream = stream_rows_avx512;
        g_mhc = mhc_rows_avx512;
        g_pwf = pw_fwd_rows_avx512;
        g_pwb = pw_bwd_rows_avx512;
        g_attn = attn_rows_avx512;
        g_hyper = hyper_rows_avx512;
        g_load_row = an_load_row_avx512;
        g_store_row = an_store_row_avx512;
        g_isa = 2;
    }
    if (max_isa >= 3 && g_isa == 2 && __builtin_cpu_supports("avx512bf16")) {
        g_bf16_native = 1;
        g_isa = 3;
    }
#endif
    const char *pf = getenv("ADDNORM_CPU_PREFETCH"); /* on every CPU (library.py refuses other values) */
    if (pf != NULL && (strcmp(pf, "0") == 0 || strcmp(pf, "1") == 0)) g_swpf = pf[0] == '1';
    done = 1;
}

/* ---- a minimal fork/join over row chunks ---- */

typedef struct {
    int kind; /* 0 fwd, 1 bwd, 2 fused fwd, 3 fused bwd, 4 widened stream, 5/6 DyT-Derf fwd/bwd, 7 mHC pre,
               * 8 AttnRes, 9 Qwen4-exp's gated read */
    int chunk;
    const void *args;
    int64_t r0, r1;
    int64_t D;
    double *partial_w, *partial_b; /* this chunk's float64 partial sums (bwd) */
    double *partial[4];            /* fused bwd: dw1, db1, dw2, db2 */
    int f32_partials;              /* see an_f32_partials */
    int status;
} an_task;

/* Scratch rows are spaced so that no two of them -- nor any of them and a page-aligned input row --
 * share their address modulo 4 KiB: otherwise loads wait on unrelated stores ("4K aliasing"),
 * which halved the speed of the backward pass. */
#define AN_PAGE 4096
static size_t an_row_stride(int64_t D) { return ((size_t)D * 4 + AN_PAGE - 1) / AN_PAGE * AN_PAGE + 704; }

/* Scratch memory is kept per thread between calls (OpenMP's workers and the calling thread live on),
 * so a small call costs no allocation; blocks above AN_CACHE_MAX are allocated per call instead, so a
 * huge row size leaves nothing large behind, and a thread's blocks are freed when the thread exits. */
#define AN_CACHE_MAX ((size_t)4 << 20)
typedef struct {
    void *base;
    size_t size;
} an_cache;
typedef struct {
    an_cache task, host; /* a chunk's rows; the calling thread's parameter and partial-sum rows */
} an_caches;
static __thread an_caches tl_caches;
#define tl_task_cache (tl_caches.task)
#define tl_host_cache (tl_caches.host)
static pthread_key_t an_exit_key;
static pthread_once_t an_exit_once = PTHREAD_ONCE_INIT;

static void an_caches_free(void *p) {
    an_caches *c = (an_caches *)p;
    free(c->task.base);
    free(c->host.base);
    memset(c, 0, sizeof *c);
}

static void an_exit_key_init(void) { (void)pthread_key_create(&an_exit_key, an_caches_free); }

/* At least `bytes` page-aligned bytes; *owned is set when the block must be freed by the caller. */
static char *an_scratch(an_cache *c, size_t bytes, void **owned) {
    *owned = NULL;
    if (bytes > AN_CACHE_MAX) {
        if (posix_memalign(owned, AN_PAGE, bytes) != 0) return NULL;
        return (char *)*owned;
    }
    if (c->size < bytes) {
        /* first block of this thread: have it freed at thread exit */
        if (tl_caches.task.base == NULL && tl_caches.host.base == NULL) {
            pthread_once(&an_exit_once, an_exit_key_init);
            pthread_setspecific(an_exit_key, &tl_caches);
        }
        free(c->base);
        c->base = NULL;
        c->size = 0;
        size_t want = bytes < AN_CACHE_MAX / 4 ? AN_CACHE_MAX / 4 : bytes;
        if (posix_memalign(&c->base, AN_PAGE, want) != 0) return NULL;
        c->size = want;
    }
    return (char *)c->base;
}

static inline float *an_row(float *rows, int64_t D, int i) { return (float *)((char *)rows + an_row_stride(D) * (size_t)i); }
/* a float64 row of D takes two float32 row slots */
static inline double *an_drow(double *rows, int64_t D, int i) {
    return (double *)((char *)rows + 2 * an_row_stride(D) * (size_t)i);
}

static void *an_run_task(void *p) {
    an_task *t = (an_task *)p;
    void *owned;
    /* 17 rows: r[0..13], ones, zeros, nzeros; the first starts 256 bytes into its page (see an_row_stride);
     * then mHC's fixed-size buffers */
    const size_t rows_bytes = 256 + an_row_stride(t->D) * 17;
    const size_t mhc_bytes = t->kind == 7 ? sizeof(float) * AN_MHC_SCRATCH_FLOATS : 0;
    char *block = an_scratch(&tl_task_cache, rows_bytes + mhc_bytes, &owned);
    if (!block) { t->status = -1; return NULL; }
    float *rows = (float *)(block + 256);
    an_rows sc;
    sc.mhc = mhc_bytes ? (float *)(block + rows_bytes) : NULL;
    for (int i = 0; i < 14; i++) sc.r[i] = an_row(rows, t->D, i);
    int filled[3] = {0, 0, 0};
    for (int k = 0; k < 3; k++) sc.consts[k] = an_row(rows, t->D, 14 + k);
    sc.filled = filled;
    sc.D = t->D;
    sc.f32_partials = t->f32_partials;
    if (t->kind == 0) g_fwd((const an_fwd_args *)t->args, t->r0, t->r1, &sc);
    else if (t->kind == 1) g_bwd((const an_bwd_args *)t->args, t->r0, t->r1, &sc, t->partial_w, t->partial_b);
    else if (t->kind == 2) g_ffwd((const an_ffwd_args *)t->args, t->r0, t->r1, &sc);
    else if (t->kind == 3) g_fbwd((const an_fbwd_args *)t->args, t->r0, t->r1, &sc, t->partial);
    else if (t->kind == 4) g_stream((const an_stream_args *)t->args, t->r0, t->r1, &sc);
    else if (t->kind == 7) g_mhc((const an_mhc_args *)t->args, t->r0, t->r1, &sc, t->chunk);
    else if (t->kind == 8) g_attn((const an_attn_args *)t->args, t->r0, t->r1, &sc, t->partial_w);
    else if (t->kind == 9) g_hyper((const an_hyper_args *)t->args, t->r0, t->r1, &sc, t->chunk);
    else if (t->kind == 5) g_pwf((const an_pw_args *)t->args, t->r0, t->r1, &sc);
    else g_pwb((const an_pw_args *)t->args, t->r0, t->r1, &sc, t->partial);
#if defined(__x86_64__)
    _mm_sfence(); /* this thread's streamed stores are visible before it reports done */
#endif
    free(owned);
    t->status = 0;
    return NULL;
}

typedef struct {
    an_task *tasks;
    int C, T, t;
} an_stride;

static void *an_run_strided(void *p) {
    an_stride *s = (an_stride *)p;
    for (int c = s->t; c < s->C; c += s->T) an_run_task(&s->tasks[c]);
    return NULL;
}

/* Rows are cut into C chunks, C fixed by the thread count and the size (an_chunks_for), and the
 * threads take chunks in turn: a thread that the machine slows down (another process, a vCPU being
 * descheduled) leaves its remaining chunks to the others instead of making every call wait for it.
 * Which thread runs a chunk does not change any result: partial sums are kept per chunk. */
/* Backward's per-chunk parameter-gradient rows hold float32 sums, not float64, when every chunk is a single block of
 * at most AN_BLOCK rows (norm_rows.h): its float32 block sums are then exact as they are. The caller zeroes D floats
 * of each partial row and reads them back as float32 (an_reduce_partials). */
static int an_f32_partials(int64_t N, int C) { return (N + C - 1) / C <= AN_BLOCK; }

static int an_parallel(int kind, const void *args, int64_t N, int64_t D, int nthreads, int C, double *partial_w,
                       double *partial_b, double *const *partial4) {
    an_task local[AN_STACK_TASKS];
    an_task *tasks = C <= AN_STACK_TASKS ? local : (an_task *)malloc(sizeof(an_task) * (size_t)C);
    if (!tasks) return -1;
    for (int c = 0; c < C; c++) {
        tasks[c].kind = kind;
        tasks[c].chunk = c;
        tasks[c].args = args;
        tasks[c].r0 = N * c / C;
        tasks[c].r1 = N * (c + 1) / C;
        tasks[c].D = D;
        tasks[c].partial_w = partial_w ? an_drow(partial_w, D, c) : NULL;
        tasks[c].partial_b = partial_b ? an_drow(partial_b, D, c) : NULL;
        for (int k = 0; k < 4; k++)
            tasks[c].partial[k] = (partial4 && partial4[k]) ? an_drow(partial4[k], D, c) : NULL;
        tasks[c].f32_partials = (kind == 1 || kind == 3 || kind == 6) && an_f32_partials(N, C);
        tasks[c].status = -1;
    }
    int T = nthreads < C ? nthreads : C;
    if (T <= 1) {
        for (int c = 0; c < C; c++) an_run_task(&tasks[c]);
    } else {
#ifdef _OPENMP
        /* OpenMP's pool is torch's own when torch is loaded (same libgomp.so.1): no extra threads
         * compete for the cores, and none are started per call. */
        int next = 0;
#pragma omp parallel num_threads(T)
        {
            int c;
            while ((c = __atomic_fetch_add(&next, 1, __ATOMIC_RELAXED)) < C) an_run_task(&tasks[c]);
        }
#else
        /* without OpenMP: T threads, thread t runs chunks t, t + T, ... (their table on the heap, as the tasks') */
        pthread_t *tids = (pthread_t *)malloc(sizeof(pthread_t) * (size_t)T);
        an_stride *st = (an_stride *)malloc(sizeof(an_stride) * (size_t)T);
        int *started = (int *)calloc((size_t)T, sizeof(int));
        if (tids && st && started) {
            for (int t = 0; t < T; t++) st[t] = (an_stride){tasks, C, T, t};
            for (int t = 1; t < T; t++) started[t] = pthread_create(&tids[t], NULL, an_run_strided, &st[t]) == 0;
            an_run_strided(&st[0]);
            for (int t = 1; t < T; t++) {
                if (started[t]) pthread_join(tids[t], NULL);
                else an_run_strided(&st[t]); /* could not start a thread: run its chunks here */
            }
        }
        free(tids);
        free(st);
        free(started);
#endif
    }
    int rc = 0;
    for (int c = 0; c < C; c++) if (tasks[c].status != 0) rc = -1;
    if (tasks != local) free(tasks);
    return rc;
}

static int an_threads_for(int64_t N, int64_t D, int nthreads) {
    int64_t work = N * D;
    int T = nthreads < 1 ? 1 : nthreads;
    if (T > AN_MAX_THREADS) T = AN_MAX_THREADS;
    if (work < AN_MIN_PARALLEL) T = 1;
    if (T > N) T = N > 0 ? (int)N : 1;
    return T;
}

/* One chunk per thread for work that fits in the caches (a chunk costs ~1 us of setup); above that,
 * AN_CHUNKS_PER_THREAD chunks per thread, so that the load can be balanced. */
static int an_chunks_for(int64_t N, int64_t D, int T) {
    if (T <= 1 || N * D < AN_BALANCE_MIN) return T;
    int64_t C = (int64_t)T * AN_CHUNKS_PER_THREAD;
    if (C > AN_MAX_CHUNKS) C = AN_MAX_CHUNKS;
    if (C > N) C = N;
    return (int)C;
}

/* Stream (non-temporal stores) once the outputs are too big to stay in the last-level cache for the
 * next op anyway; ADDNORM_CPU_NT_BYTES overrides the threshold (0: always, huge: never). */
static int an_use_nt(int64_t N, int64_t D, int dtype, int n_outputs) {
    static int64_t threshold = -1;
    if (threshold < 0) {
        const char *s = getenv("ADDNORM_CPU_NT_BYTES");
        threshold = s ? atoll(s) : ((int64_t)16 << 20);
    }
    return N * D * (int64_t)an_elem_size(dtype) * n_outputs >= threshold;
}

/* Parameters of a 16-bit dtype are converted once per call into float32 rows of the calling thread's
 * scratch (rows 0 and 1 of the host block; rows 2.. hold the per-chunk partial sums of backward). */
static const float *an_param_f32(const void *p, int pdtype, float *row, int64_t D) {
    if (p == NULL || pdtype == AN_F32) return (const float *)p;
    g_load_row(row, p, D, pdtype);
    return row;
}

static float *an_host_rows(int64_t D, int nrows, void **owned) {
    char *block = an_scratch(&tl_host_cache, 2368 + an_row_stride(D) * (size_t)nrows, owned);
    return block ? (float *)(block + 2368) : NULL;
}

/* ---- exported entry points (plain C ABI) ----
 * Tensors are passed as data pointers with a row stride in elements (unit stride along D); x, the
 * residual and the outputs share `dtype`, weight/bias (and their gradients) have `param_dtype`;
 * statistics are float32. Return 0, or -1 when scratch memory could not be allocated. */

int addnorm_isa(void) {
    an_pick_isa();
    return g_isa;
}

/* 1 where the row loops prefetch the rows ahead themselves (g_swpf) */
int addnorm_prefetch(void) {
    an_pick_isa();
    return g_swpf;
}

/* Large fresh outputs: ask for transparent huge pages before the first write, so that the kernel's
 * first touch faults in 2 MiB at a time instead of 4 KiB (glibc hands out every block of 32 MiB or more
 * as fresh mmap'd pages, so without this each such output pays ~8000 page faults per call). A no-op
 * where the OS offers no THP, on pages already touched, and for smaller outputs. */
#define AN_HUGE_MIN ((size_t)32 << 20)
#define AN_HUGE_PAGE ((uintptr_t)2 << 20)
static void an_advise_huge(void *p, size_t bytes) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    if (p == NULL || bytes < AN_HUGE_MIN) return;
    uintptr_t lo = ((uintptr_t)p + AN_HUGE_PAGE - 1) & ~(AN_HUGE_PAGE - 1);
    uintptr_t hi = ((uintptr_t)p + bytes) & ~(AN_HUGE_PAGE - 1);
    if (hi > lo) (void)madvise((void *)lo, hi - lo, MADV_HUGEPAGE);
#else
    (void)p;
    (void)bytes;
#endif
}

/* bytes spanned by N rows of D elements with row stride rs */
static size_t an_span(int64_t N, int64_t D, int64_t rs, int dt) {
    return (size_t)((N - 1) * rs + D) * an_elem_size(dt);
}

int addnorm_forward(int kind, int xdt, int rdt, int odt, int sdt, int64_t N, int64_t D,
                    const void *x, int64_t x_rs, const void *res, int64_t res_rs,
                    const void *weight, const void *bias, int param_dtype, float weight_offset, float eps,
                    int cast_before_weight, void *out, int64_t out_rs, void *res_out, int64_t res_out_rs,
                    float *mean, float *rstd, int nthreads) {
    an_pick_isa();
    if (N <= 0 || D <= 0) return 0;
    if (x == NULL || out == NULL) return -2;
    an_advise_huge(out, an_span(N, D, out_rs, odt));
    if (res_out) an_advise_huge(res_out, an_span(N, D, res_out_rs, sdt));
    void *owned = NULL;
    float *host = NULL;
    if (param_dtype != AN_F32 && (weight || bias) && !(host = an_host_rows(D, 2, &owned))) return -1;
    const float *w = an_param_f32(weight, param_dtype, host, D);
    const float *b = an_param_f32(bias, param_dtype, host ? an_row(host, D, 1) : NULL, D);
    int uniform = xdt == odt && (res == NULL || rdt == xdt) && (res_out == NULL || sdt == xdt);
    an_fwd_args a = {kind, xdt, cast_before_weight, xdt, rdt, odt, sdt, uniform, N, D, x, x_rs, res, res_rs, w, b,
                     weight_offset, eps, out, out_rs, res_out, res_out_rs, mean, rstd,
                     an_use_nt(N, D, odt, res_out ? 2 : 1)};
    int T = an_threads_for(N, D, nthreads);
    int rc = an_parallel(0, &a, N, D, T, an_chunks_for(N, D, T), NULL, NULL, NULL);
    free(owned);
    return rc;
}

/* Sum chunk t's float64 partial row of every element in chunk order (deterministic for a given thread
 * count), then store it in the parameter dtype. */
static void an_reduce_partials(void *dst, int pdtype, double *partials, int C, int64_t D, int f32) {
    float chunk[256]; /* a 16-bit dtype's values, stored 256 at a time by the picked instruction set's store_row */
    for (int64_t i0 = 0; i0 < D; i0 += 256) {
        const int64_t n = D - i0 < 256 ? D - i0 : 256;
        float *v = pdtype == AN_F32 ? (float *)dst + i0 : chunk;
        for (int64_t k = 0; k < n; k++) {
            const int64_t i = i0 + k;
            double acc = 0.0;
            for (int c = 0; c < C; c++) acc += f32 ? (double)((const float *)an_drow(partials, D, c))[i]
                                                   : an_drow(partials, D, c)[i];
            v[k] = (float)acc;
        }
        if (pdtype != AN_F32) g_store_row((uint16_t *)dst + i0, chunk, n, pdtype);
    }
}

int addnorm_backward(int kind, int dydt, int sdt, int dx2dt, int64_t N, int64_t D,
                     const void *dy, int64_t dy_rs, const void *s, int64_t s_rs,
                     const float *mean, const float *rstd, const void *weight, int param_dtype, float weight_offset,
                     const void *dres, int64_t dres_rs, void *dx, int64_t dx_rs, void *dx2, int64_t dx2_rs,
                     void *dweight, void *dbias, int nthreads) {
    an_pick_isa();
    if (D <= 0) return 0;
    if (N <= 0) {
        if (dweight) memset(dweight, 0, an_elem_size(param_dtype) * (size_t)D);
        if (dbias) memset(dbias, 0, an_elem_size(param_dtype) * (size_t)D);
        return 0;
    }
    if (dy == NULL || s == NULL || dx == NULL || rstd == NULL) return -2;
    an_advise_huge(dx, an_span(N, D, dx_rs, sdt));
    if (dx2) an_advise_huge(dx2, an_span(N, D, dx2_rs, dx2dt));
    int T = an_threads_for(N, D, nthreads), C = an_chunks_for(N, D, T);
    void *owned = NULL;
    /* float32 rows: 0 weight as float32, 1 unused, then float64 rows (two slots each): C dweight partials,
     * C dbias partials */
    float *host = an_host_rows(D, 2 + 4 * C, &owned);
    if (!host) return -1;
    double *pw = dweight ? (double *)an_row(host, D, 2) : NULL;
    double *pb = dbias ? (double *)an_row(host, D, 2 + 2 * C) : NULL;
    const int f32p = an_f32_partials(N, C);
    const size_t pbytes = (f32p ? sizeof(float) : sizeof(double)) * (size_t)D;
    for (int c = 0; c < C; c++) { /* the kernels accumulate into zeroed partial rows */
        if (pw) memset(an_drow(pw, D, c), 0, pbytes);
        if (pb) memset(an_drow(pb, D, c), 0, pbytes);
    }
    int uniform = dydt == sdt && dx2 == NULL;
    an_bwd_args a = {kind, sdt, dydt, sdt, dx2dt, uniform, N, D, dy, dy_rs, s, s_rs, mean, rstd,
                     an_param_f32(weight, param_dtype, host, D), weight_offset, dres, dres_rs, dx, dx_rs, dx2, dx2_rs,
                     an_use_nt(N, D, sdt, dx2 ? 2 : 1)};
    int rc = an_parallel(1, &a, N, D, T, C, pw, pb, NULL);
    if (rc == 0 && pw) an_reduce_partials(dweight, param_dtype, pw, C, D, f32p);
    if (rc == 0 && pb) an_reduce_partials(dbias, param_dtype, pb, C, D, f32p);
    free(owned);
    return rc;
}


/* The fused forms (see fused_rows.h). Parameters (w1, b1, w2, b2) share param_dtype; gradients are
 * written in it. Return 0, -1 (no scratch memory) or -2 (a required pointer is NULL). */
int addnorm_fused_forward(int kind, int cast_before_weight, int xdt, int adt, int mdt, int amdt, int sdt, int pdt,
                          int odt, int ndt, int64_t N, int64_t D, const void *x, int64_t x_rs, const void *a,
                          int64_t a_rs, const void *m, int64_t m_rs, const void *post, int64_t post_rs,
                          const void *w1, const void *b1, const void *w2, const void *b2, int param_dtype,
                          float weight_offset, float eps, void *y, int64_t y_rs, void *y2, int64_t y2_rs,
                          void *s_out, int64_t s_rs, float *mean, float *rstd, int nthreads) {
    an_pick_isa();
    if (N <= 0 || D <= 0) return 0;
    if (x == NULL || (y == NULL && y2 == NULL && s_out == NULL)) return -2;
    if (y) an_advise_huge(y, an_span(N, D, y_rs, odt));
    if (y2) an_advise_huge(y2, an_span(N, D, y2_rs, odt));
    if (s_out) an_advise_huge(s_out, an_span(N, D, s_rs, sdt));
    void *owned = NULL;
    float *host = NULL;
    if (param_dtype != AN_F32 && (w1 || b1 || w2 || b2) && !(host = an_host_rows(D, 4, &owned))) return -1;
    const float *p[4];
    const void *raw[4] = {w1, b1, w2, b2};
    for (int k = 0; k < 4; k++) p[k] = an_param_f32(raw[k], param_dtype, host ? an_row(host, D, k) : NULL, D);
    int outs = (y != NULL) + (y2 != NULL) + (s_out != NULL);
    an_ffwd_args args = {kind, cast_before_weight, xdt, adt, mdt, amdt, sdt, pdt, odt, ndt, N, D, x, x_rs, a, a_rs,
                         m, m_rs, post, post_rs, p[0], p[1], p[2], p[3], weight_offset, eps, y, y_rs, y2, y2_rs,
                         s_out, s_rs, mean, rstd, an_use_nt(N, D, odt, outs), 0};
    args.uniform_bf16 = xdt == AN_BF16 && odt == AN_BF16 && ndt == AN_BF16 && (a == NULL || adt == AN_BF16) &&
                        (m == NULL || (mdt == AN_BF16 && amdt == AN_BF16)) && (post == NULL || pdt == AN_BF16) &&
                        (s_out == NULL || sdt == AN_BF16) && (a == NULL || sdt == AN_BF16);
    int T = an_threads_for(N, D, nthreads);
    int rc = an_parallel(2, &args, N, D, T, an_chunks_for(N, D, T), NULL, NULL, NULL);
    free(owned);
    return rc;
}

int addnorm_fused_backward(int kind, int sdt, int dydt, int dy2dt, int dresdt, int odt, int64_t N, int64_t D,
                           const void *s, int64_t s_rs, const float *mean, const float *rstd, const void *dy,
                           int64_t dy_rs, const void *dy2, int64_t dy2_rs, const void *w1, const void *w2,
                           int param_dtype, float weight_offset, const void *dres, int64_t dres_rs, void *ds,
                           int64_t ds_rs, void *dw1, void *db1, void *dw2, void *db2, int nthreads) {
    an_pick_isa();
    if (D <= 0) return 0;
    void *grads[4] = {dw1, db1, dw2, db2};
    if (N <= 0) {
        for (int k = 0; k < 4; k++) if (grads[k]) memset(grads[k], 0, an_elem_size(param_dtype) * (size_t)D);
        return 0;
    }
    if (s == NULL || ds == NULL || rstd == NULL || (dy == NULL && dy2 == NULL)) return -2;
    an_advise_huge(ds, an_span(N, D, ds_rs, odt));
    int T = an_threads_for(N, D, nthreads), C = an_chunks_for(N, D, T);
    void *owned = NULL;
    /* float32 rows 0, 1: the two weights as float32; then per wanted gradient C float64 partial rows */
    int wanted = 0;
    for (int k = 0; k < 4; k++) wanted += grads[k] != NULL;
    float *host = an_host_rows(D, 2 + 2 * C * wanted, &owned);
    if (!host) return -1;
    double *partial[4];
    int slot = 2;
    const int f32p = an_f32_partials(N, C);
    for (int k = 0; k < 4; k++) {
        partial[k] = NULL;
        if (!grads[k]) continue;
        partial[k] = (double *)an_row(host, D, slot);
        slot += 2 * C;
        for (int c = 0; c < C; c++)
            memset(an_drow(partial[k], D, c), 0, (f32p ? sizeof(float) : sizeof(double)) * (size_t)D);
    }
    an_fbwd_args args = {kind, sdt, dydt, dy2dt, dresdt, odt, N, D, s, s_rs, mean, rstd, dy, dy_rs, dy2, dy2_rs,
                         an_param_f32(w1, param_dtype, host, D), an_param_f32(w2, param_dtype, an_row(host, D, 1), D),
                         weight_offset, dres, dres_rs, ds, ds_rs, an_use_nt(N, D, odt, 1), 0};
    args.uniform_bf16 = sdt == AN_BF16 && odt == AN_BF16 && (dy == NULL || dydt == AN_BF16) &&
                        (dy2 == NULL || dy2dt == AN_BF16) && (dres == NULL || dresdt == AN_BF16);
    int rc = an_parallel(3, &args, N, D, T, C, NULL, NULL, partial);
    for (int k = 0; k < 4; k++)
        if (rc == 0 && grads[k]) an_reduce_partials(grads[k], param_dtype, partial[k], C, D, f32p);
    free(owned);
    return rc;
}


/* The widened stream's four kernels (stream_rows.h); tensors contiguous, see an_stream_args. */
int addnorm_stream(int op, int n, int dt, int64_t N, int64_t C, const void *x, const void *y, const void *xin,
                   const void *xout, void *out, void *dy, const float *h_pre, const float *h_post, const float *h_res,
                   float *q, const float *dq, float *d_pre, float *d_post, float *d_res, int nthreads) {
    an_pick_isa();
    if (N <= 0 || C <= 0) return 0;
    if (n < 1 || n > AN_STREAM_MAX_N) return -3;
    if (x == NULL || out == NULL) return -2;
    int64_t rows_out = (op == AN_STREAM_READ) ? N : N * n;
    an_advise_huge(out, (size_t)(rows_out * C) * an_elem_size(dt));
    an_stream_args a = {op, n, dt, an_use_nt(N, (int64_t)n * C, dt, op == AN_STREAM_WRITE_BWD ? 2 : 1), N, C, x, y, xin,
                        xout, out, dy, h_pre, h_post, h_res, q, dq, d_pre, d_post, d_res};
    int T = an_threads_for(N, (int64_t)n * C, nthreads);
    return an_parallel(4, &a, N, C, T, an_chunks_for(N, (int64_t)n * C, T), NULL, NULL, NULL);
}


/* Attention Residuals' depth mix, forward (op 0) and backward (op 1); see an_attn_args and attn_res_rows.h. Backward
 * reduces the chunks' float64 du partial rows in chunk order into du (C, float32): the same bits on every run for a
 * given thread count. Returns 0, -1 (no memory), -2 (a required pointer is NULL), -3 (S outside [1, 64]). */
int addnorm_attn_res(int op, int dt, int S, int64_t N, int64_t C, const void *const *v, const float *u, float eps,
                     void *h, float *alpha, float *rstd, const void *dh, const float *alpha_in, const float *rstd_in,
                     void *const *dv, float *du, int nthreads) {
    an_pick_isa();
    if (S < 1 || S > AN_ATTN_MAX_S) return -3;
    if (C <= 0) return 0;
    if (op == AN_ATTN_BWD && du == NULL) return -2;
    if (N <= 0) {
        if (op == AN_ATTN_BWD) memset(du, 0, sizeof(float) * (size_t)C);
        return 0;
    }
    const int fwd_ok = h != NULL && alpha != NULL && rstd != NULL;
    const int bwd_ok = dh != NULL && alpha_in != NULL && rstd_in != NULL && dv != NULL;
    if (v == NULL || u == NULL || !(op == AN_ATTN_FWD ? fwd_ok : bwd_ok)) return -2;
    an_attn_args a = {op, dt, S, N, C, v, u, eps, h, alpha, rstd, dh, alpha_in, rstd_in, dv};
    int T = an_threads_for(N, (int64_t)S * C, nthreads), nc = an_chunks_for(N, (int64_t)S * C, T);
    if (op == AN_ATTN_FWD) {
        an_advise_huge(h, (size_t)(N * C) * an_elem_size(dt));
        return an_parallel(8, &a, N, C, T, nc, NULL, NULL, NULL);
    }
    void *owned = NULL;
    double *partial = (double *)an_host_rows(C, 2 * nc, &owned); /* a float64 row (two slots) per chunk */
    if (!partial) return -1;
    for (int c = 0; c < nc; c++) memset(an_drow(partial, C, c), 0, sizeof(double) * (size_t)C);
    int rc = an_parallel(8, &a, N, C, T, nc, partial, NULL, NULL);
    if (rc == 0) an_reduce_partials(du, AN_F32, partial, nc, C, 0);
    free(owned);
    return rc;
}


/* mHC's pre step, forward (op 0) and backward (op 1); see an_mhc_args and mhc_rows.h. Backward reduces the
 * chunks' float32 dphi partial sums in chunk order (in float64) into dphi (K, m): the same bits on every run
 * for a given thread count; with dcoef (3 + m floats; NULL: not wanted) also the coefficients' gradients, da_pre,
 * da_post, da_res and then db (m), from the chunks' float64 sums. Returns 0, -1 (no memory), -3 (a shape the kernels
 * do not take). */
static int an_finite(float v) { return v == v && fabsf(v) <= FLT_MAX; }

/* dst (K, mp) = src (m, K) transposed, columns m..mp zero; blocks of 64 k so that dst's lines stay in cache */
static void an_transpose_pad(float *restrict dst, const float *restrict src, int m, int mp, int64_t K) {
    for (int64_t k0 = 0; k0 < K; k0 += 64) {
        const int64_t k1 = k0 + 64 < K ? k0 + 64 : K;
        for (int64_t k = k0; k < k1; k++)
            for (int j = m; j < mp; j++) dst[k * mp + j] = 0.0f;
        for (int j = 0; j < m; j++)
            for (int64_t k = k0; k < k1; k++) dst[k * mp + j] = src[(int64_t)j * K + k];
    }
}

/* dst (m, K) = the first m columns of src (K, mp) transposed; blocks of 64 k so that src's lines stay in cache */
static void an_transpose_cut(float *restrict dst, const float *restrict src, int m, int mp, int64_t K) {
    for (int64_t k0 = 0; k0 < K; k0 += 64) {
        const int64_t k1 = k0 + 64 < K ? k0 + 64 : K;
        for (int j = 0; j < m; j++)
            for (int64_t k = k0; k < k1; k++) dst[(int64_t)j * K + k] = src[k * mp + j];
    }
}

/* the coefficient groups' geometry: m = n (H_pre), 2n (and H_post) or 2n + r (and H_res: n^2 Sinkhorn-Knopp logits,
 * or r >= 1 permutations) */
static int an_mhc_geometry_ok(int n, int m, int mp, int r, int groups, const int32_t *perm) {
    const int want = groups == 1 ? n : groups == 2 ? 2 * n : 2 * n + r;
    if (groups < 1 || groups > 3 || m != want || m > AN_MHC_MAX_M || mp % 8 || mp < m || mp > AN_MHC_MAX_M)
        return 0;
    return groups == 3 ? r >= 1 && (perm != NULL || r == n * n) : r == 0 && perm == NULL;
}

int addnorm_mhc(int op, int n, int dt, int64_t N, int64_t C, int m, int mp, int r, int iters, const void *x,
                const float *phi, const float *phiT, float a_pre, float a_post, float a_res, const float *bias,
                const int32_t *perm, float eps, float pre_eps, float res_eps, int res_t, float post_scale,
                float post_eps, int groups, void *h, float *h_pre, float *h_post, float *h_res, float *p,
                float *rstd, float *st, const void *dh, const float *dh_pre, const float *dh_post,
                const float *dh_res, const float *p_in, const float *rstd_in, const float *st_in, void *dx,
                float *dlogits, float *dphi, float *dcoef, const void *wy, const float *w_post, const float *w_res,
                int w_products, void *x2, const void *wx, const void *dx2, void *wdx, void *wdy, float *wd_post,
                float *wd_res, int nthreads) {
    an_pick_isa();
    const int64_t K = (int64_t)n * C;
    if (n < 1 || n > AN_STREAM_MAX_N || !an_mhc_geometry_ok(n, m, mp, r, groups, perm) || iters < 0 ||
        iters > AN_MHC_MAX_ITERS || C < 1 || op < AN_MHC_FWD || op > AN_MHC_WBWD || !an_finite(pre_eps) ||
        !(res_eps >= 0.0f) || !an_finite(res_eps) || !an_finite(post_scale) || !an_finite(post_eps))
        return -3;
    /* rounds are kept only where Sinkhorn-Knopp runs: not for mHC-lite, nor without H_res (groups < 3) */
    if ((perm != NULL || groups < 3) && (st != NULL || st_in != NULL)) return -3;
    const int bwd = op == AN_MHC_BWD || op == AN_MHC_WBWD;
    if (op == AN_MHC_WFWD && N > 0 && (wy == NULL || w_post == NULL || x2 == NULL)) return -2;
    if (op == AN_MHC_WBWD && N > 0 && (wy == NULL || w_post == NULL || wdx == NULL || wdy == NULL ||
                                       wd_post == NULL || (w_res != NULL && (wx == NULL || wd_res == NULL))))
        return -2;
    if (bwd && dphi) memset(dphi, 0, sizeof(float) * (size_t)K * (size_t)m);
    if (bwd && dcoef) memset(dcoef, 0, sizeof(float) * (size_t)(3 + m));
    if (N <= 0) return 0;
    if (phiT == NULL && phi == NULL) return -2;
    /* phi given only as phiT (m, K), a model's weight as it lies: zero-padded to (K, mp) here, in one pass over it
     * (the host's strided copy of the transposed view took 70-160 us a call, most of a decoding step's read) */
    float *own_phi = NULL;
    if (phi == NULL && !bwd) { /* (the backward reads phiT alone) */
        if (posix_memalign((void **)&own_phi, AN_PAGE, sizeof(float) * (size_t)K * (size_t)mp) != 0) return -1;
        an_transpose_pad(own_phi, phiT, m, mp, K);
        phi = own_phi;
    }
    /* backward: one chunk per thread. Each chunk sums phi's gradient into a partial of its own (K x mp floats, as
     * large as phi), zeroed first and reduced here after: at 512 tokens x 4 x 768 on two threads the 16 chunks that
     * an_chunks_for gives took 16 x 295 KB of partials to zero and to add serially, more than the tokens' work. The
     * partials, and phiT where the backward is handed phi (K, mp) alone (transposed here: torch's copy of the
     * transposed view took about 100 us a call), come from the calling thread's cached block: no pages to fault in
     * each call */
    int T = an_threads_for(N, K, nthreads), Cn = bwd ? T : an_chunks_for(N, K, T);
    void *owned = NULL;
    float *part = NULL;
    double *a_dcoef = NULL;
    if (bwd) {
        const size_t pbytes = sizeof(float) * (size_t)Cn * (size_t)K * (size_t)mp +
                              (dcoef ? sizeof(double) * 2 * (size_t)Cn * (size_t)mp : 0);
        const size_t tbytes = phiT == NULL ? sizeof(float) * (size_t)m * (size_t)K : 0;
        char *block = an_scratch(&tl_host_cache, pbytes + tbytes, &owned);
        if (block == NULL) {
            free(own_phi);
            return -1;
        }
        part = (float *)block;
        if (dcoef) a_dcoef = (double *)(block + sizeof(float) * (size_t)Cn * (size_t)K * (size_t)mp);
        if (phiT == NULL) {
            float *t = (float *)(block + pbytes);
            an_transpose_cut(t, phi, m, mp, K);
            phiT = t;
        }
    }
    an_mhc_args a = {.op = op, .n = n, .dt = dt, .nt = an_use_nt(N, K, dt, op >= AN_MHC_WFWD ? 2 : 1), .m = m,
                     .mp = mp, .r = r, .iters = iters, .N = N, .C = C, .K = K, .x = x, .phi = phi, .phiT = phiT,
                     .a = {a_pre, a_post, a_res}, .bias = bias, .perm = perm, .eps = eps, .pre_eps = pre_eps,
                     .res_eps = res_eps, .res_t = res_t, .post_scale = post_scale, .post_eps = post_eps,
                     .groups = groups, .wy = wy, .w_post = w_post, .w_res = w_res, .w_products = w_products, .x2 = x2,
                     .wx = wx, .dx2 = dx2, .wdx = wdx, .wdy = wdy, .wd_post = wd_post, .wd_res = wd_res,
                     .h = h, .h_pre = h_pre, .h_post = h_post, .h_res = h_res, .p = p, .rstd = rstd, .st = st,
                     .dh = dh, .dh_pre = dh_pre, .dh_post = dh_post, .dh_res = dh_res, .p_in = p_in,
                     .rstd_in = rstd_in, .st_in = st_in, .dx = dx, .dlogits = dlogits, .dphi_part = NULL};
    if (op == AN_MHC_WFWD) an_advise_huge(x2, (size_t)(N * K) * an_elem_size(dt));
    if (op == AN_MHC_WBWD) an_advise_huge(wdx, (size_t)(N * K) * an_elem_size(dt));
    a.dphi_part = part;
    a.dcoef_part = a_dcoef;
    int rc = an_parallel(7, &a, N, K, T, Cn, NULL, NULL, NULL);
    free(own_phi);
    if (rc == 0 && bwd) {
        /* in chunk order, per (k, j): one loop over j for each chunk, so that it vectorises */
        const float *pp = a.dphi_part;
        for (int64_t k = 0; k < K; k++) {
            double s[AN_MHC_MAX_M];
            for (int j = 0; j < m; j++) s[j] = 0.0;
            for (int c = 0; c < Cn; c++) {
                const float *row = pp + ((size_t)c * (size_t)K + (size_t)k) * (size_t)mp;
                for (int j = 0; j < m; j++) s[j] += row[j];
            }
            for (int j = 0; j < m; j++) dphi[k * m + j] = (float)s[j];
        }
        if (dcoef) {
            /* the coefficients' gradients: da_g = sum over the tokens and group g's columns of dlogits * p, db = the
             * sums of dlogits; the chunks' float64 sums in chunk order */
            double sd[AN_MHC_MAX_M], sdp[AN_MHC_MAX_M];
            for (int j = 0; j < m; j++) sd[j] = sdp[j] = 0.0;
            for (int c = 0; c < Cn; c++)
                for (int j = 0; j < m; j++) {
                    sd[j] += a_dcoef[(size_t)c * 2 * mp + j];
                    sdp[j] += a_dcoef[(size_t)c * 2 * mp + mp + j];
                }
            double da[3] = {0.0, 0.0, 0.0};
            for (int j = 0; j < m; j++) da[j < n ? 0 : j < 2 * n ? 1 : 2] += sdp[j];
            for (int g = 0; g < 3; g++) dcoef[g] = (float)da[g];
            for (int j = 0; j < m; j++) dcoef[3 + j] = (float)sd[j];
        }
    }
    free(owned);
    return rc;
}

/* Qwen4-exp's gated read and the write before it (hyper_rows.h; see an_hyper_args). Backward with dw sums each
 * chunk's dw in a float64 partial row (one chunk per thread: K doubles each) and reduces them in chunk order into dw
 * (K floats): the same bits on every run for a given thread count. Returns 0, -1 (no memory), -2 (a required
 * pointer is NULL), -3 (a shape or op the kernels do not take). */
int addnorm_hyper(int op, int n, int dt, int64_t N, int64_t C, int products, const void *x, const void *y,
                  const void *u, const float *w, float off, float eps, const float *h_post, void *out, void *x2,
                  const void *dout, const void *dx2, void *dy, void *du, float *d_post, float *dw, int nthreads) {
    an_pick_isa();
    if (n < 1 || C < 1 || op < AN_HYPER_NORM || op > AN_HYPER_GATE_BWD || dt < AN_F32 || dt > AN_F16) return -3;
    const int64_t K = (int64_t)n * C;
    const int norm = op <= AN_HYPER_WNORM_BWD, write = op == AN_HYPER_WNORM || op == AN_HYPER_WNORM_BWD;
    const int bwd = op == AN_HYPER_NORM_BWD || op == AN_HYPER_WNORM_BWD || op == AN_HYPER_GATE_BWD;
    if (norm && bwd && dw) memset(dw, 0, sizeof(float) * (size_t)K);
    if (N <= 0) return 0;
    if (x == NULL || out == NULL || (norm && w == NULL) || (bwd && dout == NULL) || (write && (y == NULL || h_post == NULL)) ||
        (op == AN_HYPER_WNORM && x2 == NULL) || (op == AN_HYPER_WNORM_BWD && (dy == NULL || d_post == NULL)) ||
        (op >= AN_HYPER_GATE && u == NULL) || (op == AN_HYPER_GATE_BWD && du == NULL))
        return -2;
    const int outs = op == AN_HYPER_WNORM || op == AN_HYPER_GATE_BWD ? 2 : 1;
    an_hyper_args a = {.op = op, .n = n, .dt = dt, .nt = an_use_nt(N, K, dt, outs), .products = products, .N = N,
                       .C = C, .x = x, .y = y, .u = u, .w = w, .off = off, .eps = eps, .h_post = h_post, .out = out,
                       .x2 = x2, .dout = dout, .dx2 = dx2, .dy = dy, .du = du, .d_post = d_post, .dw_part = NULL};
    an_advise_huge(out, (size_t)(op == AN_HYPER_GATE ? N * C : N * K) * an_elem_size(dt));
    if (x2) an_advise_huge(x2, (size_t)(N * K) * an_elem_size(dt));
    if (du) an_advise_huge(du, (size_t)(N * K) * an_elem_size(dt));
    const int with_dw = norm && bwd && dw != NULL;
    int T = an_threads_for(N, K, nthreads), Cn = with_dw ? T : an_chunks_for(N, K, T);
    void *part = NULL;
    if (with_dw) {
        if (posix_memalign(&part, AN_PAGE, sizeof(double) * (size_t)Cn * (size_t)K) != 0) return -1;
        memset(part, 0, sizeof(double) * (size_t)Cn * (size_t)K);
        a.dw_part = (double *)part;
    }
    int rc = an_parallel(9, &a, N, K, T, Cn, NULL, NULL, NULL);
    if (rc == 0 && with_dw)
        for (int64_t k = 0; k < K; k++) {
            double s = 0.0;
            for (int c = 0; c < Cn; c++) s += a.dw_part[(size_t)c * (size_t)K + (size_t)k];
            dw[k] = (float)s;
        }
    free(part);
    return rc;
}

/* DyT / Derf fused with the add (pointwise_rows.h). Forward: y (and s_out) contiguous. Backward: ds contiguous in
 * sdt; dweight / dbias in param_dtype (NULL: unwanted); dscalars[0..1] = (dalpha, dshift) (NULL: unwanted). */
int addnorm_pointwise_forward(int kind, int xdt, int rdt, int sdt, int odt, int64_t N, int64_t D, const void *x,
                              int64_t x_rs, const void *res, int64_t res_rs, const void *weight, const void *bias,
                              int param_dtype, float alpha, float shift, void *y, void *s_out, int nthreads) {
    an_pick_isa();
    if (N <= 0 || D <= 0) return 0;
    if (x == NULL || y == NULL) return -2;
    an_advise_huge(y, (size_t)(N * D) * an_elem_size(odt));
    void *owned = NULL;
    float *host = NULL;
    if (param_dtype != AN_F32 && (weight || bias) && !(host = an_host_rows(D, 2, &owned))) return -1;
    an_pw_args a = {kind, an_use_nt(N, D, odt, s_out ? 2 : 1), xdt, rdt, sdt, odt, 0, 0, N, D, x, x_rs, res, res_rs,
                    an_param_f32(weight, param_dtype, host, D),
                    an_param_f32(bias, param_dtype, host ? an_row(host, D, 1) : NULL, D), alpha, shift, y, s_out,
                    NULL, NULL, 0, NULL, 0, NULL};
    int T = an_threads_for(N, D, nthreads);
    int rc = an_parallel(5, &a, N, D, T, an_chunks_for(N, D, T), NULL, NULL, NULL);
    free(owned);
    return rc;
}

int addnorm_pointwise_backward(int kind, int sdt, int dydt, int dresdt, int64_t N, int64_t D, const void *s,
                               const void *dy, int64_t dy_rs, const void *dres, int64_t dres_rs, const void *weight,
                               int param_dtype, float alpha, float shift, void *ds, void *dweight, void *dbias,
                               double *dscalars, int nthreads) {
    an_pick_isa();
    if (D <= 0) return 0;
    if (dscalars) dscalars[0] = dscalars[1] = 0.0;
    if (N <= 0) {
        if (dweight) memset(dweight, 0, an_elem_size(param_dtype) * (size_t)D);
        if (dbias) memset(dbias, 0, an_elem_size(param_dtype) * (size_t)D);
        return 0;
    }
    if (s == NULL || dy == NULL || ds == NULL) return -2;
    an_advise_huge(ds, (size_t)(N * D) * an_elem_size(sdt));
    int T = an_threads_for(N, D, nthreads), C = an_chunks_for(N, D, T);
    void *owned = NULL;
    /* float32 row 0: the weight as float32; then 2C float64 rows each for dw, db, (dalpha, dshift) */
    float *host = an_host_rows(D, 2 + 6 * C, &owned);
    if (!host) return -1;
    double *partial[4] = {dweight ? (double *)an_row(host, D, 2) : NULL, dbias ? (double *)an_row(host, D, 2 + 2 * C) : NULL,
                          dscalars ? (double *)an_row(host, D, 2 + 4 * C) : NULL, NULL};
    const int f32p = an_f32_partials(N, C); /* dw's and db's rows; the scalars' stay float64 */
    for (int k = 0; k < 3; k++) /* the scalars' row holds two values whatever D is */
        if (partial[k])
            for (int c = 0; c < C; c++)
                memset(an_drow(partial[k], D, c), 0,
                       k == 2 ? 2 * sizeof(double) : (f32p ? sizeof(float) : sizeof(double)) * (size_t)D);
    an_pw_args a = {kind, an_use_nt(N, D, sdt, 1), 0, 0, sdt, sdt, dydt, dresdt, N, D, NULL, 0, NULL, 0,
                    an_param_f32(weight, param_dtype, host, D), NULL, alpha, shift, NULL, NULL, s, dy, dy_rs, dres,
                    dres_rs, ds};
    int rc = an_parallel(6, &a, N, D, T, C, NULL, NULL, partial);
    if (rc == 0 && dweight) an_reduce_partials(dweight, param_dtype, partial[0], C, D, f32p);
    if (rc == 0 && dbias) an_reduce_partials(dbias, param_dtype, partial[1], C, D, f32p);
    if (rc == 0 && dscalars)
        for (int c = 0; c < C; c++) {
            dscalars[0] += an_drow(partial[2], D, c)[0];
            dscalars[1] += an_drow(partial[2], D, c)[1];
        }
    free(owned);
    return rc;
}

/* ---- the Python entry points: the same two functions, called without ctypes' marshalling ----
 * Arguments are positional: ints, floats, and pointers as ints (None for NULL). The GIL is released
 * while the kernel runs. This file uses only CPython's C API, never torch's. */

static int an_parse(PyObject *const *args, Py_ssize_t nargs, const char *fmt, ...) {
    Py_ssize_t n = (Py_ssize_t)strlen(fmt);
    if (nargs != n) {
        PyErr_Format(PyExc_TypeError, "expected %zd arguments, got %zd", n, nargs);
        return -1;
    }
    va_list ap;
    va_start(ap, fmt);
    for (Py_ssize_t k = 0; k < n; k++) {
        PyObject *o = args[k];
        switch (fmt[k]) {
        case 'i': *va_arg(ap, int *) = (int)PyLong_AsLong(o); break;
        case 'L': *va_arg(ap, int64_t *) = (int64_t)PyLong_AsLongLong(o); break;
        case 'f': *va_arg(ap, float *) = (float)PyFloat_AsDouble(o); break;
        case 'p': *va_arg(ap, void **) = o == Py_None ? NULL : PyLong_AsVoidPtr(o); break;
        }
        if (PyErr_Occurred()) {
            va_end(ap);
            return -1;
        }
    }
    va_end(ap);
    return 0;
}

static PyObject *an_py_forward(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    int kind, xdt, rdt, odt, sdt, pdt, cbw, nthreads, rc;
    int64_t N, D, x_rs, res_rs, out_rs, res_out_rs;
    void *x, *res, *w, *b, *out, *res_out, *mean, *rstd;
    float off, eps;
    if (an_parse(args, nargs, "iiiiiLLpLpLppiffipLpLppi", &kind, &xdt, &rdt, &odt, &sdt, &N, &D, &x, &x_rs, &res,
                 &res_rs, &w, &b, &pdt, &off, &eps, &cbw, &out, &out_rs, &res_out, &res_out_rs, &mean, &rstd,
                 &nthreads) < 0)
        return NULL;
    Py_BEGIN_ALLOW_THREADS
    rc = addnorm_forward(kind, xdt, rdt, odt, sdt, N, D, x, x_rs, res, res_rs, w, b, pdt, off, eps, cbw, out, out_rs,
                         res_out, res_out_rs, (float *)mean, (float *)rstd, nthreads);
    Py_END_ALLOW_THREADS
    return PyLong_FromLong(rc);
}

static PyObject *an_py_backward(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    int kind, dydt, sdt, dx2dt, pdt, nthreads, rc;
    int64_t N, D, dy_rs, s_rs, dres_rs, dx_rs, dx2_rs;
    void *dy, *s, *mean, *rstd, *w, *dres, *dx, *dx2, *dw, *db;
    float off;
    if (an_parse(args, nargs, "iiiiLLpLpLpppifpLpLpLppi", &kind, &dydt, &sdt, &dx2dt, &N, &D, &dy, &dy_rs, &s, &s_rs,
                 &mean, &rstd, &w, &pdt, &off, &dres, &dres_rs, &dx, &dx_rs, &dx2, &dx2_rs, &dw, &db, &nthreads) < 0)
        return NULL;
    Py_BEGIN_ALLOW_THREADS
    rc = addnorm_backward(kind, dydt, sdt, dx2dt, N, D, dy, dy_rs, s, s_rs, (const float *)mean, (const float *)rstd,
                          w, pdt, off, dres, dres_rs, dx, dx_rs, dx2, dx2_rs, dw, db, nthreads);
    Py_END_ALLOW_THREADS
    return PyLong_FromLong(rc);
}


static PyObject *an_py_fused_forward(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    int kind, cbw, xdt, adt, mdt, amdt, sdt, pdt, odt, ndt, prm, nthreads, rc;
    int64_t N, D, x_rs, a_rs, m_rs, post_rs, y_rs, y2_rs, s_rs;
    void *x, *a, *m, *post, *w1, *b1, *w2, *b2, *y, *y2, *s_out, *mean, *rstd;
    float off, eps;
    if (an_parse(args, nargs, "iiiiiiiiiiLLpLpLpLpLppppiffpLpLpLppi", &kind, &cbw, &xdt, &adt, &mdt, &amdt, &sdt,
                 &pdt, &odt, &ndt, &N, &D, &x, &x_rs, &a, &a_rs, &m, &m_rs, &post, &post_rs, &w1, &b1, &w2, &b2, &prm,
                 &off, &eps, &y, &y_rs, &y2, &y2_rs, &s_out, &s_rs, &mean, &rstd, &nthreads) < 0)
        return NULL;
    Py_BEGIN_ALLOW_THREADS
    rc = addnorm_fused_forward(kind, cbw, xdt, adt, mdt, amdt, sdt, pdt, odt, ndt, N, D, x, x_rs, a, a_rs, m, m_rs,
                               post, post_rs, w1, b1, w2, b2, prm, off, eps, y, y_rs, y2, y2_rs, s_out, s_rs,
                               (float *)mean, (float *)rstd, nthreads);
    Py_END_ALLOW_THREADS
    return PyLong_FromLong(rc);
}

static PyObject *an_py_fused_backward(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    int kind, sdt, dydt, dy2dt, dresdt, odt, prm, nthreads, rc;
    int64_t N, D, s_rs, dy_rs, dy2_rs, dres_rs, ds_rs;
    void *s, *mean, *rstd, *dy, *dy2, *w1, *w2, *dres, *ds, *dw1, *db1, *dw2, *db2;
    float off;
    if (an_parse(args, nargs, "iiiiiiLLpLpppLpLppifpLpLppppi", &kind, &sdt, &dydt, &dy2dt, &dresdt, &odt, &N, &D, &s,
                 &s_rs, &mean, &rstd, &dy, &dy_rs, &dy2, &dy2_rs, &w1, &w2, &prm, &off, &dres, &dres_rs, &ds, &ds_rs,
                 &dw1, &db1, &dw2, &db2, &nthreads) < 0)
        return NULL;
    Py_BEGIN_ALLOW_THREADS
    rc = addnorm_fused_backward(kind, sdt, dydt, dy2dt, dresdt, odt, N, D, s, s_rs, (const float *)mean,
                                (const float *)rstd, dy, dy_rs, dy2, dy2_rs, w1, w2, prm, off, dres, dres_rs, ds,
                                ds_rs, dw1, db1, dw2, db2, nthreads);
    Py_END_ALLOW_THREADS
    return PyLong_FromLong(rc);
}


static PyObject *an_py_stream(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    int op, n, dt, nthreads, rc;
    int64_t N, C;
    void *x, *y, *xin, *xout, *out, *dy, *hp, *hpo, *hr, *q, *dq, *dpre, *dpost, *dres;
    if (an_parse(args, nargs, "iiiLLppppppppppppppi", &op, &n, &dt, &N, &C, &x, &y, &xin, &xout, &out, &dy, &hp,
                 &hpo, &hr, &q, &dq, &dpre, &dpost, &dres, &nthreads) < 0)
        return NULL;
    Py_BEGIN_ALLOW_THREADS
    rc = addnorm_stream(op, n, dt, N, C, x, y, xin, xout, out, dy, (const float *)hp, (const float *)hpo,
                        (const float *)hr, (float *)q, (const float *)dq, (float *)dpre, (float *)dpost, (float *)dres,
                        nthreads);
    Py_END_ALLOW_THREADS
    return PyLong_FromLong(rc);
}


static PyObject *an_py_mhc(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    int op, n, dt, m, mp, r, iters, nthreads, rc, groups, w_products;
    int64_t N, C;
    int res_t;
    float a_pre, a_post, a_res, eps, pre_eps, res_eps, post_scale, post_eps;
    void *x, *phi, *phiT, *bias, *perm, *h, *hp, *hpo, *hr, *p, *rstd, *st, *dh, *dhp, *dhpo, *dhr, *pin, *rin, *stin,
        *dx, *dl, *dphi, *dcoef, *wy, *wpost, *wres, *x2, *wx, *dx2, *wdx, *wdy, *wdpost, *wdres;
    if (an_parse(args, nargs, "iiiLLiiiipppfffppfffiffipppppppppppppppppppppipppppppi", &op, &n, &dt, &N, &C, &m,
                 &mp, &r, &iters, &x, &phi, &phiT, &a_pre, &a_post, &a_res, &bias, &perm, &eps, &pre_eps, &res_eps,
                 &res_t, &post_scale, &post_eps, &groups, &h, &hp, &hpo, &hr, &p, &rstd, &st, &dh, &dhp, &dhpo, &dhr,
                 &pin, &rin, &stin, &dx, &dl, &dphi, &dcoef, &wy, &wpost, &wres, &w_products, &x2, &wx, &dx2, &wdx,
                 &wdy, &wdpost, &wdres, &nthreads) < 0)
        return NULL;
    Py_BEGIN_ALLOW_THREADS
    rc = addnorm_mhc(op, n, dt, N, C, m, mp, r, iters, x, (const float *)phi, (const float *)phiT, a_pre, a_post, a_res,
                     (const float *)bias, (const int32_t *)perm, eps, pre_eps, res_eps, res_t, post_scale, post_eps,
                     groups, h, (float *)hp, (float *)hpo, (float *)hr, (float *)p, (float *)rstd, (float *)st, dh,
                     (const float *)dhp, (const float *)dhpo, (const float *)dhr, (const float *)pin,
                     (const float *)rin, (const float *)stin, dx, (float *)dl, (float *)dphi, (float *)dcoef, wy,
                     (const float *)wpost, (const float *)wres, w_products, x2, wx, dx2, wdx, wdy, (float *)wdpost,
                     (float *)wdres, nthreads);
    Py_END_ALLOW_THREADS
    return PyLong_FromLong(rc);
}

static PyObject *an_py_attn_res(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    int op, dt, S, nthreads, rc;
    int64_t N, C;
    float eps;
    void *v, *u, *h, *alpha, *rstd, *dh, *ain, *rin, *dv, *du;
    if (an_parse(args, nargs, "iiiLLppfppppppppi", &op, &dt, &S, &N, &C, &v, &u, &eps, &h, &alpha, &rstd, &dh, &ain,
                 &rin, &dv, &du, &nthreads) < 0)
        return NULL;
    Py_BEGIN_ALLOW_THREADS
    rc = addnorm_attn_res(op, dt, S, N, C, (const void *const *)v, (const float *)u, eps, h, (float *)alpha,
                          (float *)rstd, dh, (const float *)ain, (const float *)rin, (void *const *)dv, (float *)du,
                          nthreads);
    Py_END_ALLOW_THREADS
    return PyLong_FromLong(rc);
}

static PyObject *an_py_hyper(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    int op, n, dt, products, nthreads, rc;
    int64_t N, C;
    float off, eps;
    void *x, *y, *u, *w, *hp, *out, *x2, *dout, *dx2, *dy, *du, *dpost, *dw;
    if (an_parse(args, nargs, "iiiLLippppffpppppppppi", &op, &n, &dt, &N, &C, &products, &x, &y, &u, &w, &off, &eps,
                 &hp, &out, &x2, &dout, &dx2, &dy, &du, &dpost, &dw, &nthreads) < 0)
        return NULL;
    Py_BEGIN_ALLOW_THREADS
    rc = addnorm_hyper(op, n, dt, N, C, products, x, y, u, (const float *)w, off, eps, (const float *)hp, out, x2,
                       dout, dx2, dy, du, (float *)dpost, (float *)dw, nthreads);
    Py_END_ALLOW_THREADS
    return PyLong_FromLong(rc);
}

static PyObject *an_py_pw_forward(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    int kind, xdt, rdt, sdt, odt, pdt, nthreads, rc;
    int64_t N, D, x_rs, res_rs;
    void *x, *res, *w, *b, *y, *s_out;
    float alpha, shift;
    if (an_parse(args, nargs, "iiiiiLLpLpLppiffppi", &kind, &xdt, &rdt, &sdt, &odt, &N, &D, &x, &x_rs, &res, &res_rs,
                 &w, &b, &pdt, &alpha, &shift, &y, &s_out, &nthreads) < 0)
        return NULL;
    Py_BEGIN_ALLOW_THREADS
    rc = addnorm_pointwise_forward(kind, xdt, rdt, sdt, odt, N, D, x, x_rs, res, res_rs, w, b, pdt, alpha, shift, y,
                                   s_out, nthreads);
    Py_END_ALLOW_THREADS
    return PyLong_FromLong(rc);
}

static PyObject *an_py_pw_backward(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    int kind, sdt, dydt, dresdt, pdt, nthreads, rc;
    int64_t N, D, dy_rs, dres_rs;
    void *s, *dy, *dres, *w, *ds, *dw, *db, *dsc;
    float alpha, shift;
    if (an_parse(args, nargs, "iiiiLLppLpLpiffppppi", &kind, &sdt, &dydt, &dresdt, &N, &D, &s, &dy, &dy_rs, &dres,
                 &dres_rs, &w, &pdt, &alpha, &shift, &ds, &dw, &db, &dsc, &nthreads) < 0)
        return NULL;
    Py_BEGIN_ALLOW_THREADS
    rc = addnorm_pointwise_backward(kind, sdt, dydt, dresdt, N, D, s, dy, dy_rs, dres, dres_rs, w, pdt, alpha, shift,
                                    ds, dw, db, (double *)dsc, nthreads);
    Py_END_ALLOW_THREADS
    return PyLong_FromLong(rc);
}

static PyObject *an_py_isa(PyObject *self, PyObject *unused) { return PyLong_FromLong(addnorm_isa()); }
static PyObject *an_py_prefetch(PyObject *self, PyObject *unused) { return PyBool_FromLong(addnorm_prefetch()); }

static PyMethodDef an_methods[] = {
    {"forward", (PyCFunction)(void (*)(void))an_py_forward, METH_FASTCALL, "addnorm_forward (see addnorm_cpu.c)"},
    {"backward", (PyCFunction)(void (*)(void))an_py_backward, METH_FASTCALL, "addnorm_backward (see addnorm_cpu.c)"},
    {"fused_forward", (PyCFunction)(void (*)(void))an_py_fused_forward, METH_FASTCALL,
     "addnorm_fused_forward (see addnorm_cpu.c)"},
    {"fused_backward", (PyCFunction)(void (*)(void))an_py_fused_backward, METH_FASTCALL,
     "addnorm_fused_backward (see addnorm_cpu.c)"},
    {"stream", (PyCFunction)(void (*)(void))an_py_stream, METH_FASTCALL, "addnorm_stream (see addnorm_cpu.c)"},
    {"mhc", (PyCFunction)(void (*)(void))an_py_mhc, METH_FASTCALL, "addnorm_mhc (see addnorm_cpu.c)"},
    {"attn_res", (PyCFunction)(void (*)(void))an_py_attn_res, METH_FASTCALL, "addnorm_attn_res (see addnorm_cpu.c)"},
    {"hyper", (PyCFunction)(void (*)(void))an_py_hyper, METH_FASTCALL, "addnorm_hyper (see addnorm_cpu.c)"},
    {"pointwise_forward", (PyCFunction)(void (*)(void))an_py_pw_forward, METH_FASTCALL,
     "addnorm_pointwise_forward (see addnorm_cpu.c)"},
    {"pointwise_backward", (PyCFunction)(void (*)(void))an_py_pw_backward, METH_FASTCALL,
     "addnorm_pointwise_backward (see addnorm_cpu.c)"},
    {"isa", an_py_isa, METH_NOARGS, "the instruction set picked: 0 baseline, 1 avx2, 2 avx512"},
    {"prefetch", an_py_prefetch, METH_NOARGS, "whether the row loops prefetch the rows ahead themselves"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef an_module = {PyModuleDef_HEAD_INIT, "_addnorm_cpu",
                                       "addnorm CPU kernels: fused residual-add + LayerNorm / RMSNorm", -1, an_methods};
PyMODINIT_FUNC PyInit__addnorm_cpu(void) { return PyModule_Create(&an_module); }
