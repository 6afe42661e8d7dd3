"""mHC's pre step (the widened stream's coefficients and the sub-layer input) in torch ops: what the fused
kernels compute, and their double backward and forward-mode AD.

From the stream X (..., n, C), per token (mHC, arXiv:2512.24880, eqs. 7-9; mHC-lite, arXiv:2601.05732):

    v      = vec(X)                                  (K = nC values)
    rstd   = 1 / sqrt(|v|^2 / K + eps)               the RMSNorm of vec(X), without a weight
    p      = (v phi) rstd                            phi (K, m): m = 2n + n^2 (mHC) or 2n + n! (mHC-lite)
    H_pre  = sigmoid(a_pre p[:n] + b_pre)
    H_post = 2 sigmoid(a_post p[n:2n] + b_post)
    H_res  = Sinkhorn-Knopp(a_res mat(p[2n:]) + b_res, iters)                       (mHC)
           = sum_k softmax(a_res p[2n:] + b_res)_k P_k   over the n! permutations    (mHC-lite)
    h      = sum_i H_pre[i] X_i

Outputs (h, H_pre, H_post, H_res, p, rstd): h in X's dtype; everything else in float32 (float64 when X or phi
or a coefficient is float64). p and rstd are what a backward needs (as native_layer_norm's mean and rstd): not
differentiable.
``perms`` is the (n!, n, n) stack of permutation matrices for mHC-lite, None for mHC.

A model's own conventions (``convention.MhcConvention``; every function takes its fields last, the paper's by
default): ``pre_eps`` added to H_pre; ``res_eps`` in Sinkhorn-Knopp (the first normalisation's result + eps, every
later sum + eps); ``res_transposed``: the H_res logits are mat(.)^T (DeepSeek-V4's rows-first Sinkhorn mixed with
its transpose); H_post = ``post_scale`` sigmoid(.) + ``post_eps`` (the paper's 2 and 0; HY-V4's hc_magnitude and
hc_eps); ``groups``: 3 the three maps, 2 no H_res (HY-V4's iHC: phi (K, 2n), H_res empty (..., 0, 0)), 1 H_pre
alone (a final collapse: phi (K, n), H_post empty (..., 0)).

The operator (``pre_op``) adds ``state``: what its backward keeps from the forward (Sinkhorn-Knopp's rounds on the
CPU, ``state_size`` floats a token; none elsewhere, nor for mHC-lite or groups < 3), the convention's rounds. Not
differentiable.

The write of the stream before a read (``write``, ``write_backward``): X' = H_res X + H_post^T y as the stream
family's write (``ops.stream.formulas``), or, with no mixing matrix, X' = X + H_post^T y (HY-V4's, each stream its
own), rounded once to X's dtype or, with ``products``, each product H_post[i] y first (eager 16-bit code's).
"""

from __future__ import annotations

import contextlib

import torch


def _autocast_off(t: torch.Tensor):
    """Autocast off on the tensor's device type (a meta tensor has no autocast to turn off)."""
    kind = t.device.type
    return torch.autocast(kind, enabled=False) if kind in ("cpu", "cuda", "xpu") else contextlib.nullcontext()


def compute_dtype(*ts) -> torch.dtype:
    return torch.float64 if any(t is not None and t.dtype == torch.float64 for t in ts) else torch.float32


def _column_max(logits: torch.Tensor, iters: int):
    """The shift taken before exp: each column's max (a constant: the first round divides it out), or 0 when no
    round follows."""
    return logits.amax(dim=-2, keepdim=True).detach() if iters else 0.0


def state_size(x: torch.Tensor, perms, iters: int, groups: int = 3) -> int:
    """Floats per token of the rounds the operator's forward keeps for its backward: M0, then per round the
    column-normalized A (n^2), its row sums r and the column sums c (n each), as the CPU kernels lay them out. Kept
    for mHC on the CPU, where memory is plentiful and the rounds are scalar divisions: (1 + iters) n^2 + 2 iters n
    (496 at n = 4, 20 rounds, a sixth of a float32 stream token's 4 x 768). None for mHC-lite (its softmax is one exp
    per permutation), without H_res (groups < 3: no Sinkhorn), nor on other devices, whose kernels recompute them on
    chip as DeepSeek's do."""
    n = x.shape[-2]
    kept = perms is None and groups == 3 and x.device.type == "cpu"
    return (1 + iters) * n * n + 2 * iters * n if kept else 0


