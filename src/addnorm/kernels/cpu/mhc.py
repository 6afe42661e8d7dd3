"""Host side of mHC's pre-step CPU kernels (``mhc_rows.h``); the Triton host (``kernels.triton.mhc``) has the
same signatures without the convention.

    mhc_pre(x, phi, scal, bias, perm_idx, eps, iters, *convention)  -> (h, h_pre, h_post, h_res, p, rstd, state)
    mhc_pre_backward(dh, dh_pre, dh_post, dh_res, x, phi, scal, bias, perm_idx, p, rstd, state, iters, *convention)
                                                                    -> (dx, dlogits, dphi, dcoef)
    mhc_write_pre(x, y, w_post, w_res, products, phi, scal, bias, perm_idx, eps, iters, *convention)
                                                                    -> (x2, h, h_pre, h_post, h_res, p, rstd)
    mhc_write_pre_backward(dx2, dh, dh_pre, dh_post, dh_res, x, y, w_post, w_res, x2, phi, scal, bias, perm_idx, p,
                           rstd, iters, *convention)                -> (dx, dy, d_post, d_res, dlogits, dphi, dcoef)

x (..., n, C) in a kernel dtype; phi float32 (nC, m); scal float32 (3,) = (a_pre, a_post, a_res); bias float32 (m,) =
(b_pre, b_post, b_res flattened); perm_idx None (mHC: Sinkhorn-Knopp) or int32 (n!, n) with P_k[i, perm_idx[k, i]] = 1
(mHC-lite). Per-token outputs and gradients float32; dlogits is the gradient of the pre-activations scal * p + bias,
dphi the projection's, dcoef (3 + m,) float32 the coefficients': the gradients of scal (da_pre, da_post, da_res: the
sums of dlogits * p over the tokens and each group's columns) and of bias (the sums of dlogits), from the kernel's
float64 sums (``COEFFICIENT_SUMS``; the Triton host returns none). ``convention`` is a model's
(``ops.mhc.convention.MhcConvention``'s fields: pre_eps, res_eps, res_transposed, post_scale, post_eps, groups; the
paper's by default): with groups 2 there is no H_res (m = 2n; h_res comes back (..., 0, 0)), with groups 1 no H_post
either (m = n; h_post (..., 0)). The Triton host takes the paper's only (``CONVENTIONS``).

``state`` is (..., state_size) float32: Sinkhorn-Knopp's rounds, kept by the forward so that the backward does not
run them again (mHC; (..., 0) for mHC-lite, whose softmax is one exp per permutation, and for groups < 3, which run
no Sinkhorn); they are the convention's rounds, so the backward must be given the convention the forward was. The
backward recomputes them from p when handed a state of another shape (an empty one).

``mhc_write_pre`` computes the write of the stream first, X' = H_res X + H_post^T y (w_res (..., n, n)) or
X + H_post^T y (w_res None; ``products``: each H_post[i] y rounded to X's dtype first, as eager 16-bit code), y
(..., C) in X's dtype, and reads X' in the same pass: X' and the read of X', as ``mhc_pre(x2, ...)`` returns it
without its state (the fused pass keeps no rounds). Its backward is one pass too: the read's backward on X' (its
rounds recomputed from p; its dX' in float32, plus dx2 where given), then the write's (d_res None without a mixing
matrix).
"""

from __future__ import annotations

import torch

from ..rows import f32 as _f32, resolved
from .library import availability, library
from .norm import DTYPE, empty_rows_like, num_threads, ptr

MAX_STREAMS = 8
MAX_OUTPUTS = 128  # AN_MHC_MAX_M: m = 2n + n^2 (mHC) or 2n + n! (mHC-lite)
MAX_ITERS = 64  # AN_MHC_MAX_ITERS
CONVENTIONS = True  # the kernels take a model's convention (MhcConvention's fields)
PAPER = (0.0, 0.0, False, 2.0, 0.0, 3)  # (pre_eps, res_eps, res_transposed, post_scale, post_eps, groups)
FWD, BWD, WFWD, WBWD = 0, 1, 2, 3
COEFFICIENT_SUMS = True  # the backwards return dcoef, the coefficients' gradients summed over the tokens


