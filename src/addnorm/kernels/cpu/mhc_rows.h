/* Row kernels of mHC's pre step (mHC, arXiv:2512.24880; mHC-lite, arXiv:2601.05732): per token, from the
 * stream X (n rows of C, K = nC values v), in one pass over X:
 *
 *   forward   rstd = 1/sqrt(|v|^2/K + eps),  p = (v phi) rstd                     (m = 2n + r values)
 *             logits = a_g p + bias  (a_g: a_pre on p[:n], a_post on p[n:2n], a_res on p[2n:])
 *             H_pre = sigmoid, H_post = 2 sigmoid, H_res = Sinkhorn-Knopp (r = n^2) or the softmax-weighted
 *             sum of the n! permutation matrices (mHC-lite, r = n!),   h = sum_i H_pre[i] X_i
 *             and (mHC) Sinkhorn-Knopp's rounds, kept for the backward (st: M0, then per round A, r, c)
 *   backward  dlogits = the coefficient maps' backward (g_pre[i] = <dh, X_i> + dH_pre[i]; Sinkhorn through
 *             every round -- the forward's, when it kept them --, its max shift a constant);
 *             dp = a_g dlogits,  dz = dp rstd
 *             dX = H_pre (x) dh + phi dz - (rstd^2 / K)(dp . p) v;   dphi += v^T dz  (per chunk)
 *   a model's convention (ops/mhc/convention.py, DeepSeek-V4's): H_pre + pre_eps; Sinkhorn's first round's
 *             column-normalised matrix + res_eps and every later sum + res_eps; res_t: the logits of H_res
 *             transposed before Sinkhorn (their gradient transposed back); H_post = post_scale sigmoid + post_eps;
 *             groups: 2 makes no H_res (HY-V4's iHC, m = 2n), 1 H_pre alone (a final collapse, m = n). The
 *             rounds kept are the convention's (res_eps in r and c, of the logits as Sinkhorn took them): those
 *             a backward handed none would recompute; groups < 3 has no Sinkhorn and keeps none
 *   write+read (WFWD) the write of the stream before the read, in the same walk over each token: X'_i =
 *             H_post[i] y + sum_j H_res[i, j] X_j (n = 2 and 4 in float32 and bfloat16 by the stream write's own
 *             row loop, so X' has its bits; else in the stream kernels' general order), or X_i + H_post[i] y
 *             without a mixing matrix (each stream its own: an inf stays in its stream), rounded to the storage
 *             dtype, stored, and read from its float32 values as the forward reads X (its rounds kept where st is
 *             given, as the forward keeps them)
 *   its backward (WBWD) the read's backward on X' (its rounds as the forward kept them, or recomputed), its dX'
 *             kept in float32 and added to the dX' given, then the write's backward from that sum in the same walk
 *             over each token (dX = g, or H_res^T g; dy = sum_i H_post[i] g_i; dH_post[i] = <g_i, y>;
 *             dH_res[i, j] = <g_i, X_j>; n = 2 and 4 by the stream write's backward loop)
 *
 * The projection is a small GEMM done here on tiles of AN_MHC_TB tokens, phi zero-padded to mp (a multiple
 * of 8) columns so that the accumulators of a tile stay in registers, its products added by fused multiply-adds
 * (AN_MAD) where the instruction set has them; the tile's rows are converted to
 * float32 once and stay in cache for the norm, the projection, h and (backward) dX. Every sum in float32,
 * each output rounded once. Included per instruction set after norm_rows.h.
 */

#define AN_CAT2(a, b) a##b
#define AN_CAT(a, b) AN_CAT2(a, b)
#define AN_FN(name) AN_CAT(name, AN_SFX)
#define AN_MHC_TB AN_MHC_TILE
#define AN_MHC_KB 32

#ifndef AN_MHC_PF_DEFINED
#define AN_MHC_PF_DEFINED
/* What a projection loop asks for into L2 while it runs: the next tile's rows (its stream rows, its dh and kept
 * rounds), spread over the loop's K steps -- the lines of span i at step k up to k * bytes[i] / K, each 16 steps.
 * The tile's own rows are read at its start; without this their misses (the stream is read once and does not fit
 * in cache) waited on memory between the tiles' arithmetic. */
typedef struct {
    const char *p[AN_MHC_TILE + 2];
    size_t bytes[AN_MHC_TILE + 2];
    int n;
} an_mhc_pf;

static inline void an_mhc_pf_add(an_mhc_pf *pf, const void *p, size_t bytes) {
    if (p && bytes) pf->p[pf->n] = (const char *)p, pf->bytes[pf->n++] = bytes;
}

static inline void an_mhc_pf_at(const an_mhc_pf *pf, int64_t k, int64_t K) {
    for (int i = 0; i < pf->n; i++) __builtin_prefetch(pf->p[i] + (size_t)k * pf->bytes[i] / (size_t)K, 0, 2);
}
#endif

