"""Triton kernels of mHC's pre step (``addnorm.ops.mhc.formulas.pre``), forward and backward, for mHC
(Sinkhorn-Knopp) and mHC-lite (a softmax mix of the n! permutation matrices).

A program takes a tile of BT tokens. Token t's stream X_t (n, C) is read as v_t = vec(X_t), K = nC values
(row-major: v[i C + c] = X[i, c]); phi is (K, m) float32, m = 2n + r (r = n^2 or n!).

Forward (``mhc_pre_fwd``), per tile:
  pass 1, over K in chunks of BK: sum(v^2) and v @ phi (``tl.dot`` in IEEE float32: no TF32), so
          rstd = 1 / sqrt(sum(v^2) / K + eps) and p = (v @ phi) rstd, stored;
  the coefficients, from p read back in each group's shape (hence the barrier): H_pre, H_post = (2) sigmoid of
          scal * p + bias, H_res by Sinkhorn-Knopp on (BT, n, n) tiles or by the permutation mix;
  pass 2, over C in chunks of BC: h = sum_i H_pre[i] X_i, float32, rounded once to h's dtype.

Backward (``mhc_pre_bwd``), per tile:
  pass 1 (with dh): g_pre[i] = <dh, X_i> (+ dh_pre[i]);
  the pre-activations' gradient dlogits (stored): pre g_pre s (1 - s), post dh_post 2 s (1 - s) with s the
          sigmoid; res the backward of Sinkhorn-Knopp through every round (the max shift a constant), or of
          the softmax and permutation mix;
  pass 2, over K: dX_i = H_pre[i] dh + phi_i (dp rstd) - (rstd^2 / K)(sum_j dp_j p_j) X_i, dp = scal * dlogits
          (read back flat from dlogits: a barrier again), one rounding to dx's dtype.

Sinkhorn-Knopp's backward recomputes the rounds rather than storing them: the gradient through round t needs
M_{t-1}, rebuilt from M_0 in t - 1 rounds (iters (iters + 1) / 2 rounds in all, on (BT, n, n) tiles held in
registers; no scratch memory).

phi's gradient (``mhc_pre_dphi``): sum over tokens of v^T (dp rstd), one program per (BK rows of phi, a split
of the tokens), its (BK, m) sum in registers, one partial per split: the host sums the splits (a fixed number
for a device, so the result is deterministic).

Under Triton's interpreter (``RNE``) float32 -> bfloat16 casts truncate; ``_to`` rounds to nearest-even.
"""

import triton
import triton.language as tl

from .common import cast_rne as _to
from .common import inv_std as _rstd
from .common import load_f32 as _load


@triton.jit
def _col(a, idx, i):
    """Column i of a (BT, W) tile, as (BT,): idx is the (W,) column index."""
    return tl.sum(tl.where(idx[None, :] == i, a, 0.0), axis=1)


@triton.jit
def _sk_round(M, iv, jv):
    """One Sinkhorn-Knopp round on (BT, NB, NB) tiles (0 outside the n x n matrix): divide by the column sums,
    then by the row sums. Returns (A, c, M', r): A = M / c, M' = A / r (padded sums read as 1)."""
    c = tl.sum(M, axis=1)
    c = tl.where(jv[None, :], c, 1.0)
    A = M / c[:, None, :]
    r = tl.sum(A, axis=2)
    r = tl.where(iv[None, :], r, 1.0)
    return A, c, A / r[:, :, None], r


