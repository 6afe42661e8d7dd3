"""Host side of the DyT / Derf Triton kernels, with the CPU host's signatures (``kernels.cpu.pointwise``);
alpha and shift arrive as tensors here (the CPU host takes their values)."""

from __future__ import annotations

import torch

from ..rows import as_rows, resolved
from .availability import availability
from .norm import MAX_BLOCK, OPTIONS, SUPPORTED_DTYPES, next_pow2, on_device, program_count, sum_partials, warps

_TILE = 4096  # on a GPU and in the interpreter alike


def applies(*ts, D: int = 1) -> bool:
    if not 0 < D <= MAX_BLOCK or not all(t is None or t.dtype in SUPPORTED_DTYPES for t in ts):
        return False
    av = availability()
    first = next(t for t in ts if t is not None)
    return av.available and (first.is_cuda or av.interpreted)


def _k():
    from .jit import pointwise as pointwise_kernels

    return pointwise_kernels


def _scalar_t(v, like):
    return v if isinstance(v, torch.Tensor) else torch.tensor(float(v), dtype=torch.float32, device=like.device)


def _config(N, D):
    block = max(next_pow2(D), 2)  # the backward's scalar partials take two columns
    rows = min(max(_TILE // block, 1), next_pow2(max(N, 1)), 16)
    return rows, block, warps(rows * block)


def _p(t, D):
    return None if t is None else t.detach().reshape(D).contiguous()


def forward(x, residual, alpha, shift, weight, bias, kind, D, want_sum):
    x, residual, weight, bias = resolved(x, residual, weight, bias)
    N = x.numel() // D
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    s = torch.empty(x.shape, dtype=residual.dtype, device=x.device) if residual is not None and want_sum else None
    if N:
        xr, rr = as_rows(x, D), None if residual is None else as_rows(residual, D)
        w, b = _p(weight, D), _p(bias, D)
        rows, block, warps = _config(N, D)
        a_t = _scalar_t(alpha, x)
        with on_device(x):
            _k().pointwise_fwd[(-(-N // rows),)](
                xr, xr if rr is None else rr, a_t, a_t if shift is None else _scalar_t(shift, x),
                xr if w is None else w, xr if b is None else b, y, y if s is None else s, xr.stride(0),
                0 if rr is None else rr.stride(0), N, D, IS_DYT=kind == "dyt", HAS_R=rr is not None,
                HAS_SHIFT=shift is not None, HAS_W=w is not None, HAS_B=b is not None, STORE_S=s is not None,
                ROWS=rows, BLOCK=block, RNE=availability().interpreted, num_warps=warps, **OPTIONS)
    return y, s


def backward(dy, dres, s, alpha, shift, weight, bias, kind, D, mask):
    dy, dres, s, weight, bias = resolved(dy, dres, s, weight, bias)
    N = s.numel() // D
    s = s.contiguous()
    ds = torch.empty_like(s)
    sums = [None] * 3
    if N:
        rows, block, warps = _config(N, D)
        programs = program_count(-(-N // rows), s)
        per = -(-N // programs)
        programs = -(-N // per)
        part = torch.zeros(3, programs, block, dtype=torch.float32, device=s.device)
        dyr, dresr = as_rows(dy, D), None if dres is None else as_rows(dres, D)
        w = _p(weight, D)
        a_t = _scalar_t(alpha, s)
        with on_device(s):
            _k().pointwise_bwd[(programs,)](
                dyr, dyr if dresr is None else dresr, s, a_t, a_t if shift is None else _scalar_t(shift, s),
                s if w is None else w, ds, part, dyr.stride(0), 0 if dresr is None else dresr.stride(0), N, D, per,
                IS_DYT=kind == "dyt", HAS_DRES=dresr is not None, HAS_SHIFT=shift is not None, HAS_W=w is not None,
                ROWS=rows, BLOCK=block, RNE=availability().interpreted, num_warps=warps, **OPTIONS)
        sums = [sum_partials(part[k].contiguous(), block) for k in range(3)]
    dw = db = None
    if weight is not None and mask[2]:
        dw = (sums[0][:D] if N else torch.zeros(D, dtype=torch.float64, device=s.device)).to(weight.dtype)
        dw = dw.view(weight.shape)
    if bias is not None and mask[3]:
        db = (sums[1][:D] if N else torch.zeros(D, dtype=torch.float64, device=s.device)).to(bias.dtype)
        db = db.view(bias.shape)
    scal = sums[2][:2] if N else torch.zeros(2, dtype=torch.float64, device=s.device)
    return ds, scal[0], scal[1], dw, db
