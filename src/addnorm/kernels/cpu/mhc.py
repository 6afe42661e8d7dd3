"""Host side of mHC's pre-step CPU kernels (``mhc_rows.h``); the Triton host (``kernels.triton.mhc``) has the
same signatures.

    mhc_pre(x, phi, scal, bias, perm_idx, eps, iters, pre_eps=0, res_eps=0, res_transposed=False)
                                                               -> (h, h_pre, h_post, h_res, p, rstd, state)
    mhc_pre_backward(dh, dh_pre, dh_post, dh_res, x, phi, scal, bias, perm_idx, p, rstd, state, iters, pre_eps=0,
                     res_eps=0, res_transposed=False)          -> (dx, dlogits, dphi)

x (..., n, C) in a kernel dtype; phi float32 (nC, m); scal float32 (3,) = (a_pre, a_post, a_res); bias float32 (m,)
= (b_pre, b_post, b_res flattened); perm_idx None (mHC: Sinkhorn-Knopp) or int32 (n!, n) with P_k[i, perm_idx[k, i]]
= 1 (mHC-lite). Per-token outputs and gradients float32; dlogits is the gradient of the pre-activations
scal * p + bias, dphi the projection's. The last three arguments are a model's convention
(``ops.mhc.convention.MhcConvention``; the paper's by default). The Triton host takes the paper's only
(``CONVENTIONS``). ``state`` is (..., state_size) float32: Sinkhorn-Knopp's rounds, kept by the forward so that the
backward does not run them again (mHC; (..., 0) for mHC-lite, whose softmax is one exp per permutation); they are
the convention's rounds, so the backward must be given the convention the forward was. The backward recomputes them
from p when handed a state of another shape (an empty one).
"""

from __future__ import annotations

import torch

from ..rows import f32 as _f32, resolved
from .library import availability, library
from .norm import DTYPE, empty_rows_like, num_threads, ptr

MAX_STREAMS = 8
MAX_OUTPUTS = 128  # AN_MHC_MAX_M: m = 2n + n^2 (mHC) or 2n + n! (mHC-lite)
MAX_ITERS = 64  # AN_MHC_MAX_ITERS
CONVENTIONS = True  # the kernels take a model's convention (pre_eps, res_eps, res_transposed)
FWD, BWD = 0, 1


def applies(x: torch.Tensor, m: int, iters: int) -> bool:
    """Whether the kernels take this call: a kernel dtype, 1 <= n <= 8, C >= 1, m <= 128, iters <= 64."""
    return (x.dtype in DTYPE and x.dim() >= 2 and 1 <= x.shape[-2] <= MAX_STREAMS and x.shape[-1] > 0
            and m <= MAX_OUTPUTS and 0 <= iters <= MAX_ITERS and availability().available)


def _padded(phi: torch.Tensor, mp: int) -> torch.Tensor:
    if phi.shape[1] == mp and phi.is_contiguous():
        return phi
    out = phi.new_zeros(phi.shape[0], mp)
    out[:, :phi.shape[1]] = phi
    return out


