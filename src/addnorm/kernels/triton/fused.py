"""Host side of the fused forms' Triton kernels (``jit.fused``), with the CPU host's signatures
(``kernels.cpu.fused``): norm-then-add, the parallel residual forward and its backward."""

from __future__ import annotations

import torch

from ..rows import as_rows, resolved
from .availability import availability
from .norm import (MAX_BLOCK, OPTIONS, SUPPORTED_DTYPES, backward_rows, backward_tile, config, on_device, program_count,
                   sum_partials, tl_dtype)


def applies(*ts, D: int = 1) -> bool:
    """Whether the kernels take these tensors (None: absent): their dtypes, a device they run on, and rows
    that fit one block (longer rows take the formulas)."""
    if not 0 < D <= MAX_BLOCK or not all(t is None or t.dtype in SUPPORTED_DTYPES for t in ts):
        return False
    av = availability()
    first = next(t for t in ts if t is not None)
    return av.available and (first.is_cuda or av.interpreted)


def _k():
    from .jit import fused as fused_kernels

    return fused_kernels


def _config(N: int, D: int, max_rows: int | None = None, tile_elems: int | None = None):
    rows, block, _, nw = config(N, D, max_rows, tile_elems=tile_elems)  # D <= MAX_BLOCK here: one chunk
    return rows, block, nw


def _p(t, D):
    return None if t is None else t.detach().reshape(D).contiguous()