@triton.jit
def _sk_start(P, BIAS, a_res, t, tmask, m, iters, NS: tl.constexpr, NB: tl.constexpr):
    """M_0 = exp(L - max_i L_ij) of the res logits L = a_res p[2n:] + b_res, as (BT, NB, NB) (0 outside n x n), and
    the offsets and mask of H_res's (BT, n, n) entries."""
    i = tl.arange(0, NB)
    j = tl.arange(0, NB)
    valid = (i < NS)[:, None] & (j < NS)[None, :]
    col = 2 * NS + i[:, None] * NS + j[None, :]
    mask = tmask[:, None, None] & valid[None, :, :]
    L = a_res * tl.load(P + t[:, None, None] * m + col[None, :, :], mask=mask, other=0.0) \
        + tl.load(BIAS + col, mask=valid, other=0.0)[None, :, :]
    L = tl.where(valid[None, :, :], L, -float("inf"))
    # each column's max (the first round divides the columns: the shift cancels, and no column underflows)
    mx = tl.max(L, axis=1)
    # tl.max skips NaN; the spec's amax does not (a NaN logit makes its column NaN, then every row)
    has_nan = tl.max(tl.where(L != L, 1, 0), axis=1) > 0
    mx = tl.where(has_nan, float("nan"), mx)
    mx = tl.where(iters > 0, mx, 0.0)  # no round to divide a shift out: M_0 = exp(L) itself
    M0 = tl.where(valid[None, :, :], tl.exp(L - mx[:, None, :]), 0.0)
    offs = t[:, None, None] * (NS * NS) + (i[:, None] * NS + j[None, :])[None, :, :]
    return M0, i < NS, j < NS, offs, mask


@triton.jit
def _lite_start(P, BIAS, a_res, t, tmask, m, r_count, NS: tl.constexpr, NB: tl.constexpr, RB: tl.constexpr):
    """mHC-lite: w = softmax(a_res p[2n:] + b_res) as (BT, RB), and the offsets and mask of H_res's entries
    (BT, NB*NB)."""
    k = tl.arange(0, RB)
    kv = k < r_count
    L = a_res * tl.load(P + t[:, None] * m + 2 * NS + k[None, :], mask=tmask[:, None] & kv[None, :], other=0.0) \
        + tl.load(BIAS + 2 * NS + k, mask=kv, other=0.0)[None, :]
    L = tl.where(kv[None, :], L, -float("inf"))
    e = tl.where(kv[None, :], tl.exp(L - tl.max(L, axis=1)[:, None]), 0.0)
    w = e / tl.sum(e, axis=1)[:, None]
    ij = tl.arange(0, NB * NB)
    i = ij // NB
    j = ij % NB
    ijv = (i < NS) & (j < NS)
    offs = t[:, None] * (NS * NS) + (i * NS + j)[None, :]
    return w, offs, tmask[:, None] & ijv[None, :]


@triton.jit
def _perm_onehot(PERM, kk, NS: tl.constexpr, NB: tl.constexpr):
    """Permutation kk's matrix, flat (NB*NB,): 1 at (i, perm_idx[kk, i]), 0 elsewhere and outside n x n. The mix
    and its backward walk the permutations one at a time on 2-D tiles. The (BT, RB, NB*NB) broadcast-and-reduce
    this replaces gave H_res rows summing to 0.9998 on an H200 (Triton 3.6; p itself was right to 2e-6), where
    the interpreter gave 1; this form passes the interpreter and compiles for sm_80/sm_90, but has not yet run
    on a GPU."""
    ij = tl.arange(0, NB * NB)
    i = ij // NB
    j = ij % NB
    ijv = (i < NS) & (j < NS)
    perm = tl.load(PERM + kk * NS + i, mask=ijv, other=-1)
    return tl.where(ijv & (perm == j), 1.0, 0.0)


@triton.jit
def _scal(SCAL, cols, NS: tl.constexpr):
    """scal of each column's group: a_pre on [0, n), a_post on [n, 2n), a_res beyond."""
    return tl.where(cols < NS, tl.load(SCAL), tl.where(cols < 2 * NS, tl.load(SCAL + 1), tl.load(SCAL + 2)))


