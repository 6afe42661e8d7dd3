"""Host side of mHC's pre-step Triton kernels (``jit.mhc``), with the CPU host's signatures
(``kernels.cpu.mhc``):

    mhc_pre(x, phi, scal, bias, perm_idx, eps, iters)          -> (h, h_pre, h_post, h_res, p, rstd, state)
    mhc_pre_backward(dh, dh_pre, dh_post, dh_res, x, phi, scal, bias, perm_idx, p, rstd, state, iters)
                                                               -> (dx, dlogits, dphi)

x (..., n, C) in a kernel dtype (read contiguous); phi float32 (nC, m); scal float32 (3,) = (a_pre, a_post, a_res);
bias float32 (m,) = (b_pre, b_post, b_res flattened); perm_idx None (mHC: Sinkhorn-Knopp, r = n^2) or int32
(n!, n) with P_k[i, perm_idx[k, i]] = 1 (mHC-lite); m = 2n + r. h in x's dtype, dx too; everything else float32.
dlogits is the gradient of the pre-activations scal * p + bias; dphi the projection's, summed over the tokens
in (a fixed number of) splits, each a partial of the kernel's, the splits summed here in float64.
The backward kernel recomputes Sinkhorn-Knopp's rounds on chip (DeepSeek's choice on GPUs): ``state`` comes back
(..., 0) and is not read.
"""

from __future__ import annotations

import torch

from ..rows import f32 as _f32, resolved
from .availability import availability
from .norm import OPTIONS, SUPPORTED_DTYPES, next_pow2, on_device

MAX_STREAMS = 8
MAX_OUTPUTS = 128  # m = 2n + n^2 (mHC) or 2n + n! (mHC-lite): the kernels hold a token's m values at once
MAX_ITERS = 64  # Sinkhorn-Knopp's backward recomputes the rounds: iters (iters + 1) / 2 of them
# Tiles: tl.dot takes no side under 16; in IEEE float32 it runs on the FMA units, and wider tiles cost registers
# (ptxas for sm_90 at n = 8, m = 80 held as 128 columns, 8 warps: no spills at these sizes)
_BT = 16  # tokens per program
_BK = 32  # elements of v (rows of phi) per step of the projection, and per program of phi's gradient
_BC = 32  # channels per step of the passes over C
_INTERPRETER_SPLITS = 2  # token splits of phi's gradient under the interpreter (a fixed number: results depend on it)


def applies(x: torch.Tensor, m: int, iters: int = 0) -> bool:
    """Whether the kernels take this call: a kernel dtype, 1 <= n <= 8, C >= 1, m <= 128, 0 <= iters <= 64, and a
    device they run on (CUDA, or any tensor under the interpreter)."""
    if not (x.dtype in SUPPORTED_DTYPES and x.dim() >= 2 and 1 <= x.shape[-2] <= MAX_STREAMS and x.shape[-1] > 0
            and 2 * x.shape[-2] < m <= MAX_OUTPUTS and 0 <= iters <= MAX_ITERS):
        return False
    av = availability()
    return av.available and (x.is_cuda or av.interpreted)


def _k():
    from .jit import mhc as mhc_kernels

    return mhc_kernels


def _geometry(x, phi, perm_idx):
    n, C = x.shape[-2], x.shape[-1]
    m = phi.shape[-1]
    r = m - 2 * n
    if phi.shape != (n * C, m):
        raise ValueError(f"phi must be ({n * C}, m) for x of {n} streams of {C}; got {tuple(phi.shape)}")
    if perm_idx is not None and tuple(perm_idx.shape) != (r, n):
        raise ValueError(f"perm_idx must be ({r}, {n}) for m = {m}; got {tuple(perm_idx.shape)}")
    if perm_idx is None and r != n * n:
        raise ValueError(f"mHC (perm_idx None) needs m = 2n + n^2 = {2 * n + n * n}; got {m}")
    return n, C, x.numel() // (n * C), m, r


def _block(v: int, most: int) -> int:
    return min(max(next_pow2(v), 16), most)


def _meta(n, C, m, r, perm_idx):
    mb = max(next_pow2(m), 16)  # a token's m values, padded
    return dict(NS=n, NB=next_pow2(n), RB=next_pow2(r) if perm_idx is not None else 1, MB=mb,
                LITE=perm_idx is not None, BT=_BT, BC=_block(C, _BC), RNE=availability().interpreted,
                num_warps=4 if mb <= 32 else 8, **OPTIONS)