def sinkhorn_knopp(logits: torch.Tensor, iters: int, res_eps: float = 0.0) -> torch.Tensor:
    """mHC eq. 9: M0 = exp(logits) (..., n, n); each iteration divides by the column sums, then by the
    row sums (M_t = T_r(T_c(M_{t-1}))). The result's rows sum to 1 exactly, its columns approximately.

    exp is taken after subtracting each column's maximum: a factor per column that the first normalization
    (T_c, over the columns) divides out exactly, so the result is the same, exp cannot overflow, and no column
    underflows to all zeros (0 / 0) as it did under the matrix's maximum once its logits sat ~104 below it in
    float32. With no rounds (iters = 0) nothing divides a shift out: M0 = exp(logits) itself, as eq. 9 says.

    ``res_eps`` (DeepSeek-V4's): the first T_c's result (a softmax over each column) + eps, and every later sum
    + eps. With 0 these are the paper's rounds, bit for bit.
    """
    m = torch.exp(logits - _column_max(logits, iters))
    for t in range(iters):
        m = m / _denominator(m.sum(-2, keepdim=True), t, res_eps)  # T_c: columns sum to 1
        if t == 0 and res_eps:
            m = m + res_eps
        m = m / (m.sum(-1, keepdim=True) + res_eps)  # T_r: rows sum to 1
    return m


def _denominator(c, t, res_eps):
    """A column normalisation's denominator: the first is exact (a softmax), every later one + res_eps."""
    return c if t == 0 else c + res_eps


def _res_matrix(res_logits, n, res_transposed):
    """The (..., n, n) logits Sinkhorn-Knopp takes: mat(.) row-major, or its transpose."""
    L = _split_last(res_logits, n, n)
    return L.transpose(-1, -2) if res_transposed else L


def permutation_mix(logits: torch.Tensor, perms: torch.Tensor) -> torch.Tensor:
    """sum_k softmax(logits)_k P_k: (..., n!) and (n!, n, n) -> (..., n, n), doubly stochastic exactly."""
    w = torch.softmax(logits, dim=-1)
    return torch.einsum("...k,kij->...ij", w, perms.to(w.dtype))


def _groups(n: int) -> tuple[slice, slice, slice]:
    """The columns of p (and of the logits) that H_pre, H_post and H_res are made from."""
    return slice(0, n), slice(n, 2 * n), slice(2 * n, None)


def _logits(p, n, a, b):
    """The pre-activations a_g p_g + b_g of the three groups (pre, post, res), b_res flattened."""
    return [a[i] * p[..., g] + b[i].reshape(-1) for i, g in enumerate(_groups(n))]


def _project(x, phi, ct, eps):
    """(X, v, rstd, z, p): the stream and vec(X) in the compute dtype, the RMS's reciprocal, z = v phi, p = z rstd."""
    X = x.to(ct)
    v = X.flatten(-2)
    rstd = torch.rsqrt((v * v).sum(-1) / v.size(-1) + eps)
    z = v @ phi.to(ct)
    return X, v, rstd, z, z * rstd.unsqueeze(-1)


def coefficients(p, n, a_pre, a_post, a_res, b_pre, b_post, b_res, perms, iters, pre_eps=0.0, res_eps=0.0,
                 res_transposed=False, post_scale=2.0, post_eps=0.0, groups=3):
    """(H_pre, H_post, H_res) from the normalized projection p (..., m); the groups it does not make empty."""
    pre_, post_, res_ = _logits(p, n, (a_pre, a_post, a_res), (b_pre, b_post, b_res))
    h_pre, h_post = torch.sigmoid(pre_) + pre_eps, post_scale * torch.sigmoid(post_) + post_eps
    if groups < 3:
        h_res = p.new_zeros(p.shape[:-1] + (0, 0))
    elif perms is None:
        h_res = sinkhorn_knopp(_res_matrix(res_, n, res_transposed), iters, res_eps)
    else:
        h_res = permutation_mix(res_, perms)
    return h_pre, h_post, h_res