@triton.jit
def mhc_pre_fwd(X, PHI, SCAL, BIAS, PERM, H, HPRE, HPOST, HRES, P, RSTD, N, C, m, eps, iters,
                NS: tl.constexpr, NB: tl.constexpr, RB: tl.constexpr, MB: tl.constexpr, LITE: tl.constexpr,
                BT: tl.constexpr, BK: tl.constexpr, BC: tl.constexpr, RNE: tl.constexpr):
    t = tl.program_id(0).to(tl.int64) * BT + tl.arange(0, BT)  # int64: t * K may pass 2**31
    tmask = t < N
    K = NS * C
    cols = tl.arange(0, MB)
    cmask = cols < m
    # pass 1: sum(v^2) and v @ phi
    ss = tl.zeros([BT], dtype=tl.float32)
    acc = tl.zeros([BT, MB], dtype=tl.float32)
    for k0 in range(0, K, BK):
        k = k0 + tl.arange(0, BK)
        kmask = k < K
        v = _load(X, t[:, None] * K + k[None, :], tmask[:, None] & kmask[None, :])
        ss += tl.sum(v * v, axis=1)
        ph = _load(PHI, k[:, None].to(tl.int64) * m + cols[None, :], kmask[:, None] & cmask[None, :])
        acc = tl.dot(v, ph, acc, input_precision="ieee")
    rstd = _rstd(ss / K, eps)
    tl.store(RSTD + t, rstd, mask=tmask)
    tl.store(P + t[:, None] * m + cols[None, :], acc * rstd[:, None], mask=tmask[:, None] & cmask[None, :])
    tl.debug_barrier()  # p written, before the coefficients read it back in their groups' shapes
    # H_pre, H_post
    nb = tl.arange(0, NB)
    gmask = tmask[:, None] & (nb < NS)[None, :]
    goffs = t[:, None] * NS + nb[None, :]
    pre = tl.load(P + t[:, None] * m + nb[None, :], mask=gmask, other=0.0)
    hpre = tl.sigmoid(tl.load(SCAL) * pre + tl.load(BIAS + nb, mask=nb < NS, other=0.0)[None, :])
    tl.store(HPRE + goffs, hpre, mask=gmask)
    post = tl.load(P + t[:, None] * m + NS + nb[None, :], mask=gmask, other=0.0)
    hpost = 2.0 * tl.sigmoid(tl.load(SCAL + 1) * post + tl.load(BIAS + NS + nb, mask=nb < NS, other=0.0)[None, :])
    tl.store(HPOST + goffs, hpost, mask=gmask)
    # H_res
    if LITE:
        w, roffs, rmask = _lite_start(P, BIAS, tl.load(SCAL + 2), t, tmask, m, m - 2 * NS, NS, NB, RB)
        k = tl.arange(0, RB)
        hres = tl.zeros([BT, NB * NB], dtype=tl.float32)
        for kk in range(0, m - 2 * NS):  # H_res = sum_k w_k P_k, in k's order
            hres += _col(w, k, kk)[:, None] * _perm_onehot(PERM, kk, NS, NB)[None, :]
        tl.store(HRES + roffs, hres, mask=rmask)
    else:
        M, iv, jv, roffs, rmask = _sk_start(P, BIAS, tl.load(SCAL + 2), t, tmask, m, iters, NS, NB)
        for _ in range(iters):
            _a, _c, M, _r = _sk_round(M, iv, jv)
        tl.store(HRES + roffs, M, mask=rmask)
    # pass 2: h = sum_i H_pre[i] X_i
    for c0 in range(0, C, BC):
        cc = c0 + tl.arange(0, BC)
        mask = tmask[:, None] & (cc < C)[None, :]
        h = tl.zeros([BT, BC], dtype=tl.float32)
        for i in tl.static_range(NS):
            h += _col(hpre, nb, i)[:, None] * _load(X, t[:, None] * K + i * C + cc[None, :], mask)
        tl.store(H + t[:, None] * C + cc[None, :], _to(h, H.dtype.element_ty, RNE), mask=mask)