/* out[t][0..MP) = sum_k v_t[k] phi[k][0..MP), for the AN_MHC_TB tokens of a tile */
#define AN_MHC_PROJECT(MP)                                                                                       \
    static void AN_FN(mhc_project_##MP)(const float *const *v, const float *restrict phi, int64_t K,            \
                                        float *restrict out, const an_mhc_pf *pf) {                             \
        float a0[MP] = {0}, a1[MP] = {0}, a2[MP] = {0}, a3[MP] = {0};                                           \
        const float *restrict v0 = v[0], *restrict v1 = v[1], *restrict v2 = v[2], *restrict v3 = v[3];          \
        for (int64_t k = 0; k < K; k++) {                                                                       \
            if (pf->n && (k & 15) == 0) an_mhc_pf_at(pf, k, K);                                                 \
            const float *restrict ph = phi + k * MP;                                                            \
            const float x0 = v0[k], x1 = v1[k], x2 = v2[k], x3 = v3[k];                                         \
            for (int j = 0; j < MP; j++) {                                                                      \
                a0[j] = AN_MAD(x0, ph[j], a0[j]);                                                               \
                a1[j] = AN_MAD(x1, ph[j], a1[j]);                                                               \
                a2[j] = AN_MAD(x2, ph[j], a2[j]);                                                               \
                a3[j] = AN_MAD(x3, ph[j], a3[j]);                                                               \
            }                                                                                                   \
        }                                                                                                       \
        memcpy(out, a0, sizeof a0);                                                                             \
        memcpy(out + MP, a1, sizeof a1);                                                                        \
        memcpy(out + 2 * MP, a2, sizeof a2);                                                                    \
        memcpy(out + 3 * MP, a3, sizeof a3);                                                                    \
    }                                                                                                           \
    /* dphi[k][0..MP) += sum_t v_t[k] dz_t[0..MP) */                                                            \
    static void AN_FN(mhc_dphi_##MP)(const float *const *v, const float *restrict dz, int64_t K,                \
                                     float *restrict dphi, const an_mhc_pf *pf) {                               \
        float z0[MP], z1[MP], z2[MP], z3[MP];                                                                   \
        memcpy(z0, dz, sizeof z0);                                                                              \
        memcpy(z1, dz + MP, sizeof z1);                                                                         \
        memcpy(z2, dz + 2 * MP, sizeof z2);                                                                     \
        memcpy(z3, dz + 3 * MP, sizeof z3);                                                                     \
        const float *restrict v0 = v[0], *restrict v1 = v[1], *restrict v2 = v[2], *restrict v3 = v[3];          \
        for (int64_t k = 0; k < K; k++) {                                                                       \
            if (pf->n && (k & 15) == 0) an_mhc_pf_at(pf, k, K);                                                 \
            float *restrict d = dphi + k * MP;                                                                  \
            const float x0 = v0[k], x1 = v1[k], x2 = v2[k], x3 = v3[k];                                         \
            for (int j = 0; j < MP; j++)                                                                        \
                d[j] = AN_MAD(x3, z3[j], AN_MAD(x2, z2[j], AN_MAD(x1, z1[j], AN_MAD(x0, z0[j], d[j]))));        \
        }                                                                                                       \
    }

AN_MHC_PROJECT(8)
AN_MHC_PROJECT(16)
AN_MHC_PROJECT(24)
AN_MHC_PROJECT(32)
AN_MHC_PROJECT(40)
AN_MHC_PROJECT(48)
AN_MHC_PROJECT(56)
AN_MHC_PROJECT(64)
AN_MHC_PROJECT(72)
AN_MHC_PROJECT(80)
AN_MHC_PROJECT(88)
AN_MHC_PROJECT(96)
AN_MHC_PROJECT(104)
AN_MHC_PROJECT(112)
AN_MHC_PROJECT(120)
AN_MHC_PROJECT(128)
#undef AN_MHC_PROJECT

typedef void (*AN_FN(mhc_project_fn))(const float *const *, const float *, int64_t, float *, const an_mhc_pf *);
typedef void (*AN_FN(mhc_dphi_fn))(const float *const *, const float *, int64_t, float *, const an_mhc_pf *);

static AN_FN(mhc_project_fn) AN_FN(mhc_project_for)(int mp) {
    switch (mp) {
    case 8: return AN_FN(mhc_project_8);
    case 16: return AN_FN(mhc_project_16);
    case 24: return AN_FN(mhc_project_24);
    case 32: return AN_FN(mhc_project_32);
    case 40: return AN_FN(mhc_project_40);
    case 48: return AN_FN(mhc_project_48);
    case 56: return AN_FN(mhc_project_56);
    case 64: return AN_FN(mhc_project_64);
    case 72: return AN_FN(mhc_project_72);
    case 80: return AN_FN(mhc_project_80);
    case 88: return AN_FN(mhc_project_88);
    case 96: return AN_FN(mhc_project_96);
    case 104: return AN_FN(mhc_project_104);
    case 112: return AN_FN(mhc_project_112);
    case 120: return AN_FN(mhc_project_120);
    default: return AN_FN(mhc_project_128);
    }
}

static AN_FN(mhc_dphi_fn) AN_FN(mhc_dphi_for)(int mp) {
    switch (mp) {
    case 8: return AN_FN(mhc_dphi_8);
    case 16: return AN_FN(mhc_dphi_16);
    case 24: return AN_FN(mhc_dphi_24);
    case 32: return AN_FN(mhc_dphi_32);
    case 40: return AN_FN(mhc_dphi_40);
    case 48: return AN_FN(mhc_dphi_48);
    case 56: return AN_FN(mhc_dphi_56);
    case 64: return AN_FN(mhc_dphi_64);
    case 72: return AN_FN(mhc_dphi_72);
    case 80: return AN_FN(mhc_dphi_80);
    case 88: return AN_FN(mhc_dphi_88);
    case 96: return AN_FN(mhc_dphi_96);
    case 104: return AN_FN(mhc_dphi_104);
    case 112: return AN_FN(mhc_dphi_112);
    case 120: return AN_FN(mhc_dphi_120);
    default: return AN_FN(mhc_dphi_128);
    }
}

/* dx_t[k] += sum_j phiT[j][k] dz_t[j] for the tile's tokens: phiT (m, K); blocks of AN_MHC_KB along k so that
 * the four tokens' partial rows stay in registers while phiT's rows stream past */