def applies(x: torch.Tensor, m: int, iters: int) -> bool:
    """Whether the kernels take this call: a kernel dtype, 1 <= n <= 8, C >= 1, m <= 128, iters <= 64."""
    return (x.dtype in DTYPE and x.dim() >= 2 and 1 <= x.shape[-2] <= MAX_STREAMS and x.shape[-1] > 0
            and m <= MAX_OUTPUTS and 0 <= iters <= MAX_ITERS and availability().available)


def _layouts(phi: torch.Tensor, mp: int, backward: bool) -> tuple:
    """(phi zero-padded to (K, mp), phiT (m, K)), float32 and contiguous, as the kernel reads them, either None
    where the kernel does without it: the backward reads phiT, and transposes phi itself where phi is handed as
    (K, mp) alone (torch's copy of the transposed view took about 100 us a call); the forward reads phi, and takes
    phiT alone where that is how phi lies -- the transposed view of a model's (m, K) weight, which the kernel pads
    in one pass (a strided copy here took 70-160 us a call, most of a decoding step's read)."""
    phi = phi.detach()
    if phi.dtype == torch.float32 and phi.t().is_contiguous() and not (phi.is_contiguous() and phi.shape[1] == mp):
        return None, phi.t()
    phi = phi.to(torch.float32)
    if phi.shape[1] == mp and phi.is_contiguous():
        return phi, None
    if backward:
        return None, phi.t().contiguous()
    out = phi.new_zeros(phi.shape[0], mp)
    out[:, :phi.shape[1]] = phi
    return out, None


