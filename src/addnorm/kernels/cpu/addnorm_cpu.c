/* addnorm's CPU kernels: fused residual-add + LayerNorm / RMSNorm, forward and backward.
 *
 * Design: Add & Norm does ~10 flops per element, so its speed is bytes moved / memory bandwidth.
 * One pass over memory forward (read x, residual; write out, new residual; per-row mean/rstd),
 * one pass backward (read dy, saved sum, incoming residual grad; write dx). Statistics and
 * accumulation in float32 for every storage dtype (float32, bfloat16, float16).
 *
 * ABI: plain C, called through ctypes; nothing here links against torch or Python's C API
 * (the PyInit stub only lets the build system build and install this file as a Python
 * extension, which ctypes then opens as an ordinary shared library).
 *
 * Threads: the caller passes the thread count (torch's); rows are split into that many contiguous
 * chunks, run by OpenMP -- which, with torch loaded, is torch's own libgomp and thread pool, so the
 * kernels never oversubscribe the cores or start threads per call (pthreads when built without
 * OpenMP). Parameter gradients are summed per chunk and then reduced in chunk order, so
 * dweight/dbias have the same bits on every run for a given thread count.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <math.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif
#include <pthread.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

enum { AN_F32 = 0, AN_BF16 = 1, AN_F16 = 2 };
enum { AN_LAYER = 0, AN_RMS = 1 };
#define AN_MAX_THREADS 256
/* fewer elements than this run on one thread: torch's own grain size (at::internal::GRAIN_SIZE) */
#define AN_MIN_PARALLEL 32768

