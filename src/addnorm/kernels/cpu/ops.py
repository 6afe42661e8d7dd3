"""Host wrappers and the autograd.Function for the fused CPU kernels.

Layout: host ``forward``/``backward`` (tensors in, tensors out, one C call each) ->
``FusedAddNorm`` (autograd) -> called by ``addnorm.functional``. Inputs are viewed as
(rows, D) with unit stride along D; a layout that cannot be (e.g. a transposed last dim) is
copied first, never read wrongly. What backward needs: the residual sum (or the input of a
plain norm) and per-row mean / rstd in float32; xhat is recomputed.
"""

from __future__ import annotations

import math

import torch
from torch.autograd.function import once_differentiable

from .library import DTYPE_CODES, KIND_CODES, library

SUPPORTED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_DTYPE = {torch.float32: DTYPE_CODES["float32"], torch.bfloat16: DTYPE_CODES["bfloat16"],
          torch.float16: DTYPE_CODES["float16"]}


def as_rows(t: torch.Tensor, D: int) -> torch.Tensor:
    """(…, *normalized_shape) -> (N, D) with unit stride on D; copies only when it must."""
    if t.is_contiguous():
        return t.view(-1, D)
    t2 = t.reshape(-1, D)
    if D > 1 and t2.stride(1) != 1:
        t2 = t2.contiguous()
    return t2