def _run(op, x, n, C, N, m, r, iters, phi, scal, bias, perm_idx, eps, conv, outs, grads, write=(None,) * 5,
         write_grads=(None,) * 6):
    mp = -(-m // 8) * 8
    a = [float(v) for v in scal.tolist()]
    phi_mp, phiT = _layouts(phi, mp, op in (BWD, WBWD))  # held here: the kernel reads them through raw pointers
    pre_eps, res_eps, res_t, post_scale, post_eps, groups = conv
    wy, w_post, w_res, products, x2 = write
    rc = library().mhc(op, n, DTYPE[x.dtype], N, C, m, mp, r, iters, ptr(x), ptr(phi_mp),
                       ptr(phiT), a[0], a[1], a[2], ptr(bias), ptr(perm_idx), float(eps), float(pre_eps),
                       float(res_eps), int(bool(res_t)), float(post_scale), float(post_eps), int(groups),
                       *map(ptr, outs), *map(ptr, grads), ptr(wy), ptr(w_post), ptr(w_res), int(bool(products)),
                       ptr(x2), *map(ptr, write_grads), num_threads())
    if rc == -1:
        raise MemoryError("addnorm CPU mHC kernel could not allocate its partial sums")
    if rc:
        raise ValueError(f"addnorm CPU mHC kernel refused the call (code {rc})")


def _geometry(x, phi, perm_idx, scal, bias, groups):
    """(n, C, N, m, r), refusing what the kernel would read out of bounds."""
    n, C = x.shape[-2], x.shape[-1]
    if groups not in (1, 2, 3) or (groups < 3 and perm_idx is not None):
        raise ValueError(f"groups must be 1, 2 or 3 (3 with perm_idx alone), got {groups!r}")
    r = 0 if groups < 3 else n * n if perm_idx is None else perm_idx.shape[0]
    m = n if groups == 1 else 2 * n + r
    if phi.shape != (n * C, m):
        raise ValueError(f"phi must have shape {(n * C, m)} for x of shape {tuple(x.shape)}, got {tuple(phi.shape)}")
    if perm_idx is not None and (r < 1 or perm_idx.shape != (r, n)):
        raise ValueError(f"perm_idx must be (r >= 1, {n}), got {tuple(perm_idx.shape)}")
    if scal.numel() != 3 or bias.numel() != m:
        raise ValueError(f"scal must hold 3 values and bias {m}, got {scal.numel()} and {bias.numel()}")
    return n, C, x.numel() // (n * C), m, r


def state_size(n: int, iters: int, lite: bool, groups: int = 3) -> int:
    """Floats per token of the rounds the forward keeps (AN_MHC_STATE): M0, then per round A (n^2), r and c (n);
    none for mHC-lite nor without H_res (groups < 3: no Sinkhorn)."""
    return 0 if lite or groups < 3 else (1 + iters) * n * n + 2 * iters * n


def _outputs(x, n, C, m, groups):
    """(h, h_pre, h_post, h_res, p, rstd), empty, for the read of x (..., n, C)."""
    lead = x.shape[:-2]
    f = dict(device="cpu", dtype=torch.float32)
    h = torch.empty(lead + (C,), device="cpu", dtype=x.dtype)
    h_post = torch.empty(lead + ((n,) if groups > 1 else (0,)), **f)
    h_res = torch.empty(lead + ((n, n) if groups > 2 else (0, 0)), **f)
    return h, torch.empty(lead + (n,), **f), h_post, h_res, torch.empty(lead + (m,), **f), torch.empty(lead, **f)


def mhc_pre(x, phi, scal, bias, perm_idx, eps, iters, *convention):
    conv = tuple(convention) + PAPER[len(convention):]
    x, phi, scal, bias, perm_idx = resolved(x, phi, scal, bias, perm_idx)
    x = x.contiguous()
    n, C, N, m, r = _geometry(x, phi, perm_idx, scal, bias, conv[5])
    outs = _outputs(x, n, C, m, conv[5])
    S = state_size(n, iters, perm_idx is not None, conv[5])
    state = torch.empty(x.shape[:-2] + (S,), device="cpu", dtype=torch.float32)
    _run(FWD, x, n, C, N, m, r, iters, phi, _f32(scal), _f32(bias), perm_idx, eps, conv,
         (*outs, state if S else None), (None,) * 11)
    return (*outs, state)


def mhc_write_pre(x, y, w_post, w_res, products, phi, scal, bias, perm_idx, eps, iters, *convention):
    conv = tuple(convention) + PAPER[len(convention):]
    x, y, w_post, w_res, phi, scal, bias, perm_idx = resolved(x, y, w_post, w_res, phi, scal, bias, perm_idx)
    x, y = x.contiguous(), y.contiguous()
    n, C, N, m, r = _geometry(x, phi, perm_idx, scal, bias, conv[5])
    if y.dtype != x.dtype or y.shape != x.shape[:-2] + (C,) or w_post.shape != x.shape[:-1] or (
            w_res is not None and w_res.shape != x.shape[:-1] + (n,)):
        raise ValueError(f"y, w_post and w_res must be (..., C) in x's dtype, (..., n) and (..., n, n) for x of shape "
                         f"{tuple(x.shape)}, got {tuple(y.shape)} {y.dtype}, {tuple(w_post.shape)} and "
                         f"{None if w_res is None else tuple(w_res.shape)}")
    x2 = empty_rows_like(x)
    outs = _outputs(x, n, C, m, conv[5])
    _run(WFWD, x, n, C, N, m, r, iters, phi, _f32(scal), _f32(bias), perm_idx, eps, conv,
         (*outs, None), (None,) * 11, (y, _f32(w_post), _f32(w_res), products, x2))
    return (x2, *outs)


def mhc_pre_backward(dh, dh_pre, dh_post, dh_res, x, phi, scal, bias, perm_idx, p, rstd, state, iters, *convention):
    conv = tuple(convention) + PAPER[len(convention):]
    (dh, dh_pre, dh_post, dh_res, x, phi, scal, bias, perm_idx, p, rstd, state) = resolved(
        dh, dh_pre, dh_post, dh_res, x, phi, scal, bias, perm_idx, p, rstd, state)
    x = x.contiguous()
    n, C, N, m, r = _geometry(x, phi, perm_idx, scal, bias, conv[5])
    S = state_size(n, iters, perm_idx is not None, conv[5])
    kept = state is not None and S > 0 and state.shape == x.shape[:-2] + (S,)
    dx = empty_rows_like(x)
    dlogits = torch.empty(x.shape[:-2] + (m,), device="cpu", dtype=torch.float32)
    dphi = torch.empty(phi.shape, device="cpu", dtype=torch.float32)
    dcoef = torch.empty(3 + m, device="cpu", dtype=torch.float32)
    dh = None if dh is None else dh.to(x.dtype).contiguous()
    dh_post = None if conv[5] < 2 else dh_post
    dh_res = None if conv[5] < 3 else dh_res
    _run(BWD, x, n, C, N, m, r, iters, phi, _f32(scal), _f32(bias), perm_idx, 0.0, conv,
         (None,) * 7, (dh, _f32(dh_pre), _f32(dh_post), _f32(dh_res), _f32(p), _f32(rstd),
                       _f32(state) if kept else None, dx, dlogits, dphi, dcoef))
    return dx, dlogits, dphi, dcoef


def mhc_write_pre_backward(dx2, dh, dh_pre, dh_post, dh_res, x, y, w_post, w_res, x2, phi, scal, bias, perm_idx, p,
                           rstd, iters, *convention):
    conv = tuple(convention) + PAPER[len(convention):]
    (dx2, dh, dh_pre, dh_post, dh_res, x, y, w_post, w_res, x2, phi, scal, bias, perm_idx, p, rstd) = resolved(
        dx2, dh, dh_pre, dh_post, dh_res, x, y, w_post, w_res, x2, phi, scal, bias, perm_idx, p, rstd)
    x2, y = x2.contiguous(), y.contiguous()
    n, C, N, m, r = _geometry(x2, phi, perm_idx, scal, bias, conv[5])
    if y.dtype != x2.dtype or x.dtype != x2.dtype or x.shape != x2.shape:
        raise ValueError(f"x and y must be in x2's dtype and x of its shape {tuple(x2.shape)}, got {x.dtype} "
                         f"{tuple(x.shape)} and {y.dtype}")
    dx, dy = empty_rows_like(x2), empty_rows_like(y)
    d_post = torch.empty(x2.shape[:-1], device="cpu", dtype=torch.float32)
    d_res = None if w_res is None else torch.empty(x2.shape[:-1] + (n,), device="cpu", dtype=torch.float32)
    dlogits = torch.empty(x2.shape[:-2] + (m,), device="cpu", dtype=torch.float32)
    dphi = torch.empty(phi.shape, device="cpu", dtype=torch.float32)
    dcoef = torch.empty(3 + m, device="cpu", dtype=torch.float32)
    dh = None if dh is None else dh.to(x2.dtype).contiguous()
    dx2 = None if dx2 is None else dx2.to(x2.dtype).contiguous()
    dh_post = None if conv[5] < 2 else dh_post
    dh_res = None if conv[5] < 3 else dh_res
    _run(WBWD, x2, n, C, N, m, r, iters, phi, _f32(scal), _f32(bias), perm_idx, 0.0, conv,
         (None,) * 7, (dh, _f32(dh_pre), _f32(dh_post), _f32(dh_res), _f32(p), _f32(rstd), None, None, dlogits, dphi,
                       dcoef),
         (y, _f32(w_post), _f32(w_res), False, None),
         (None if w_res is None else x.contiguous(), dx2, dx, dy, d_post, d_res))
    return dx, dy, d_post, d_res, dlogits, dphi, dcoef