@triton.jit
def mhc_pre_bwd(DH, DHPRE, DHPOST, DHRES, X, PHI, SCAL, BIAS, PERM, P, RSTD, DX, DL, N, C, m, iters,
                NS: tl.constexpr, NB: tl.constexpr, RB: tl.constexpr, MB: tl.constexpr, LITE: tl.constexpr,
                HAS_DH: tl.constexpr, HAS_DPRE: tl.constexpr, HAS_DPOST: tl.constexpr, HAS_DRES: tl.constexpr,
                BT: tl.constexpr, BC: tl.constexpr, RNE: tl.constexpr):
    t = tl.program_id(0).to(tl.int64) * BT + tl.arange(0, BT)
    tmask = t < N
    K = NS * C
    nb = tl.arange(0, NB)
    gmask = tmask[:, None] & (nb < NS)[None, :]
    goffs = t[:, None] * NS + nb[None, :]
    # pass 1: g_pre[i] = <dh, X_i> + dh_pre[i]
    g = tl.zeros([BT, NB], dtype=tl.float32)
    if HAS_DH:
        for c0 in range(0, C, BC):
            cc = c0 + tl.arange(0, BC)
            mask = tmask[:, None] & (cc < C)[None, :]
            dh = _load(DH, t[:, None] * C + cc[None, :], mask)
            for i in tl.static_range(NS):
                gi = tl.sum(dh * _load(X, t[:, None] * K + i * C + cc[None, :], mask), axis=1)
                g += tl.where(nb[None, :] == i, gi[:, None], 0.0)
    if HAS_DPRE:
        g += tl.load(DHPRE + goffs, mask=gmask, other=0.0)
    pre = tl.load(P + t[:, None] * m + nb[None, :], mask=gmask, other=0.0)
    hpre = tl.sigmoid(tl.load(SCAL) * pre + tl.load(BIAS + nb, mask=nb < NS, other=0.0)[None, :])
    tl.store(DL + t[:, None] * m + nb[None, :], g * hpre * (1.0 - hpre), mask=gmask)
    dpost = tl.zeros([BT, NB], dtype=tl.float32)
    if HAS_DPOST:
        post = tl.load(P + t[:, None] * m + NS + nb[None, :], mask=gmask, other=0.0)
        s = tl.sigmoid(tl.load(SCAL + 1) * post + tl.load(BIAS + NS + nb, mask=nb < NS, other=0.0)[None, :])
        dpost = tl.load(DHPOST + goffs, mask=gmask, other=0.0) * 2.0 * s * (1.0 - s)
    tl.store(DL + t[:, None] * m + NS + nb[None, :], dpost, mask=gmask)
    # the res logits' gradient
    if LITE:
        k = tl.arange(0, RB)
        kmask = tmask[:, None] & (k < m - 2 * NS)[None, :]
        dres = tl.zeros([BT, RB], dtype=tl.float32)
        if HAS_DRES:
            w, roffs, rmask = _lite_start(P, BIAS, tl.load(SCAL + 2), t, tmask, m, m - 2 * NS, NS, NB, RB)
            G = tl.load(DHRES + roffs, mask=rmask, other=0.0)
            dw = tl.zeros([BT, RB], dtype=tl.float32)
            for kk in range(0, m - 2 * NS):  # dw_k = <dH_res, P_k>
                dwk = tl.sum(G * _perm_onehot(PERM, kk, NS, NB)[None, :], axis=1)
                dw = tl.where(k[None, :] == kk, dwk[:, None], dw)
            dres = w * (dw - tl.sum(w * dw, axis=1)[:, None])
        tl.store(DL + t[:, None] * m + 2 * NS + k[None, :], dres, mask=kmask)
    else:
        i = tl.arange(0, NB)
        j = tl.arange(0, NB)
        col = 2 * NS + i[:, None] * NS + j[None, :]
        dmask = tmask[:, None, None] & ((i < NS)[:, None] & (j < NS)[None, :])[None, :, :]
        dres = tl.zeros([BT, NB, NB], dtype=tl.float32)
        if HAS_DRES:
            M0, iv, jv, roffs, rmask = _sk_start(P, BIAS, tl.load(SCAL + 2), t, tmask, m, iters, NS, NB)
            G = tl.load(DHRES + roffs, mask=rmask, other=0.0)  # the gradient of M_iters
            for u in range(iters):  # round iters - u: M_{t-1} -> A_t (columns) -> M_t (rows)
                M = M0
                for _ in range(iters - 1 - u):
                    _a, _c, M, _r = _sk_round(M, iv, jv)
                A, c, Mt, r = _sk_round(M, iv, jv)
                dA = (G - tl.sum(G * Mt, axis=2)[:, :, None]) / r[:, :, None]
                G = (dA - tl.sum(dA * A, axis=1)[:, None, :]) / c[:, None, :]
            dres = G * M0  # through exp; the max shift a constant
        tl.store(DL + t[:, None, None] * m + col[None, :, :], dres, mask=dmask)
    tl.debug_barrier()  # dlogits written, before it is read back flat
    # dp rstd, and (rstd^2 / K) sum_j dp_j p_j
    cols = tl.arange(0, MB)
    fmask = tmask[:, None] & (cols < m)[None, :]
    rstd = tl.load(RSTD + t, mask=tmask, other=0.0)
    dp = tl.load(DL + t[:, None] * m + cols[None, :], mask=fmask, other=0.0) * _scal(SCAL, cols, NS)[None, :]
    coef = tl.sum(dp * tl.load(P + t[:, None] * m + cols[None, :], mask=fmask, other=0.0), axis=1) \
        * (rstd * rstd / K)
    dpr = dp * rstd[:, None]
    # pass 2: dX_i = H_pre[i] dh + phi_i (dp rstd) - coef X_i
    for i in tl.static_range(NS):
        hp = _col(hpre, nb, i)
        for c0 in range(0, C, BC):
            cc = c0 + tl.arange(0, BC)
            ccm = cc < C
            mask = tmask[:, None] & ccm[None, :]
            offs = t[:, None] * K + i * C + cc[None, :]
            phT = _load(PHI, (i * C + cc[None, :]).to(tl.int64) * m + cols[:, None], (cols < m)[:, None] & ccm[None, :])
            dx = tl.dot(dpr, phT, input_precision="ieee") - coef[:, None] * _load(X, offs, mask)
            if HAS_DH:
                dx += hp[:, None] * _load(DH, t[:, None] * C + cc[None, :], mask)
            tl.store(DX + offs, _to(dx, DX.dtype.element_ty, RNE), mask=mask)