static void AN_FN(mhc_dx_gemm)(float *const *dx, const float *restrict dz, int mp, int m, const float *restrict phiT,
                               int64_t K) {
    int64_t k0 = 0;
    for (; k0 + AN_MHC_KB <= K; k0 += AN_MHC_KB) {
        float d[AN_MHC_TB][AN_MHC_KB];
        /* copied by loops: gcc called memcpy for these 128 bytes, twice per block and token */
        for (int t = 0; t < AN_MHC_TB; t++)
            for (int kk = 0; kk < AN_MHC_KB; kk++) d[t][kk] = dx[t][k0 + kk];
        for (int j = 0; j < m; j++) {
            const float *restrict ph = phiT + (int64_t)j * K + k0;
            const float z0 = dz[j], z1 = dz[mp + j], z2 = dz[2 * mp + j], z3 = dz[3 * mp + j];
            for (int kk = 0; kk < AN_MHC_KB; kk++) {
                d[0][kk] = AN_MAD(z0, ph[kk], d[0][kk]);
                d[1][kk] = AN_MAD(z1, ph[kk], d[1][kk]);
                d[2][kk] = AN_MAD(z2, ph[kk], d[2][kk]);
                d[3][kk] = AN_MAD(z3, ph[kk], d[3][kk]);
            }
        }
        for (int t = 0; t < AN_MHC_TB; t++)
            for (int kk = 0; kk < AN_MHC_KB; kk++) dx[t][k0 + kk] = d[t][kk];
    }
    for (; k0 < K; k0++)
        for (int t = 0; t < AN_MHC_TB; t++) {
            float s = dx[t][k0];
            for (int j = 0; j < m; j++) s = AN_MAD(dz[t * mp + j], phiT[(int64_t)j * K + k0], s);
            dx[t][k0] = s;
        }
}

static inline float AN_FN(mhc_sigmoid)(float x) { return 1.0f / (1.0f + expf(-x)); }

/* Sinkhorn-Knopp on n x n logits, `iters` rounds (columns, then rows), for the tokens of a tile at once: one per lane
 * of a 4-wide vector (lanes past `lanes` repeat the first token; their results are dropped). The divisions were most
 * of its time one token at a time (2 n^2 a round). The forward's kept rounds and a backward's recomputed ones both
 * come from here, so they are the same bits. L[b], out[b], st[b]: token b's logits, H_res and rounds (st NULL: not
 * kept): M0, then per round the column-normalized matrix A and the denominators of its rows r and columns c,
 * (1 + iters) n^2 + 2 iters n floats. With eps (a model's convention): the first round's A + eps before its rows are
 * normalised, every later column sum + eps, every row sum + eps; 0 gives the paper's rounds. */
#ifndef AN_V4_DEFINED
#define AN_V4_DEFINED
typedef float an_v4 __attribute__((vector_size(16)));
_Static_assert(AN_MHC_TILE == 4, "mhc_sinkhorn_tile runs a tile's tokens in the 4 lanes of an_v4");
#endif
static inline __attribute__((always_inline)) void AN_FN(mhc_sinkhorn_tile_n)(const float *const *L, int lanes,
                                                                             const int n, int iters, float eps,
                                                                             float *const *out, float *const *st) {
    const int nn = n * n;
    an_v4 M[AN_STREAM_MAX_N * AN_STREAM_MAX_N];
    /* exp after each column's max: the first round divides the columns, so the shift cancels exactly, and a column
     * far below the others cannot underflow to zeros (0 / 0) as under the matrix's max */
    for (int b = 0; b < AN_MHC_TB; b++) {
        const float *l = L[b < lanes ? b : 0];
        float mx[AN_STREAM_MAX_N];
        for (int j = 0; j < n; j++) {
            float v = l[j];
            for (int i = 1; i < n; i++) v = (l[i * n + j] > v || l[i * n + j] != l[i * n + j]) ? l[i * n + j] : v;
            mx[j] = iters ? v : 0.0f; /* NaN propagates, as amax; no round to divide a shift out: exp(L) itself */
        }
        for (int e = 0; e < nn; e++) M[e][b] = expf(l[e] - mx[e % n]);
    }
    if (st)
        for (int b = 0; b < lanes; b++)
            for (int e = 0; e < nn; e++) st[b][e] = M[e][b];
    for (int it = 0; it < iters; it++) {
        an_v4 c[AN_STREAM_MAX_N], r[AN_STREAM_MAX_N];
        for (int j = 0; j < n; j++) {
            an_v4 s = M[j];
            for (int i = 1; i < n; i++) s += M[i * n + j];
            c[j] = it ? s + eps : s; /* the first: exact, a softmax over each column */
        }
        /* divided, not multiplied by 1/c: a sum below 1/FLT_MAX has an infinite reciprocal */
        for (int i = 0; i < n; i++)
            for (int j = 0; j < n; j++) M[i * n + j] /= c[j];
        if (st)
            for (int b = 0; b < lanes; b++)
                for (int e = 0; e < nn; e++) st[b][nn + (size_t)it * (nn + 2 * n) + e] = M[e][b];
        if (it == 0 && eps != 0.0f)
            for (int e = 0; e < nn; e++) M[e] += eps;
        for (int i = 0; i < n; i++) {
            an_v4 s = M[i * n];
            for (int j = 1; j < n; j++) s += M[i * n + j];
            r[i] = s + eps;
        }
        for (int i = 0; i < n; i++)
            for (int j = 0; j < n; j++) M[i * n + j] /= r[i];
        if (st)
            for (int b = 0; b < lanes; b++) {
                float *rc = st[b] + nn + (size_t)it * (nn + 2 * n) + nn;
                for (int i = 0; i < n; i++) rc[i] = r[i][b], rc[n + i] = c[i][b];
            }
    }
    for (int b = 0; b < lanes; b++)
        for (int e = 0; e < nn; e++) out[b][e] = M[e][b];
}