def _run(op, x, n, C, N, m, r, iters, phi, phiT, scal, bias, perm_idx, eps, conv, outs, grads):
    mp = -(-m // 8) * 8
    a = [float(v) for v in scal.tolist()]
    phi_mp = _padded(phi, mp)  # held here: the kernel reads it through a raw pointer
    rc = library().mhc(op, n, DTYPE[x.dtype], N, C, m, mp, r, iters, ptr(x), ptr(phi_mp),
                       ptr(phiT), a[0], a[1], a[2], ptr(bias), ptr(perm_idx), float(eps), float(conv[0]),
                       float(conv[1]), int(bool(conv[2])), *map(ptr, outs),
                       *map(ptr, grads), num_threads())
    if rc == -1:
        raise MemoryError("addnorm CPU mHC kernel could not allocate its partial sums")
    if rc:
        raise ValueError(f"addnorm CPU mHC kernel refused the call (code {rc})")


def _geometry(x, phi, perm_idx, scal, bias):
    """(n, C, N, m, r), refusing what the kernel would read out of bounds."""
    n, C = x.shape[-2], x.shape[-1]
    r = n * n if perm_idx is None else perm_idx.shape[0]
    m = 2 * n + r
    if phi.shape != (n * C, m):
        raise ValueError(f"phi must have shape {(n * C, m)} for x of shape {tuple(x.shape)}, got {tuple(phi.shape)}")
    if perm_idx is not None and (r < 1 or perm_idx.shape != (r, n)):
        raise ValueError(f"perm_idx must be (r >= 1, {n}), got {tuple(perm_idx.shape)}")
    if scal.numel() != 3 or bias.numel() != m:
        raise ValueError(f"scal must hold 3 values and bias {m}, got {scal.numel()} and {bias.numel()}")
    return n, C, x.numel() // (n * C), m, r


def state_size(n: int, iters: int, lite: bool) -> int:
    """Floats per token of the rounds the forward keeps (AN_MHC_STATE): M0, then per round A (n^2), r and c (n)."""
    return 0 if lite else (1 + iters) * n * n + 2 * iters * n


def mhc_pre(x, phi, scal, bias, perm_idx, eps, iters, pre_eps=0.0, res_eps=0.0, res_transposed=False):
    x, phi, scal, bias, perm_idx = resolved(x, phi, scal, bias, perm_idx)
    x = x.contiguous()
    n, C, N, m, r = _geometry(x, phi, perm_idx, scal, bias)
    lead = x.shape[:-2]
    f = dict(device="cpu", dtype=torch.float32)
    h = torch.empty(lead + (C,), device="cpu", dtype=x.dtype)
    h_pre, h_post = torch.empty(lead + (n,), **f), torch.empty(lead + (n,), **f)
    h_res, p, rstd = torch.empty(lead + (n, n), **f), torch.empty(lead + (m,), **f), torch.empty(lead, **f)
    S = state_size(n, iters, perm_idx is not None)
    state = torch.empty(lead + (S,), **f)
    _run(FWD, x, n, C, N, m, r, iters, _f32(phi), None, _f32(scal), _f32(bias), perm_idx, eps,
         (pre_eps, res_eps, res_transposed), (h, h_pre, h_post, h_res, p, rstd, state if S else None), (None,) * 10)
    return h, h_pre, h_post, h_res, p, rstd, state


def mhc_pre_backward(dh, dh_pre, dh_post, dh_res, x, phi, scal, bias, perm_idx, p, rstd, state, iters, pre_eps=0.0,
                     res_eps=0.0, res_transposed=False):
    (dh, dh_pre, dh_post, dh_res, x, phi, scal, bias, perm_idx, p, rstd, state) = resolved(
        dh, dh_pre, dh_post, dh_res, x, phi, scal, bias, perm_idx, p, rstd, state)
    x = x.contiguous()
    n, C, N, m, r = _geometry(x, phi, perm_idx, scal, bias)
    S = state_size(n, iters, perm_idx is not None)
    kept = state is not None and S > 0 and state.shape == x.shape[:-2] + (S,)
    phi = _f32(phi)
    dx = empty_rows_like(x)
    dlogits = torch.empty(x.shape[:-2] + (m,), device="cpu", dtype=torch.float32)
    dphi = torch.empty(phi.shape, device="cpu", dtype=torch.float32)
    dh = None if dh is None else dh.to(x.dtype).contiguous()
    _run(BWD, x, n, C, N, m, r, iters, phi, phi.t().contiguous(), _f32(scal), _f32(bias), perm_idx, 0.0,
         (pre_eps, res_eps, res_transposed), (None,) * 7,
         (dh, _f32(dh_pre), _f32(dh_post), _f32(dh_res), _f32(p), _f32(rstd), _f32(state) if kept else None, dx,
          dlogits, dphi))
    return dx, dlogits, dphi