def _ptr(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


def _stats_ptrs(stats: torch.Tensor | None, kind: str, N: int) -> tuple[int | None, int | None]:
    """(mean, rstd) pointers into the stats tensor: rows (mean, rstd) for LayerNorm, (rstd,) for RMSNorm."""
    if stats is None:
        return None, None
    if kind == "layer":
        return stats.data_ptr(), stats.data_ptr() + 4 * N
    return None, stats.data_ptr()


def _param(p: torch.Tensor | None, D: int) -> torch.Tensor | None:
    if p is None:
        return None
    if p.dtype == torch.float32 and p.is_contiguous():
        return p  # only its data pointer is used
    return p.detach().reshape(D).to(torch.float32).contiguous()


def forward(kind, x2, r2, weight, bias, eps, weight_offset, cast_before_weight, out2=None, res_out2=None, want_stats=True):
    """One pass over (N, D) rows: returns (out2, residual_out2 or None, stats or None, weight as float32).

    ``stats`` is one float32 tensor: (2, N) = (mean, rstd) for LayerNorm, (1, N) = (rstd,) for RMSNorm.
    """
    N, D = x2.shape
    w32, b32 = _param(weight, D), _param(bias, D)
    if out2 is None:
        out2 = torch.empty((N, D), dtype=x2.dtype)
    if r2 is not None and res_out2 is None:
        res_out2 = torch.empty((N, D), dtype=x2.dtype)
    stats = torch.empty((2 if kind == "layer" else 1, N), dtype=torch.float32) if want_stats else None
    rc = library().forward(
        KIND_CODES[kind], _DTYPE[x2.dtype], N, D,
        x2.data_ptr(), x2.stride(0), _ptr(r2), 0 if r2 is None else r2.stride(0),
        _ptr(w32), _ptr(b32), weight_offset, eps, cast_before_weight,
        out2.data_ptr(), out2.stride(0), _ptr(res_out2), 0 if res_out2 is None else res_out2.stride(0),
        *_stats_ptrs(stats, kind, N), torch.get_num_threads(),
    )
    if rc != 0:
        raise MemoryError("addnorm CPU forward kernel could not allocate its scratch rows")
    return out2, res_out2, stats, w32


def forward_contiguous(kind, x, r, weight, bias, eps, weight_offset, cast_before_weight, out, res_out, N, D):
    """The inference fast path: contiguous x/r/out/res_out of N rows x D, no statistics."""
    w32, b32 = _param(weight, D), _param(bias, D)
    rc = library().forward(
        KIND_CODES[kind], _DTYPE[x.dtype], N, D, x.data_ptr(), D, _ptr(r), D, _ptr(w32), _ptr(b32), weight_offset, eps,
        cast_before_weight, out.data_ptr(), D, _ptr(res_out), D, None, None, torch.get_num_threads())
    if rc != 0:
        raise MemoryError("addnorm CPU forward kernel could not allocate its scratch rows")


def backward(kind, dy2, s2, stats, w32, weight_offset, dres2, want_dweight: bool, want_dbias: bool, dx2=None):
    """One pass: returns (dx2, dweight32 or None, dbias32 or None). ``stats`` as returned by forward."""
    N, D = s2.shape
    if dx2 is None:
        dx2 = torch.empty((N, D), dtype=s2.dtype)
    dw = torch.empty(D, dtype=torch.float32) if want_dweight else None
    db = torch.empty(D, dtype=torch.float32) if want_dbias else None
    rc = library().backward(
        KIND_CODES[kind], _DTYPE[s2.dtype], N, D,
        dy2.data_ptr(), dy2.stride(0), s2.data_ptr(), s2.stride(0), *_stats_ptrs(stats, kind, N),
        _ptr(w32), float(weight_offset),
        _ptr(dres2), 0 if dres2 is None else dres2.stride(0), dx2.data_ptr(), dx2.stride(0),
        _ptr(dw), _ptr(db), torch.get_num_threads(),
    )
    if rc != 0:
        raise MemoryError("addnorm CPU backward kernel could not allocate its partial sums")
    return dx2, dw, db


class FusedAddNorm(torch.autograd.Function):
    """(x, residual) -> (norm(x + residual), x + residual) in one pass, and back in one pass.

    residual may be None (a plain norm; the second output is then None). Gradients of x and
    residual are the same tensor values: d(x + r)/dx = d(x + r)/dr = 1.
    """

    @staticmethod
    def forward(ctx, x, residual, weight, bias, kind, normalized_shape, eps, weight_offset, cast_before_weight):
        ctx.set_materialize_grads(False)  # an unused output's gradient stays None, not a tensor of zeros
        D = math.prod(normalized_shape)
        shape = x.shape
        x2 = as_rows(x, D)
        r2 = None if residual is None else as_rows(residual, D)
        out2, s2, stats, w32 = forward(kind, x2, r2, weight, bias, eps, weight_offset, cast_before_weight)
        ctx.save_for_backward(x2 if s2 is None else s2, stats, w32)
        ctx.meta = (kind, shape, D, weight_offset, None if weight is None else (weight.shape, weight.dtype),
                    None if bias is None else (bias.shape, bias.dtype), residual is not None)
        out = out2.view(shape)
        if s2 is None:
            return out, None
        return out, s2.view(shape)

    @staticmethod
    @once_differentiable
    def backward(ctx, dout, dres):
        kind, shape, D, weight_offset, wspec, bspec, has_res = ctx.meta
        s2, stats, w32 = ctx.saved_tensors
        dres2 = None if dres is None else as_rows(dres, D)
        want_w = wspec is not None and ctx.needs_input_grad[2]
        want_b = bspec is not None and ctx.needs_input_grad[3]
        if dout is None:  # only the residual sum was used downstream
            dx = dres if dres is not None else torch.zeros(shape, dtype=s2.dtype)
            dw = torch.zeros(D, dtype=torch.float32) if want_w else None
            db = torch.zeros(D, dtype=torch.float32) if want_b else None
        else:
            dx2, dw, db = backward(kind, as_rows(dout, D), s2, stats, w32, weight_offset, dres2, want_w, want_b)
            dx = dx2.view(shape)
        gw = None if dw is None else (dw if dw.shape == wspec[0] and wspec[1] == dw.dtype else dw.view(wspec[0]).to(wspec[1]))
        gb = None if db is None else (db if db.shape == bspec[0] and bspec[1] == db.dtype else db.view(bspec[0]).to(bspec[1]))
        return (dx, dx if has_res else None, gw, gb, None, None, None, None, None)