def coefficient_grads_from_sums(dcoef, n, coeffs):
    """``coefficient_grads`` from a kernel's sums over the tokens: dcoef (3 + m,) = (da_pre, da_post, da_res, then
    db over the m columns), as the C kernels return it. Each its own tensor (an operator's outputs may not alias), cut
    by one copying split: the six copies of single slices took as long as summing dlogits here had."""
    cols = range(dcoef.numel() - 3)
    sizes = [1, 1, 1] + [len(cols[g]) for g in _groups(n)]
    return tuple(d.view(c.shape).to(c.dtype)
                 for d, c in zip(torch.split_with_sizes_copy(dcoef, sizes), coeffs, strict=True))


def coefficient_grads(dlogits, p, n, coeffs):
    """(da_pre, da_post, da_res, db_pre, db_post, db_res) in the coefficients' dtypes from the gradient of the
    pre-activations (..., m): d logit / d a = p, d logit / d b = 1, summed over the tokens (any may be empty)."""
    m = dlogits.size(-1)
    dl, pf = dlogits.reshape(-1, m), p.reshape(-1, m)  # tokens as rows (none, one or many; m >= 3)
    groups = _groups(n)
    da = [(dl[:, g] * pf[:, g]).sum() for g in groups]
    db = [dl[:, g].sum(0) for g in groups]
    return tuple(d.reshape(c.shape).to(c.dtype) for d, c in zip(da + db, coeffs, strict=True))


def pre(x, phi, a_pre, a_post, a_res, b_pre, b_post, b_res, perms, eps, iters, pre_eps=0.0, res_eps=0.0,
        res_transposed=False, post_scale=2.0, post_eps=0.0, groups=3):
    """(h, H_pre, H_post, H_res, p, rstd); see the module docstring. Autocast is off inside: the coefficients are
    float32 at least whatever the caller's autocast state (under CPU autocast the projection would run in bf16)."""
    with _autocast_off(x):
        return _pre(x, phi, a_pre, a_post, a_res, b_pre, b_post, b_res, perms, eps, iters, pre_eps, res_eps,
                    res_transposed, post_scale, post_eps, groups)


def _pre(x, phi, a_pre, a_post, a_res, b_pre, b_post, b_res, perms, eps, iters, pre_eps, res_eps, res_transposed,
         post_scale=2.0, post_eps=0.0, groups=3):
    ct = compute_dtype(x, phi, a_pre, a_post, a_res, b_pre, b_post, b_res)
    X, _, rstd, _, p = _project(x, phi, ct, eps)
    c = [t.to(ct) for t in (a_pre, a_post, a_res, b_pre, b_post, b_res)]
    h_pre, h_post, h_res = coefficients(p, x.size(-2), *c, perms, iters, pre_eps, res_eps, res_transposed,
                                        post_scale, post_eps, groups)
    h = (h_pre.unsqueeze(-1) * X).sum(-2).to(x.dtype)
    return h, h_pre, h_post, h_res, p, rstd


def pre_op(x, phi, a_pre, a_post, a_res, b_pre, b_post, b_res, perms, eps, iters, pre_eps=0.0, res_eps=0.0,
           res_transposed=False, post_scale=2.0, post_eps=0.0, groups=3):
    """The operator's outputs: ``pre``'s, then ``state`` (``state_size`` floats a token, the convention's rounds)."""
    with _autocast_off(x):
        out = _pre(x, phi, a_pre, a_post, a_res, b_pre, b_post, b_res, perms, eps, iters, pre_eps, res_eps,
                   res_transposed, post_scale, post_eps, groups)
        p, ct = out[4], out[4].dtype
        if not state_size(x, perms, iters, groups):
            return (*out, p.new_empty(p.shape[:-1] + (0,)))
        return (*out, coefficient_state(p, x.size(-2), a_res.to(ct), b_res.to(ct), iters, res_eps, res_transposed))


def _split_last(t, a, b):
    """The last dim of t as (a, b): a reshape rather than ``unflatten``, which the vmap of
    ``autograd.grad(..., is_grads_batched=True)`` cannot batch."""
    return t.reshape(*t.shape[:-1], a, b)