def _perm(perm_idx, like):
    return like if perm_idx is None else perm_idx.detach().to(device=like.device, dtype=torch.int32).contiguous()


def mhc_pre(x, phi, scal, bias, perm_idx, eps: float, iters: int):
    x, phi, scal, bias, perm_idx = resolved(x, phi, scal, bias, perm_idx)
    x = x.contiguous()
    n, C, N, m, r = _geometry(x, phi, perm_idx)
    lead = x.shape[:-2]
    f = dict(dtype=torch.float32, device=x.device)
    h = torch.empty(lead + (C,), dtype=x.dtype, device=x.device)
    h_pre, h_post = torch.empty(lead + (n,), **f), torch.empty(lead + (n,), **f)
    h_res, p, rstd = torch.empty(lead + (n, n), **f), torch.empty(lead + (m,), **f), torch.empty(lead, **f)
    if N:
        meta = _meta(n, C, m, r, perm_idx)
        with on_device(x):
            _k().mhc_pre_fwd[(-(-N // _BT),)](
                x, _f32(phi), _f32(scal).reshape(3), _f32(bias).reshape(m), _perm(perm_idx, x), h, h_pre, h_post,
                h_res, p, rstd, N, C, m, float(eps), int(iters), BK=_block(n * C, _BK), **meta)
    return h, h_pre, h_post, h_res, p, rstd, torch.empty(lead + (0,), **f)


def _splits(N: int, kblocks: int, x: torch.Tensor) -> int:
    """Token splits of phi's gradient: enough programs to fill the GPU (a fixed number per device)."""
    tiles = -(-N // _BT)
    if x.is_cuda and not availability().interpreted:
        target = 4 * torch.cuda.get_device_properties(x.device).multi_processor_count
        return max(1, min(tiles, -(-target // kblocks)))
    return max(1, min(tiles, _INTERPRETER_SPLITS))


def mhc_pre_backward(dh, dh_pre, dh_post, dh_res, x, phi, scal, bias, perm_idx, p, rstd, state, iters: int):
    (dh, dh_pre, dh_post, dh_res, x, phi, scal, bias, perm_idx, p, rstd) = resolved(
        dh, dh_pre, dh_post, dh_res, x, phi, scal, bias, perm_idx, p, rstd)
    x = x.contiguous()
    n, C, N, m, r = _geometry(x, phi, perm_idx)
    K = n * C
    phi, scal, bias = _f32(phi), _f32(scal).reshape(3), _f32(bias).reshape(m)
    dx = torch.empty_like(x)
    dlogits = torch.empty(x.shape[:-2] + (m,), dtype=torch.float32, device=x.device)
    if not N:
        return dx, dlogits, torch.zeros(K, m, dtype=torch.float32, device=x.device)
    meta = _meta(n, C, m, r, perm_idx)
    p, rstd = _f32(p), _f32(rstd)
    flags = dict(HAS_DH=dh is not None, HAS_DPRE=dh_pre is not None, HAS_DPOST=dh_post is not None,
                 HAS_DRES=dh_res is not None)
    dh = x if dh is None else dh.detach().to(x.dtype).contiguous()  # an absent pointer: x, never read
    grads = [x if g is None else _f32(g) for g in (dh_pre, dh_post, dh_res)]
    bk = _block(K, _BK)
    kblocks = -(-K // bk)
    splits = _splits(N, kblocks, x)
    per_split = -(-(-(-N // splits)) // _BT) * _BT  # whole tiles per split
    splits = -(-N // per_split)
    partials = torch.empty(splits, K, m, dtype=torch.float32, device=x.device)
    with on_device(x):
        _k().mhc_pre_bwd[(-(-N // _BT),)](dh, *grads, x, phi, scal, bias, _perm(perm_idx, x), p, rstd, dx, dlogits,
                                          N, C, m, int(iters), **flags, **meta)
        _k().mhc_pre_dphi[(kblocks, splits)](x, dlogits, scal, rstd, partials, N, K, m, per_split, NS=n,
                                             MB=meta["MB"], BT=_BT, BK=bk, num_warps=meta["num_warps"], **OPTIONS)
    dphi = partials[0] if splits == 1 else partials.sum(0, dtype=torch.float64).to(torch.float32)
    return dx, dlogits, dphi