typedef struct {
    int kind, dtype, cast_before_weight;
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

typedef struct {
    int kind, dtype;
    int64_t N, D;
    const void *dy; int64_t dy_rs;
    const void *s; int64_t s_rs;          /* the normalized input (the residual sum) */
    const float *mean, *rstd;             /* mean may be NULL (RMSNorm) */
    const float *weight; float weight_offset;
    const void *dres; int64_t dres_rs;    /* gradient of the new residual, NULL when none */
    void *dx; int64_t dx_rs;
    float *dweight, *dbias;               /* float32 outputs (D), NULL when not wanted */
    int nt;
} an_bwd_args;

/* per-thread float32 scratch rows; ones/zeros stand in for an absent weight/bias/gradient */
typedef struct {
    float *r[6];
    const float *ones, *zeros;
} an_rows;

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

static inline float an_bf16_round(float f) { return an_bf16_to_f32(an_f32_to_bf16(f)); }

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

#if defined(__x86_64__)
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c,prefer-vector-width=512")
#define AN_SFX _avx512
#define AN_F16C 1
#define AN_STREAM_BYTES 64
#include "norm_rows.h"
#undef AN_STREAM_BYTES
#undef AN_SFX
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#define AN_SFX _avx2
#define AN_STREAM_BYTES 32
#include "norm_rows.h"
#undef AN_STREAM_BYTES
#undef AN_SFX
#undef AN_F16C
#pragma GCC pop_options
#endif

#define AN_SFX _base
#include "norm_rows.h"
#undef AN_SFX

typedef void (*an_fwd_fn)(const an_fwd_args *, int64_t, int64_t, const an_rows *);
typedef void (*an_bwd_fn)(const an_bwd_args *, int64_t, int64_t, const an_rows *, float *, float *);

static an_fwd_fn g_fwd = fwd_rows_base;
static an_bwd_fn g_bwd = bwd_rows_base;
static int g_isa = 0; /* 0 baseline, 1 avx2, 2 avx512 */

static void an_pick_isa(void) {
    static int done = 0;
    if (done) return;
#if defined(__x86_64__)
    __builtin_cpu_init();
    /* ADDNORM_CPU_ISA=avx2|baseline caps the instruction set (for tests and comparisons) */
    const char *cap = getenv("ADDNORM_CPU_ISA");
    int max_isa = cap == NULL ? 2 : strcmp(cap, "avx2") == 0 ? 1 : strcmp(cap, "baseline") == 0 ? 0 : 2;
    if (max_isa >= 1 && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c")) {
        g_fwd = fwd_rows_avx2;
        g_bwd = bwd_rows_avx2;
        g_isa = 1;
    }
    if (max_isa >= 2 && g_isa == 1 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq")) {
        g_fwd = fwd_rows_avx512;
        g_bwd = bwd_rows_avx512;
        g_isa = 2;
    }
#endif
    done = 1;
}

/* ---- a minimal fork/join over row chunks ---- */

typedef struct {
    int kind; /* 0 fwd, 1 bwd */
    const void *args;
    int64_t r0, r1;
    int64_t D;
    float *partial_w, *partial_b; /* this chunk's float32 partial sums (bwd) */
    int status;
} an_task;

/* Scratch rows are spaced so that no two of them -- nor any of them and a page-aligned input row --
 * share their address modulo 4 KiB: otherwise loads wait on unrelated stores ("4K aliasing"),
 * which halved the speed of the backward pass. */
#define AN_PAGE 4096
static size_t an_row_stride(int64_t D) { return ((size_t)D * 4 + AN_PAGE - 1) / AN_PAGE * AN_PAGE + 704; }

static float *an_alloc_rows(void **base, int nrows, int64_t D, size_t first_offset) {
    size_t stride = an_row_stride(D);
    if (posix_memalign(base, AN_PAGE, first_offset + stride * (size_t)nrows + AN_PAGE) != 0) return NULL;
    memset((char *)*base + first_offset, 0, stride * (size_t)nrows);
    return (float *)((char *)*base + first_offset);
}

static inline float *an_row(float *rows, int64_t D, int i) { return (float *)((char *)rows + an_row_stride(D) * (size_t)i); }

static void *an_run_task(void *p) {
    an_task *t = (an_task *)p;
    void *base;
    float *rows = an_alloc_rows(&base, 8, t->D, 256); /* zero-filled */
    if (!rows) { t->status = -1; return NULL; }
    an_rows sc;
    for (int i = 0; i < 6; i++) sc.r[i] = an_row(rows, t->D, i);
    float *ones = an_row(rows, t->D, 6);
    for (int64_t i = 0; i < t->D; i++) ones[i] = 1.0f;
    sc.ones = ones;
    sc.zeros = an_row(rows, t->D, 7);
    if (t->kind == 0) g_fwd((const an_fwd_args *)t->args, t->r0, t->r1, &sc);
    else g_bwd((const an_bwd_args *)t->args, t->r0, t->r1, &sc, t->partial_w, t->partial_b);
#if defined(__x86_64__)
    _mm_sfence(); /* this thread's streamed stores are visible before it reports done */
#endif
    free(base);
    t->status = 0;
    return NULL;
}

static int an_parallel(int kind, const void *args, int64_t N, int64_t D, int nthreads, float *partial_w, float *partial_b) {
    an_task tasks[AN_MAX_THREADS];
    int T = nthreads;
    for (int t = 0; t < T; t++) {
        tasks[t].kind = kind;
        tasks[t].args = args;
        tasks[t].r0 = N * t / T;
        tasks[t].r1 = N * (t + 1) / T;
        tasks[t].D = D;
        tasks[t].partial_w = partial_w ? an_row(partial_w, D, t) : NULL;
        tasks[t].partial_b = partial_b ? an_row(partial_b, D, t) : NULL;
        tasks[t].status = -1;
    }
    if (T == 1) {
        an_run_task(&tasks[0]);
    } else {
#ifdef _OPENMP
        /* OpenMP's pool is torch's own when torch is loaded (same libgomp.so.1): no extra threads
         * compete for the cores, and none are started per call. Chunks are fixed by T, not by which
         * thread runs them, so results do not depend on scheduling. */
#pragma omp parallel num_threads(T)
        {
            for (int t = omp_get_thread_num(); t < T; t += omp_get_num_threads()) an_run_task(&tasks[t]);
        }
#else
        pthread_t tids[AN_MAX_THREADS];
        int started[AN_MAX_THREADS];
        for (int t = 1; t < T; t++) started[t] = pthread_create(&tids[t], NULL, an_run_task, &tasks[t]) == 0;
        an_run_task(&tasks[0]);
        for (int t = 1; t < T; t++) {
            if (started[t]) pthread_join(tids[t], NULL);
            else an_run_task(&tasks[t]); /* could not start a thread: run its chunk here */
        }
#endif
    }
    for (int t = 0; t < T; t++) if (tasks[t].status != 0) return -1;
    return 0;
}

static int an_threads_for(int64_t N, int64_t D, int nthreads) {
    int64_t work = N * D;
    int T = nthreads < 1 ? 1 : nthreads;
    if (T > AN_MAX_THREADS) T = AN_MAX_THREADS;
    if (work < AN_MIN_PARALLEL) T = 1;
    if (T > N) T = N > 0 ? (int)N : 1;
    return T;
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

/* ---- exported entry points (plain C ABI) ---- */

int addnorm_isa(void) {
    an_pick_isa();
    return g_isa;
}

int addnorm_forward(int kind, int dtype, int64_t N, int64_t D,
                    const void *x, int64_t x_rs, const void *res, int64_t res_rs,
                    const float *weight, const float *bias, float weight_offset, float eps, int cast_before_weight,
                    void *out, int64_t out_rs, void *res_out, int64_t res_out_rs,
                    float *mean, float *rstd, int nthreads) {
    an_pick_isa();
    if (N <= 0 || D <= 0) return 0;
    an_fwd_args a = {kind, dtype, cast_before_weight, N, D, x, x_rs, res, res_rs, weight, bias,
                     weight_offset, eps, out, out_rs, res_out, res_out_rs, mean, rstd,
                     an_use_nt(N, D, dtype, res_out ? 2 : 1)};
    return an_parallel(0, &a, N, D, an_threads_for(N, D, nthreads), NULL, NULL);
}

int addnorm_backward(int kind, int dtype, int64_t N, int64_t D,
                     const void *dy, int64_t dy_rs, const void *s, int64_t s_rs,
                     const float *mean, const float *rstd, const float *weight, float weight_offset,
                     const void *dres, int64_t dres_rs, void *dx, int64_t dx_rs,
                     float *dweight, float *dbias, int nthreads) {
    an_pick_isa();
    if (dweight) memset(dweight, 0, sizeof(float) * (size_t)(D > 0 ? D : 0));
    if (dbias) memset(dbias, 0, sizeof(float) * (size_t)(D > 0 ? D : 0));
    if (N <= 0 || D <= 0) return 0;
    int T = an_threads_for(N, D, nthreads);
    void *pw_base = NULL, *pb_base = NULL;
    float *pw = NULL, *pb = NULL;
    if (dweight && !(pw = an_alloc_rows(&pw_base, T, D, 2368))) return -1;
    if (dbias && !(pb = an_alloc_rows(&pb_base, T, D, 3072))) { free(pw_base); return -1; }
    an_bwd_args a = {kind, dtype, N, D, dy, dy_rs, s, s_rs, mean, rstd, weight, weight_offset, dres, dres_rs, dx, dx_rs,
                     dweight, dbias, an_use_nt(N, D, dtype, 1)};
    int rc = an_parallel(1, &a, N, D, T, pw, pb);
    /* fixed-order reduction of the per-chunk partial sums: deterministic for a given T */
    for (int t = 0; t < T && rc == 0; t++) {
        if (pw) for (int64_t i = 0; i < D; i++) dweight[i] += an_row(pw, D, t)[i];
        if (pb) for (int64_t i = 0; i < D; i++) dbias[i] += an_row(pb, D, t)[i];
    }
    free(pw_base);
    free(pb_base);
    return rc;
}

/* The build system builds Python extensions; this stub makes the file one. */
static struct PyModuleDef an_module = {PyModuleDef_HEAD_INIT, "_addnorm_cpu",
                                       "addnorm CPU kernels (plain C ABI, loaded with ctypes)", -1, NULL};
PyMODINIT_FUNC PyInit__addnorm_cpu(void) { return PyModule_Create(&an_module); }