def pre_backward(dh, dh_pre, dh_post, dh_res, x, phi, a_pre, a_post, a_res, b_pre, b_post, b_res, perms, eps, iters,
                 pre_eps=0.0, res_eps=0.0, res_transposed=False, post_scale=2.0, post_eps=0.0, groups=3):
    """Gradients of (x, phi, a_pre, a_post, a_res, b_pre, b_post, b_res) from those of (h, H_pre, H_post, H_res)
    (None: zero), written out in torch ops as the kernels compute them -- differentiable again (double backward),
    and carrying forward-mode tangents (a Hessian-vector product taken forward-over-reverse). The rounds are
    recomputed from x here: the ones the forward kept are not differentiable."""
    with _autocast_off(x):
        return _pre_backward(dh, dh_pre, dh_post, dh_res, x, phi, a_pre, a_post, a_res, b_pre, b_post, b_res, perms,
                             eps, iters, pre_eps, res_eps, res_transposed, post_scale, groups)


def sinkhorn_rounds(L, iters, res_eps=0.0):
    """(M0, [(A, r, c, M) per round]) of sinkhorn_knopp(L, iters, res_eps): A = M / c (columns), M = (A [+ eps]) / r
    (rows); c and r the denominators, res_eps in them (the first c none, the first A's eps not in A)."""
    m0 = torch.exp(L - _column_max(L, iters))
    m, rounds = m0, []
    for t in range(iters):
        c = _denominator(m.sum(-2, keepdim=True), t, res_eps)
        a = m / c
        a_in = a + res_eps if t == 0 and res_eps else a  # what the rows normalise
        r = a_in.sum(-1, keepdim=True) + res_eps
        m = a_in / r
        rounds.append((a, r, c, m))
    return m0, rounds


def coefficient_state(p, n, a_res, b_res, iters, res_eps=0.0, res_transposed=False):
    """The rounds ``state_size`` counts, laid out as the CPU kernels keep them, from p (..., m): those of the
    convention's Sinkhorn-Knopp (res_eps in it, on the logits transposed where res_transposed says)."""
    L = _res_matrix(a_res * p[..., 2 * n:] + b_res.reshape(-1), n, res_transposed)
    m0, rounds = sinkhorn_rounds(L, iters, res_eps)
    parts = [m0.flatten(-2)]
    for a, r, c, _ in rounds:
        parts += [a.flatten(-2), r.flatten(-2), c.flatten(-2)]
    return torch.cat(parts, -1)


def _sinkhorn_backward(L, iters, dout, res_eps=0.0):
    """dL of sinkhorn_knopp(L, iters, res_eps) from dOut, through every round (the column max shift a constant;
    the eps added after the first round a constant too)."""
    m0, rounds = sinkhorn_rounds(L, iters, res_eps)
    g = dout
    for a, r, c, out in reversed(rounds):
        g = (g - (g * out).sum(-1, keepdim=True)) / r  # out = (a [+ eps]) / r (rows)
        g = (g - (g * a).sum(-2, keepdim=True)) / c  # a = m / c (columns)
    return g * m0


def _pre_backward(dh, dh_pre, dh_post, dh_res, x, phi, a_pre, a_post, a_res, b_pre, b_post, b_res, perms, eps,
                  iters, pre_eps, res_eps, res_transposed, post_scale=2.0, groups=3):
    coeffs = (a_pre, a_post, a_res, b_pre, b_post, b_res)
    ct = compute_dtype(x, phi, *coeffs)
    n = x.size(-2)
    X, v, rstd, _, p = _project(x, phi, ct, eps)
    K = v.size(-1)
    a = [t.to(ct) for t in coeffs[:3]]
    logits = _logits(p, n, a, [t.to(ct) for t in coeffs[3:]])
    s_pre, s_post = torch.sigmoid(logits[0]), torch.sigmoid(logits[1])
    zero = torch.zeros_like(s_pre)
    g_pre = zero if dh_pre is None else dh_pre.to(ct)
    if dh is not None:
        g_pre = g_pre + (dh.to(ct).unsqueeze(-2) * X).sum(-1)
    dl = [g_pre * s_pre * (1 - s_pre),
          torch.zeros_like(s_post) if dh_post is None or groups < 2 else dh_post.to(ct) * post_scale * s_post
          * (1 - s_post)]
    if dh_res is None or groups < 3:
        dl.append(torch.zeros_like(logits[2]))
    elif perms is None:
        dL = _sinkhorn_backward(_res_matrix(logits[2], n, res_transposed), iters, dh_res.to(ct), res_eps)
        dL = dL.transpose(-1, -2) if res_transposed else dL
        dl.append(dL.reshape(dL.shape[:-2] + (n * n,)))  # reshape, not flatten: vmap (batched gradients) has no
        # batching rule for flatten of this layout; n * n, not -1: no tokens leave -1 ambiguous
    else:
        w = torch.softmax(logits[2], dim=-1)
        dw = torch.einsum("...ij,kij->...k", dh_res.to(ct), perms.to(ct))
        dl.append(w * (dw - (w * dw).sum(-1, keepdim=True)))
    dp = torch.cat([a[i] * dl[i] for i in range(3)], -1)
    dz = dp * rstd.unsqueeze(-1)
    dv = dz @ phi.to(ct).transpose(0, 1) - ((rstd * rstd / K) * (dp * p).sum(-1)).unsqueeze(-1) * v
    dx = _split_last(dv, n, x.size(-1))
    if dh is not None:
        dx = dx + (s_pre + pre_eps).unsqueeze(-1) * dh.to(ct).unsqueeze(-2)
    dphi = v.reshape(-1, K).transpose(0, 1) @ dz.reshape(-1, p.size(-1))
    return (dx.to(x.dtype), dphi.to(phi.dtype), *coefficient_grads(torch.cat(dl, -1), p, n, coeffs))