/* one compiled copy a path (never inlined), which the forward and a backward's recomputation both call: the rounds
 * they get cannot differ by how the compiler treated two inlined copies under -fassociative-math */
static __attribute__((noinline)) void AN_FN(mhc_sinkhorn_tile)(const float *const *L, int lanes, int n, int iters,
                                                               float eps, float *const *out, float *const *st) {
    if (n == 4) AN_FN(mhc_sinkhorn_tile_n)(L, lanes, 4, iters, eps, out, st); /* the common n, unrolled */
    else AN_FN(mhc_sinkhorn_tile_n)(L, lanes, n, iters, eps, out, st);
}

/* dL from dOut through the rounds kept in st (see mhc_sinkhorn_tile; eps as it was given), for the tokens of a tile at
 * once, one per lane: dout[b], st[b] and dL[b] are token b's */
static inline __attribute__((always_inline)) void AN_FN(mhc_sinkhorn_backward_tile_n)(
    const float *const *dout, int lanes, const int n, int iters, float eps, const float *const *st, float *const *dL) {
    const int nn = n * n;
    an_v4 G[AN_STREAM_MAX_N * AN_STREAM_MAX_N], A[AN_STREAM_MAX_N * AN_STREAM_MAX_N], r[AN_STREAM_MAX_N],
        c[AN_STREAM_MAX_N];
    for (int b = 0; b < AN_MHC_TB; b++)
        for (int e = 0; e < nn; e++) G[e][b] = dout[b < lanes ? b : 0][e];
    for (int it = iters - 1; it >= 0; it--) {
        const size_t off = (size_t)nn + (size_t)it * (nn + 2 * n);
        for (int b = 0; b < AN_MHC_TB; b++) {
            const float *Ab = st[b < lanes ? b : 0] + off;
            for (int e = 0; e < nn; e++) A[e][b] = Ab[e];
            for (int i = 0; i < n; i++) r[i][b] = Ab[nn + i], c[i][b] = Ab[nn + n + i];
        }
        const float e0 = it == 0 ? eps : 0.0f; /* what the first round added before its rows (a constant) */
        /* out = (A + e0) / r (rows): dA_ij = (G_ij - sum_k G_ik out_ik) / r_i */
        for (int i = 0; i < n; i++) {
            an_v4 s = G[i * n] * ((A[i * n] + e0) / r[i]);
            for (int k = 1; k < n; k++) s += G[i * n + k] * ((A[i * n + k] + e0) / r[i]);
            for (int j = 0; j < n; j++) G[i * n + j] = (G[i * n + j] - s) / r[i];
        }
        /* A = M / c (columns): dM_ij = (dA_ij - sum_k dA_kj A_kj) / c_j */
        for (int j = 0; j < n; j++) {
            an_v4 s = G[j] * A[j];
            for (int k = 1; k < n; k++) s += G[k * n + j] * A[k * n + j];
            for (int i = 0; i < n; i++) G[i * n + j] = (G[i * n + j] - s) / c[j];
        }
    }
    for (int b = 0; b < lanes; b++)
        for (int e = 0; e < nn; e++) dL[b][e] = G[e][b] * st[b][e]; /* M0 = exp(L - column max) */
}

static void AN_FN(mhc_sinkhorn_backward_tile)(const float *const *dout, int lanes, int n, int iters, float eps,
                                              const float *const *st, float *const *dL) {
    if (n == 4) AN_FN(mhc_sinkhorn_backward_tile_n)(dout, lanes, 4, iters, eps, st, dL);
    else AN_FN(mhc_sinkhorn_backward_tile_n)(dout, lanes, n, iters, eps, st, dL);
}

/* H_res's n x n logits from lg + 2n (row-major), transposed where the convention says so */
static const float *AN_FN(mhc_res_logits)(const an_mhc_args *a, const float *lg, float *tmp) {
    const int n = a->n;
    if (!a->res_t) return lg + 2 * n;
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++) tmp[j * n + i] = lg[2 * n + i * n + j];
    return tmp;
}

/* the gates of one token's groups from its logits: H_pre = sigmoid + pre_eps, and (groups > 1) H_post =
 * post_scale sigmoid + post_eps (the paper's 0, 2 and 0). The one place they are computed: the forward's maps
 * and the backward that reads the kept rounds (and so skips mhc_maps_tile) both call it. */
static void AN_FN(mhc_gates)(const an_mhc_args *a, const float *lg, float *hp, float *hpo) {
    const int n = a->n;
    for (int i = 0; i < n; i++) hp[i] = AN_FN(mhc_sigmoid)(lg[i]) + a->pre_eps;
    if (a->groups < 2) return;
    for (int i = 0; i < n; i++) hpo[i] = a->post_scale * AN_FN(mhc_sigmoid)(lg[n + i]) + a->post_eps;
}

/* the coefficient maps of a tile's nt tokens: logits lg[b] (m) -> H_pre hp[b], H_post hpo[b], H_res hr[b] (those of
 * its groups); Sinkhorn-Knopp for the tile at once (mhc_sinkhorn_tile), its rounds into st[b] (st NULL: not kept);
 * mHC-lite's softmax weights into w[b] (its backward reads them) */