def _forward(kind, X, A, M, post, params, eps, weight_offset, cast_before_weight, amdt, ndt, y, y2, s, stats, N, D):
    w1, b1, w2, b2 = (_p(p, D) for p in params)
    rows, block, warps = _config(N, D)
    layer = kind == "layer"
    Xr = as_rows(X, D)
    Ar, Mr, Pr = (None if t is None else as_rows(t, D) for t in (A, M, post))
    yv, y2v, sv = (None if t is None else t.view(N, D) for t in (y, y2, s))
    any_out = next(t for t in (yv, y2v, sv) if t is not None)
    rstd = stats[-1] if stats is not None else Xr
    mean = stats[0] if stats is not None and layer else rstd
    pick = lambda t: Xr if t is None else t  # noqa: E731  (an absent pointer: any tensor, never read)
    with on_device(X):
        _k().fused_fwd[(-(-N // rows),)](
            Xr, pick(Ar), pick(Mr), pick(Pr), pick(w1), pick(b1), pick(w2), pick(b2),
            any_out if yv is None else yv, any_out if y2v is None else y2v, any_out if sv is None else sv, mean, rstd,
            Xr.stride(0), *(0 if t is None else t.stride(0) for t in (Ar, Mr, Pr, yv, y2v, sv)), N, D, float(eps),
            float(weight_offset), AMDT=tl_dtype(amdt), NDT=tl_dtype(ndt), IS_LAYER=layer, HAS_A=Ar is not None,
            HAS_M=Mr is not None, HAS_P=Pr is not None, HAS_W1=w1 is not None, HAS_B1=b1 is not None,
            HAS_W2=w2 is not None, HAS_B2=b2 is not None, STORE_Y=yv is not None, STORE_Y2=y2v is not None,
            STORE_S=sv is not None, STORE_STATS=stats is not None, CAST_BEFORE_W=bool(cast_before_weight), ROWS=rows,
            BLOCK=block, RNE=availability().interpreted, num_warps=warps, **OPTIONS)


def norm_add(x, residual, weight, bias, kind, D, eps, weight_offset, cast_before_weight, out_dtype, want_stats=True):
    x, residual, weight, bias = resolved(x, residual, weight, bias)
    N = x.numel() // D
    stats = torch.empty(2 if kind == "layer" else 1, N, dtype=torch.float32, device=x.device) if want_stats else None
    out = torch.empty(x.shape, dtype=out_dtype, device=x.device)
    if N:
        _forward(kind, x, None, None, residual, (weight, bias, None, None), eps, weight_offset, cast_before_weight,
                 x.dtype, x.dtype, out, None, None, stats, N, D)
    return out, stats


def parallel_add_norm(x, x2, residual, weight, bias, weight2, bias2, kind, D, eps, weight_offset, cast_before_weight,
                      two, branches_first, want_stats=True):
    x, x2, residual, weight, bias, weight2, bias2 = resolved(x, x2, residual, weight, bias, weight2, bias2)
    N = x.numel() // D
    dev = x.device
    stats = torch.empty(2 if kind == "layer" else 1, N, dtype=torch.float32, device=dev) if want_stats else None
    y = torch.empty(x.shape, dtype=x.dtype, device=dev)
    y2 = torch.empty(x.shape, dtype=x.dtype, device=dev) if two else None
    s = torch.empty(residual.shape, dtype=residual.dtype, device=dev)
    if N:
        if x2 is None:
            X, A, M, amdt = residual, x, None, residual.dtype
        elif branches_first:
            X, A, M, amdt = residual, x, x2, torch.promote_types(x.dtype, x2.dtype)
        else:
            X, A, M, amdt = x2, residual, x, residual.dtype
        _forward(kind, X, A, M, None, (weight, bias, weight2 if two else None, bias2 if two else None), eps,
                 weight_offset, cast_before_weight, amdt, x.dtype, y, y2, s, stats, N, D)
    return y, y2, s, stats


def parallel_backward(dy, dy2, dres, s, stats, weight, bias, weight2, bias2, kind, D, weight_offset, output_mask):
    dy, dy2, dres, s, weight, bias, weight2, bias2 = resolved(dy, dy2, dres, s, weight, bias, weight2, bias2)
    N = s.numel() // D
    dev = s.device
    ps = (weight, bias, weight2, bias2)
    want = [p is not None and bool(mk) and d is not None
            for p, mk, d in zip(ps, output_mask, (dy, dy, dy2, dy2), strict=True)]
    ds = torch.empty(s.shape, dtype=s.dtype, device=dev)
    sums = [None] * 4
    if N:
        rows, block, warps = _config(N, D, backward_rows(), backward_tile())
        programs = program_count(-(-N // rows), s)
        per_program = -(-N // programs)
        programs = -(-N // per_program)
        partials = torch.zeros(4, programs, D, dtype=torch.float32, device=dev)
        w1, w2 = _p(weight, D), _p(weight2, D)
        sr = as_rows(s, D)
        dyr, dy2r, dresr = (None if t is None else as_rows(t, D) for t in (dy, dy2, dres))
        pick = lambda t: sr if t is None else t  # noqa: E731
        layer = kind == "layer"
        with on_device(s):
            _k().fused_bwd[(programs,)](
                pick(dyr), pick(dy2r), pick(dresr), sr, stats[0] if layer else stats[-1], stats[-1], pick(w1),
                pick(w2), ds.view(N, D), partials, *(0 if t is None else t.stride(0) for t in (dyr, dy2r, dresr)),
                sr.stride(0), D, N, D, per_program, float(weight_offset), IS_LAYER=layer, HAS_DY=dyr is not None,
                HAS_DY2=dy2r is not None, HAS_DRES=dresr is not None, HAS_W1=w1 is not None, HAS_W2=w2 is not None,
                WANT_DW1=want[0], WANT_DB1=want[1], WANT_DW2=want[2], WANT_DB2=want[3], ROWS=rows, BLOCK=block,
                RNE=availability().interpreted, num_warps=warps, **OPTIONS)
        sums = [sum_partials(partials[k], D) if want[k] else None for k in range(4)]
    out = []
    for g, p, mk in zip(sums, ps, output_mask, strict=True):
        if p is None or not mk:
            out.append(None)
        elif g is None:
            out.append(torch.zeros_like(p))
        else:
            out.append(g.to(p.dtype).view(p.shape))
    return (ds, *out)