@triton.jit
def mhc_pre_dphi(X, DL, SCAL, RSTD, DPHIP, N, K, m, tokens_per_split, NS: tl.constexpr, MB: tl.constexpr,
                 BT: tl.constexpr, BK: tl.constexpr):
    """DPHIP[split, k, j] = sum over the split's tokens of v[k] dp[j] rstd, dp = scal * dlogits."""
    k = tl.program_id(0).to(tl.int64) * BK + tl.arange(0, BK)
    kmask = k < K
    split = tl.program_id(1).to(tl.int64)
    first = split * tokens_per_split
    last = tl.minimum(first + tokens_per_split, N)
    cols = tl.arange(0, MB)
    cmask = cols < m
    sc = _scal(SCAL, cols, NS)
    acc = tl.zeros([BK, MB], dtype=tl.float32)
    for t0 in range(first, last, BT):
        t = t0 + tl.arange(0, BT)
        tmask = t < last
        vT = _load(X, t[None, :] * K + k[:, None], kmask[:, None] & tmask[None, :])
        dpr = tl.load(DL + t[:, None] * m + cols[None, :], mask=tmask[:, None] & cmask[None, :], other=0.0) \
            * sc[None, :] * tl.load(RSTD + t, mask=tmask, other=0.0)[:, None]
        acc = tl.dot(vT, dpr, acc, input_precision="ieee")
    tl.store(DPHIP + split * K * m + k[:, None] * m + cols[None, :], acc, mask=kmask[:, None] & cmask[None, :])