static void AN_FN(mhc_maps_tile)(const an_mhc_args *a, const float *const *lg, int nt, float *const *hp,
                                 float *const *hpo, float *const *hr, float *const *st, float *const *w,
                                 float *ltmp) {
    const int n = a->n, r = a->r;
    for (int b = 0; b < nt; b++) AN_FN(mhc_gates)(a, lg[b], hp[b], hpo[b]);
    if (a->groups < 3) return;
    if (a->perm == NULL) {
        const float *L[AN_MHC_TB];
        for (int b = 0; b < nt; b++)
            L[b] = AN_FN(mhc_res_logits)(a, lg[b], ltmp + b * AN_STREAM_MAX_N * AN_STREAM_MAX_N);
        AN_FN(mhc_sinkhorn_tile)(L, nt, n, a->iters, a->res_eps, hr, st);
        return;
    }
    for (int b = 0; b < nt; b++) {
        const float *l = lg[b] + 2 * n;
        float *wb = w[b], *h = hr[b];
        float mx = l[0];
        for (int k = 1; k < r; k++) mx = l[k] > mx ? l[k] : mx;
        float s = 0.0f;
        for (int k = 0; k < r; k++) s += (wb[k] = expf(l[k] - mx));
        for (int k = 0; k < r; k++) wb[k] /= s;
        memset(h, 0, sizeof(float) * (size_t)(n * n));
        for (int k = 0; k < r; k++)
            for (int i = 0; i < n; i++) h[i * n + a->perm[k * n + i]] += wb[k];
    }
}

/* WFWD's write for n = 2 or 4 with a mixing matrix, float32 or bfloat16 (what stream_fwd_fast takes): each row of
 * X' by the stream kernels' own stream_write_row, so X' has the bits of a stream_write followed by mhc_pre, stored
 * where it goes in one walk (the general loop's axpys, round_row and put_row made n + 3). Returns the token's float32
 * rows for the read: X' itself where it was stored as float32 without streaming, else v (the values as stored). */
static const float *AN_FN(mhc_write_fixed)(const an_mhc_args *a, int64_t t, float *v, const an_rows *sc) {
    const int n = a->n, bf16 = a->dt == AN_BF16;
    const int64_t C = a->C, K = a->K;
    const size_t es = bf16 ? 2 : 4;
    const float *y = AN_FN(f32_row)((const char *)a->wy + t * C * (int64_t)es, a->dt, sc->r[4], C);
    const float *x = AN_FN(f32_row)((const char *)a->x + t * K * (int64_t)es, a->dt, sc->r[5], K);
    const float *xs[AN_STREAM_MAX_N];
    for (int j = 0; j < n; j++) xs[j] = x + (int64_t)j * C;
    const float *hpost = a->w_post + t * n, *hres = a->w_res + t * n * n;
    const int nf = bf16 && an_nan_safe(hpost, n) && an_nan_safe(hres, n * n);
    char *dst = (char *)a->x2 + t * K * (int64_t)es;
    void *tmp = sc->r[9];
    for (int i = 0; i < n; i++) {
        char *di = dst + (size_t)i * (size_t)C * es;
        AN_FN(stream_write_row_n)(di, xs, y, hres + i * n, hpost[i], C, n, bf16, nf, a->nt, tmp, 0);
        /* the row as stored: in tmp where it was streamed (nt), else where it lies */
        if (bf16 || a->nt) AN_FN(load_row)(v + (int64_t)i * C, a->nt ? tmp : di, C, a->dt);
    }
    return bf16 || a->nt ? v : (const float *)dst;
}

/* WFWD: token t's X' = the write of its stream, into a->x2 and (its float32 values as stored) into v, or where the
 * returned rows lie. Scratch: rows 4 (y), 5 (X, converted) and 9 (put_row's). */
static const float *AN_FN(mhc_write)(const an_mhc_args *a, int64_t t, float *v, const an_rows *sc) {
    if (a->w_res && !a->w_products && (a->n == 2 || a->n == 4) && (a->dt == AN_F32 || a->dt == AN_BF16))
        return AN_FN(mhc_write_fixed)(a, t, v, sc);
    const int n = a->n;
    const int64_t C = a->C, K = a->K;
    const size_t es = an_elem_size(a->dt);
    const float *y = AN_FN(f32_row)((const char *)a->wy + t * C * (int64_t)es, a->dt, sc->r[4], C);
    const float *x = AN_FN(f32_row)((const char *)a->x + t * K * (int64_t)es, a->dt, sc->r[5], K);
    const float *hpost = a->w_post + t * n, *hres = a->w_res ? a->w_res + t * n * n : NULL;
    for (int i = 0; i < n; i++) {
        float *o = v + (int64_t)i * C;
        AN_FN(axpy)(o, y, hpost[i], C, 1);
        if (hres) {
            for (int j = 0; j < n; j++) AN_FN(axpy)(o, x + (int64_t)j * C, hres[i * n + j], C, 0);
        } else {
            if (a->w_products) AN_FN(round_row)(o, C, a->dt); /* H_post[i] y as eager 16-bit code rounds it */
            const float *xi = x + (int64_t)i * C;
            for (int64_t c = 0; c < C; c++) o[c] += xi[c];
        }
        AN_FN(round_row)(o, C, a->dt); /* the read sees the values as stored */
    }
    AN_FN(put_row)((char *)a->x2 + t * K * (int64_t)es, v, K, a->dt, a->nt, sc->r[9]);
    return v;
}

/* WBWD's write backward for n = 2 or 4 with a mixing matrix, float32 or bfloat16 (what stream_write_bwd_fast takes):
 * dy with dH_post, then each dX_j with dH_res[., j], by the stream write's own token backward (stream_write_bwd_token:
 * n + 1 walks of the token, each storing its row where it goes), so the same bits as stream_write_backward from the
 * same g. */