def pre_jvp(primals, tangents, perms, eps, iters, pre_eps=0.0, res_eps=0.0, res_transposed=False, post_scale=2.0,
            post_eps=0.0, groups=3):
    """Forward-mode derivative of (h, H_pre, H_post, H_res) along ``tangents`` (None: zero), written out (an
    autograd.Function's jvp runs inside a dual level, where torch.func.jvp cannot open another)."""
    with _autocast_off(primals[0]):
        return _pre_jvp(primals, tangents, perms, eps, iters, pre_eps, res_eps, res_transposed, post_scale, groups)


def _pre_jvp(primals, tangents, perms, eps, iters, pre_eps, res_eps, res_transposed, post_scale=2.0, groups=3):
    x, phi, a_pre, a_post, a_res, b_pre, b_post, b_res = primals
    ct = compute_dtype(*primals)
    n = x.size(-2)
    P = [t.to(ct) for t in primals]
    T = [torch.zeros_like(p) if t is None else t.to(ct) for p, t in zip(P, tangents, strict=True)]
    xf, v, rstd, z, p = _project(P[0], P[1], ct, eps)
    tv = T[0].flatten(-2)
    K = v.size(-1)
    t_rstd = -(rstd ** 3) * (v * tv).sum(-1) / K
    tz = tv @ P[1] + v @ T[1]
    tp = tz * rstd.unsqueeze(-1) + z * t_rstd.unsqueeze(-1)
    logits = _logits(p, n, P[2:5], P[5:8])
    t_logits = [T[2 + i] * p[..., g] + P[2 + i] * tp[..., g] + T[5 + i].reshape(-1) for i, g in enumerate(_groups(n))]
    s_pre, s_post = torch.sigmoid(logits[0]), torch.sigmoid(logits[1])
    t_pre = s_pre * (1 - s_pre) * t_logits[0]
    t_post = post_scale * s_post * (1 - s_post) * t_logits[1]
    if groups < 3:
        t_res = p.new_zeros(p.shape[:-1] + (0, 0))
    elif perms is None:
        L, tL = _res_matrix(logits[2], n, res_transposed), _res_matrix(t_logits[2], n, res_transposed)
        m = torch.exp(L - _column_max(L, iters))
        tm = m * tL  # the column max shift is divided out by the first normalization (none without one)
        for t in range(iters):
            c = _denominator(m.sum(-2, keepdim=True), t, res_eps)
            m = m / c
            tm = (tm - m * tm.sum(-2, keepdim=True)) / c
            if t == 0 and res_eps:
                m = m + res_eps  # a constant: the tangent is unchanged
            r = m.sum(-1, keepdim=True) + res_eps
            m = m / r
            tm = (tm - m * tm.sum(-1, keepdim=True)) / r
        t_res = tm
    else:
        w = torch.softmax(logits[2], dim=-1)
        tw = w * (t_logits[2] - (w * t_logits[2]).sum(-1, keepdim=True))
        t_res = torch.einsum("...k,kij->...ij", tw, perms.to(ct))
    th = (t_pre.unsqueeze(-1) * xf + (s_pre + pre_eps).unsqueeze(-1) * T[0]).sum(-2).to(x.dtype)
    return th, t_pre, t_post, t_res