static void AN_FN(mhc_write_bwd_fixed)(const an_mhc_args *a, int64_t t, float *g, const an_rows *sc) {
    const int n = a->n, bf16 = a->dt == AN_BF16;
    const int64_t C = a->C, K = a->K;
    const size_t es = bf16 ? 2 : 4;
    float *gs[AN_STREAM_MAX_N];
    for (int i = 0; i < n; i++) gs[i] = g + (int64_t)i * C;
    const float *hpost = a->w_post + t * n, *hres = a->w_res + t * n * n;
    /* g is float32 arithmetic on float32 operands (phi, p, the coefficients' gradients), not a bfloat16 row: its
     * NaNs may have a nonzero low half, so it is checked too (in L1, K floats) */
    const int nf = bf16 && an_nan_safe(hpost, n) && an_nan_safe(hres, n * n) && an_nan_safe(g, K);
    AN_FN(stream_write_bwd_token)((char *)a->wdy + t * C * (int64_t)es, (char *)a->wdx + t * K * (int64_t)es,
                                  (const char *)a->wy + t * C * (int64_t)es, (const char *)a->wx + t * K * (int64_t)es,
                                  gs, hpost, hres, a->wd_post + t * n, a->wd_res + t * n * n, C, n, bf16, nf, a->nt,
                                  sc->r[9]);
}

/* WBWD: token t's write backward from g = the read's dX' (float32, in place) + the dX' given: dX, dy, dH_post
 * and, with a mixing matrix, dH_res, in the stream kernels' order (stream_rows.h's general loop). Scratch: rows
 * 8 (X, converted), 10 (dX', then y) and 11 (dy, then each dX_j); 9 is put_row's. */
static void AN_FN(mhc_write_bwd)(const an_mhc_args *a, int64_t t, float *g, const an_rows *sc) {
    const int n = a->n;
    const int64_t C = a->C, K = a->K;
    const size_t es = an_elem_size(a->dt);
    if (a->dx2) {
        const float *d = AN_FN(f32_row)((const char *)a->dx2 + t * K * (int64_t)es, a->dt, sc->r[10], K);
        for (int64_t k = 0; k < K; k++) g[k] += d[k];
    }
    if (a->w_res && (n == 2 || n == 4) && (a->dt == AN_F32 || a->dt == AN_BF16)) {
        AN_FN(mhc_write_bwd_fixed)(a, t, g, sc);
        return;
    }
    const float *y = AN_FN(f32_row)((const char *)a->wy + t * C * (int64_t)es, a->dt, sc->r[10], C);
    const float *hpost = a->w_post + t * n;
    float *out = sc->r[11];
    for (int i = 0; i < n; i++) { /* dy = sum_i H_post[i] g_i; dH_post[i] = <g_i, y> */
        a->wd_post[t * n + i] = AN_FN(dot)(g + (int64_t)i * C, y, C);
        AN_FN(axpy)(out, g + (int64_t)i * C, hpost[i], C, i == 0);
    }
    AN_FN(put_row)((char *)a->wdy + t * C * (int64_t)es, out, C, a->dt, a->nt, sc->r[9]);
    char *dx = (char *)a->wdx + t * K * (int64_t)es;
    if (a->w_res == NULL) { /* X' = X + H_post^T y: dX = g */
        AN_FN(put_row)(dx, g, K, a->dt, a->nt, sc->r[9]);
        return;
    }
    /* dX_j = sum_i H_res[i, j] g_i; dH_res[i, j] = <g_i, X_j> */
    const float *hres = a->w_res + t * n * n;
    const float *x = AN_FN(f32_row)((const char *)a->wx + t * K * (int64_t)es, a->dt, sc->r[8], K);
    float *dres = a->wd_res + t * n * n;
    for (int j = 0; j < n; j++) {
        for (int i = 0; i < n; i++) dres[i * n + j] = AN_FN(dot)(g + (int64_t)i * C, x + (int64_t)j * C, C);
        for (int i = 0; i < n; i++) AN_FN(axpy)(out, g + (int64_t)i * C, hres[i * n + j], C, i == 0);
        AN_FN(put_row)(dx + (size_t)j * (size_t)C * es, out, C, a->dt, a->nt, sc->r[9]);
    }
}

static void AN_FN(mhc_rows)(const an_mhc_args *a, int64_t r0, int64_t r1, const an_rows *sc, int chunk) {
    const int n = a->n, m = a->m, mp = a->mp, r = a->r;
    const int64_t C = a->C, K = a->K;
    const size_t es = an_elem_size(a->dt);
    const int nn = n * n;
    const int64_t S = AN_MHC_STATE(n, a->iters);
    /* the tile's projections and their gradients, its tokens' logits, mHC-lite's weights, H_res (and dL) where no
     * output takes it, and Sinkhorn's rounds recomputed for a backward that was not handed the forward's: in the
     * task's scratch (sc->mhc, AN_MHC_SCRATCH_FLOATS), as they would take 90 KiB of the stack */
    float *restrict z = sc->mhc, *restrict dz = z + AN_MHC_TB * AN_MHC_MAX_M;
    float *lgs = dz + AN_MHC_TB * AN_MHC_MAX_M, *ws = lgs + AN_MHC_TB * AN_MHC_MAX_M,
          *hrs = ws + AN_MHC_TB * AN_MHC_MAX_M, *dls = hrs + AN_MHC_TB * AN_STREAM_MAX_N * AN_STREAM_MAX_N,
          *lts = dls + AN_MHC_TB * AN_STREAM_MAX_N * AN_STREAM_MAX_N,
          *sts = lts + AN_MHC_TB * AN_STREAM_MAX_N * AN_STREAM_MAX_N;
    float hpv[AN_MHC_TB][AN_STREAM_MAX_N], hpov[AN_MHC_TB][AN_STREAM_MAX_N];
    float *lg[AN_MHC_TB], *w[AN_MHC_TB], *hp[AN_MHC_TB], *hpo[AN_MHC_TB], *hr[AN_MHC_TB], *dL[AN_MHC_TB],
        *stb[AN_MHC_TB];
    const float *rounds[AN_MHC_TB];
    const int bwd = a->op == AN_MHC_BWD || a->op == AN_MHC_WBWD;
    const int sinkhorn = a->groups == 3 && a->perm == NULL;
    float *tmp = sc->r[8];
    float *dphi = bwd ? a->dphi_part + (size_t)chunk * (size_t)K * (size_t)mp : NULL;
    if (dphi) memset(dphi, 0, sizeof(float) * (size_t)K * (size_t)mp);
    double *dcp = bwd && a->dcoef_part ? a->dcoef_part + (size_t)chunk * 2 * (size_t)mp : NULL;
    if (dcp) memset(dcp, 0, sizeof(double) * 2 * (size_t)mp);
    AN_FN(mhc_project_fn) project = AN_FN(mhc_project_for)(mp);
    AN_FN(mhc_dphi_fn) add_dphi = AN_FN(mhc_dphi_for)(mp);
    for (int b = 0; b < AN_MHC_TB; b++) {
        lg[b] = lgs + b * AN_MHC_MAX_M;
        w[b] = ws + b * AN_MHC_MAX_M;
        dL[b] = dls + b * AN_STREAM_MAX_N * AN_STREAM_MAX_N;
        stb[b] = sts + (size_t)b * AN_MHC_SINKHORN_FLOATS;
    }
    for (int64_t t0 = r0; t0 < r1; t0 += AN_MHC_TB) {
        const int nt = (int)(r1 - t0 < AN_MHC_TB ? r1 - t0 : AN_MHC_TB);
        const float *v[AN_MHC_TB];
        for (int b = 0; b < AN_MHC_TB; b++) {
            const int64_t t = t0 + (b < nt ? b : nt - 1); /* a short tile repeats its last token */
            if (b >= nt) v[b] = v[nt - 1];
            else if (a->op == AN_MHC_WFWD) v[b] = AN_FN(mhc_write)(a, t, sc->r[b], sc);
            else v[b] = AN_FN(f32_row)((const char *)a->x + t * K * es, a->dt, sc->r[b], K);
        }
        /* the tile's maps: H_pre and H_post where the outputs take them (or the backward's own rows), H_res into
         * its output or scratch */
        for (int b = 0; b < nt; b++) {
            const int64_t t = t0 + b;
            const int fw = !bwd;
            hp[b] = fw ? a->h_pre + t * n : hpv[b];
            hpo[b] = fw && a->groups > 1 ? a->h_post + t * n : hpov[b];
            hr[b] = fw && a->groups > 2 ? a->h_res + t * nn : hrs + b * AN_STREAM_MAX_N * AN_STREAM_MAX_N;
        }
        /* the next tile's rows, asked for while this tile's projection runs (the write+read's come from its own
         * pass: none) */
        an_mhc_pf pf = {.n = 0};
        const int64_t nx0 = t0 + AN_MHC_TB, nx1 = r1 < nx0 + AN_MHC_TB ? r1 : nx0 + AN_MHC_TB;
        if (a->op == AN_MHC_FWD || a->op == AN_MHC_BWD)
            for (int64_t t = nx0; t < nx1; t++) an_mhc_pf_add(&pf, (const char *)a->x + t * K * es, (size_t)K * es);
        if (bwd && nx1 > nx0) {
            if (a->dh) an_mhc_pf_add(&pf, (const char *)a->dh + nx0 * C * es, (size_t)((nx1 - nx0) * C) * es);
            if (a->st_in) an_mhc_pf_add(&pf, a->st_in + nx0 * S, sizeof(float) * (size_t)((nx1 - nx0) * S));
        }
        if (!bwd) {
            project(v, a->phi, K, z, &pf);
            for (int b = 0; b < nt; b++) {
                const int64_t t = t0 + b;
                const float rs = an_rstd(AN_FN(dot)(v[b], v[b], K) / (float)K, a->eps);
                a->rstd[t] = rs;
                float *p = a->p + t * m;
                for (int j = 0; j < m; j++) {
                    p[j] = z[b * mp + j] * rs;
                    lg[b][j] = a->a[j < n ? 0 : j < 2 * n ? 1 : 2] * p[j] + a->bias[j];
                }
            }
            float *kept[AN_MHC_TB];
            for (int b = 0; b < nt; b++) kept[b] = a->st ? a->st + (t0 + b) * S : NULL;
            AN_FN(mhc_maps_tile)(a, (const float *const *)lg, nt, hp, hpo, hr, a->st && sinkhorn ? kept : NULL, w,
                                 lts);
            for (int b = 0; b < nt; b++) {
                const int64_t t = t0 + b;
                for (int i = 0; i < n; i++) AN_FN(axpy)(tmp, v[b] + (int64_t)i * C, hp[b][i], C, i == 0);
                AN_FN(put_row)((char *)a->h + t * C * es, tmp, C, a->dt, a->nt, sc->r[9]);
            }
            continue;
        }
        /* backward: the tile's logits, gates and Sinkhorn's rounds (the forward's, or recomputed here for the tile at
         * once), then dlogits of H_res through every round for the tile at once */
        for (int b = 0; b < nt; b++) {
            const float *p = a->p_in + (t0 + b) * m;
            for (int j = 0; j < m; j++) lg[b][j] = a->a[j < n ? 0 : j < 2 * n ? 1 : 2] * p[j] + a->bias[j];
        }
        if (a->st_in) {
            for (int b = 0; b < nt; b++) {
                AN_FN(mhc_gates)(a, lg[b], hp[b], hpo[b]);
                rounds[b] = a->st_in + (t0 + b) * S;
            }
        } else {
            AN_FN(mhc_maps_tile)(a, (const float *const *)lg, nt, hp, hpo, hr, sinkhorn ? stb : NULL, w, lts);
            for (int b = 0; b < nt; b++) rounds[b] = stb[b];
        }
        if (sinkhorn && a->dh_res) {
            const float *G[AN_MHC_TB] = {0};
            for (int b = 0; b < nt; b++) G[b] = a->dh_res + (t0 + b) * nn;
            AN_FN(mhc_sinkhorn_backward_tile)(G, nt, n, a->iters, a->res_eps, rounds, dL);
        }
        /* dX rows: a float32 backward whose stores are not streamed writes them where they go (the copy from scratch
         * rows was 7 % of its time); otherwise in scratch, then stored (rounded, or streamed) */
        const int direct = a->op == AN_MHC_BWD && a->dt == AN_F32 && !a->nt;
        float *dx[AN_MHC_TB];
        for (int b = 0; b < AN_MHC_TB; b++) dx[b] = direct && b < nt ? (float *)a->dx + (t0 + b) * K : sc->r[4 + b];
        memset(dz, 0, sizeof(float) * (size_t)(AN_MHC_TB * mp));
        for (int b = 0; b < nt; b++) {
            const int64_t t = t0 + b;
            const float rs = a->rstd_in[t];
            const float *p = a->p_in + t * m;
            float *d = a->dlogits + t * m;
            /* dh, as float32, at the start of this token's dX row (read before that row is written) */
            const float *dh = a->dh ? AN_FN(f32_row)((const char *)a->dh + t * C * es, a->dt, tmp, C) : NULL;
            for (int i = 0; i < n; i++) {
                float g = a->dh_pre ? a->dh_pre[t * n + i] : 0.0f;
                if (dh) g += AN_FN(dot)(dh, v[b] + (int64_t)i * C, C);
                const float sp = AN_FN(mhc_sigmoid)(lg[b][i]); /* H_pre without the convention's eps */
                d[i] = g * sp * (1.0f - sp);
                if (a->groups < 2) continue;
                const float s = AN_FN(mhc_sigmoid)(lg[b][n + i]);
                d[n + i] = a->dh_post ? a->dh_post[t * n + i] * a->post_scale * s * (1.0f - s) : 0.0f;
            }
            if (a->groups < 3 || a->dh_res == NULL) {
                for (int k = 0; k < r; k++) d[2 * n + k] = 0.0f;
            } else if (a->perm == NULL) {
                /* the rounds (kept or recomputed) are those of the logits as Sinkhorn took them: transposed
                 * where the convention says so, so dL is too */
                for (int i = 0; i < n; i++) /* back to the logits' own layout */
                    for (int j = 0; j < n; j++) d[2 * n + i * n + j] = a->res_t ? dL[b][j * n + i] : dL[b][i * n + j];
            } else {
                const float *G = a->dh_res + t * nn;
                float wd = 0.0f;
                for (int k = 0; k < r; k++) {
                    float s = 0.0f;
                    for (int i = 0; i < n; i++) s += G[i * n + a->perm[k * n + i]];
                    lg[b][k] = s; /* dw_k (the logits are no longer needed) */
                    wd += w[b][k] * s;
                }
                for (int k = 0; k < r; k++) d[2 * n + k] = w[b][k] * (lg[b][k] - wd);
            }
            float pd = 0.0f;
            for (int j = 0; j < m; j++) {
                const float dp = a->a[j < n ? 0 : j < 2 * n ? 1 : 2] * d[j];
                pd += dp * p[j];
                dz[b * mp + j] = dp * rs;
            }
            if (dcp) /* the coefficients' gradients: d logit / d a = p, d logit / d b = 1 */
                for (int j = 0; j < m; j++) dcp[j] += d[j], dcp[mp + j] += (double)d[j] * p[j];
            /* dX = H_pre (x) dh - (rstd^2 / K)(dp . p) v, then + phi dz below */
            const float cv = -(rs * rs / (float)K) * pd;
            float *o = dx[b];
            for (int i = n - 1; i >= 0; i--) { /* row 0 last: dh may live in tmp, never in o */
                float *oi = o + (int64_t)i * C;
                const float *vi = v[b] + (int64_t)i * C;
                if (dh) for (int64_t c = 0; c < C; c++) oi[c] = hp[b][i] * dh[c] + cv * vi[c];
                else for (int64_t c = 0; c < C; c++) oi[c] = cv * vi[c];
            }
        }
        for (int b = nt; b < AN_MHC_TB; b++) memset(dx[b], 0, sizeof(float) * (size_t)K); /* dz is 0 there */
        AN_FN(mhc_dx_gemm)(dx, dz, mp, m, a->phiT, K);
        add_dphi(v, dz, K, dphi, &pf);
        for (int b = 0; b < nt; b++) {
            if (a->op == AN_MHC_WBWD) AN_FN(mhc_write_bwd)(a, t0 + b, dx[b], sc);
            else if (!direct) AN_FN(put_row)((char *)a->dx + (t0 + b) * K * es, dx[b], K, a->dt, a->nt, sc->r[9]);
        }
    }
}

#undef AN_MHC_KB
#undef AN_MHC_TB
#undef AN_FN
#undef AN_CAT
#undef AN_CAT2
