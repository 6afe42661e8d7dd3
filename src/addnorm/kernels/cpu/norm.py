"""Host wrappers for Add & Norm's CPU kernels, the CPU implementation of its operators, and the C-call helpers
every family's host code shares (``ptr``, ``params``, ``check_rc``, ``DTYPE``, ``empty_rows_like``, ...).

Layout: host ``forward``/``backward`` (tensors in, tensors out, one C call each) -> ``add_norm`` /
``add_norm_backward`` (allocate the outputs; registered by ``addnorm.ops`` as the operators' CPU
kernels, and called directly by its eager fast path). Inputs are viewed as
(rows, D) with unit stride along D; a layout that cannot be (e.g. a transposed last dim) is
copied first, never read wrongly. What backward needs: the residual sum (or the input of a
plain norm) and per-row mean / rstd in float32; xhat is recomputed.
"""

from __future__ import annotations

import torch

from ..rows import as_rows  # noqa: F401  (callers view their inputs as rows through here)
from ..rows import resolved
from . import output_pool
from .library import DTYPE_CODES, KIND_CODES, availability, library

POOL_MIN_NUMEL = output_pool.MIN_BYTES // 4  # the pool itself checks the bytes

SUPPORTED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
DTYPE = {torch.float32: DTYPE_CODES["float32"], torch.bfloat16: DTYPE_CODES["bfloat16"],
          torch.float16: DTYPE_CODES["float16"]}
PARAM_DTYPE = {code: dt for dt, code in DTYPE.items()}


def empty_rows_like(t: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """An uninitialised contiguous tensor of t's shape (and dtype, unless given). Large ones come from
    the output pool (``output_pool``: memory already faulted in); small ones from ``empty_like``, which
    parses fastest."""
    if t.numel() >= POOL_MIN_NUMEL:  # one int compare on the small-call path
        return output_pool.empty(t.shape, dtype or t.dtype)
    if dtype is not None and dtype != t.dtype:
        return torch.empty(t.shape, device="cpu", dtype=dtype)
    return torch.empty_like(t) if t.is_contiguous() else torch.empty_like(t, memory_format=torch.contiguous_format)


num_threads = torch.get_num_threads


def ptr(t: torch.Tensor | None) -> int | None:
    """The data pointer of an optional tensor. A tensor with elements whose storage was freed has a null
    pointer, which the kernels would take for an absent residual or parameter: refused here."""
    if t is None:
        return None
    p = t.data_ptr()
    if not p and t.numel():
        raise ValueError("addnorm CPU kernels: a tensor with elements has no storage (was its storage freed, "
                         "e.g. by untyped_storage().resize_(0)?)")
    return p


def stats_ptrs(stats: torch.Tensor | None, kind: str, N: int) -> tuple[int | None, int | None]:
    """(mean, rstd) pointers into the stats tensor: rows (mean, rstd) for LayerNorm, (rstd,) for RMSNorm."""
    if stats is None:
        return None, None
    p = ptr(stats)  # a freed stats tensor (a saved tensor the user freed) is named, not read at address 4 N
    if kind == "layer":
        return p, (p + 4 * N if p else p)
    return None, p


def params(weight: torch.Tensor | None, bias: torch.Tensor | None, D: int):
    """(weight, bias, dtype code) as the kernels read them: contiguous, one dtype of float32/bfloat16/float16.

    Parameters already like that are passed as they are (the kernels convert 16-bit ones to float32
    rows themselves, and write their gradients in the same dtype); anything else -- float64, mixed
    dtypes, strided -- is copied to float32 here.
    """
    if weight is not None:
        dt = weight.dtype
        if dt in DTYPE and weight.is_contiguous() and (bias is None or (bias.dtype == dt and bias.is_contiguous())):
            return weight, bias, DTYPE[dt]
    elif bias is None:
        return None, None, 0
    elif bias.dtype in DTYPE and bias.is_contiguous():
        return None, bias, DTYPE[bias.dtype]
    f32 = [None if p is None else p.detach().reshape(D).to(torch.float32).contiguous() for p in (weight, bias)]
    return f32[0], f32[1], DTYPE[torch.float32]


def _rs(t: torch.Tensor | None, D: int) -> int:
    """Row stride in elements of a contiguous tensor or of an (N, D) view made by ``as_rows``."""
    return 0 if t is None else D if t.is_contiguous() else t.stride(0)


def check_rc(rc: int, what: str) -> None:
    if rc == -2:
        raise ValueError(f"addnorm CPU {what}: a tensor with elements has no storage (was its storage freed, "
                         "e.g. by untyped_storage().resize_(0)?)")
    if rc != 0:
        raise MemoryError(f"addnorm CPU {what} kernel could not allocate its scratch rows")


def forward(kind, x, r, weight, bias, eps, weight_offset, cast_before_weight, out, res_out, stats, N, D,
            contiguous=False):
    """One pass over N rows of D; returns the parameters as the kernel read them (see ``params``).

    Every tensor is either contiguous (any shape) or an (N, D) view from ``as_rows``; ``res_out`` and
    ``stats`` may be None. ``stats`` is float32: (2, N) = (mean, rstd) for LayerNorm, (1, N) = (rstd,)
    for RMSNorm. Each tensor has its own dtype: the residual (and the sum written to ``res_out``) may be
    float32 beside 16-bit x and out. ``contiguous=True`` says every tensor is (row strides are D).
    """
    x, r, weight, bias = resolved(x, r, weight, bias)
    p = params(weight, bias, D)
    if contiguous:
        xs = rs = os_ = ros = D
    else:
        xs, rs, os_, ros = _rs(x, D), _rs(r, D), _rs(out, D), _rs(res_out, D)
    mean, rstd = stats_ptrs(stats, kind, N)
    dt = x.dtype
    xdt = DTYPE[dt]  # the other tensors' dtype codes looked up only where they differ (every lookup counts)
    rdt = xdt if r is None or r.dtype is dt else DTYPE[r.dtype]
    odt = xdt if out.dtype is dt else DTYPE[out.dtype]
    sdt = xdt if res_out is None or res_out.dtype is dt else DTYPE[res_out.dtype]
    rc = library().forward(
        KIND_CODES[kind], xdt, rdt, odt, sdt, N, D, x.data_ptr(), xs, ptr(r), rs, ptr(p[0]), ptr(p[1]), p[2],
        weight_offset, eps, cast_before_weight, out.data_ptr(), os_, ptr(res_out), ros, mean, rstd, num_threads())
    if rc:
        check_rc(rc, "forward")
    return p


def backward(kind, dy, s, stats, weight, pcode, weight_offset, dres, dx, want_dweight: bool, want_dbias: bool, N, D,
             contiguous=False, dx2=None):
    """One pass, writing dx (in s's dtype) and, if given, dx2 (its own dtype); returns (dweight or None,
    dbias or None) in the dtype of ``pcode``. Tensors as in ``forward``; ``weight`` and ``pcode`` as
    ``params`` returned them.
    """
    dy, s, weight, dres = resolved(dy, s, weight, dres)
    if stats is not None and not stats.is_contiguous():  # a saved tensor an unpack hook handed back in another layout
        stats = stats.contiguous()
    if not s.is_contiguous():
        s = s.contiguous() if contiguous else as_rows(s, D)
    pdt = PARAM_DTYPE[pcode]
    dw = torch.empty(D, device="cpu", dtype=pdt) if want_dweight else None  # (D,) ints parse faster than a shape tuple
    db = torch.empty(D, device="cpu", dtype=pdt) if want_dbias else None
    if contiguous:
        dys = ss = drs = dxs = D
    else:
        dys, ss, drs, dxs = _rs(dy, D), _rs(s, D), _rs(dres, D), _rs(dx, D)
    mean, rstd = stats_ptrs(stats, kind, N)
    sdt = DTYPE[s.dtype]
    rc = library().backward(
        KIND_CODES[kind], DTYPE[dy.dtype], sdt, sdt if dx2 is None else DTYPE[dx2.dtype], N, D, dy.data_ptr(), dys,
        s.data_ptr(), ss, mean, rstd, ptr(weight), pcode, weight_offset, ptr(dres), drs, dx.data_ptr(), dxs,
        ptr(dx2), _rs(dx2, D), ptr(dw), ptr(db), num_threads())
    if rc:
        check_rc(rc, "backward")
    return dw, db


def spec(param: torch.Tensor | None, as_read: torch.Tensor | None):
    """How to turn the kernel's (D,) gradient into the parameter's: False (no parameter), None (it
    already is: the kernel read the parameter itself), or the parameter's (shape, dtype)."""
    if param is None:
        return False
    return None if as_read is param and param.dim() == 1 else (param.shape, param.dtype)


def like(g: torch.Tensor | None, spec):
    """A parameter gradient in the parameter's own shape and dtype."""
    return g if g is None or spec is None else g.view(spec[0]).to(spec[1])


# ---------------------------------------------------------------- the operators' CPU implementation
# Tensors in, tensors out, as ``addnorm.ops`` registers them (and as its eager fast path calls them
# directly): (y, s, stats) forward, (ds, dx, dweight, dbias) backward; an output that does not exist
# is an empty tensor (an operator returns no None and no alias of an input).


def applies(x: torch.Tensor, residual, out_dtype, D: int) -> bool:
    """Whether the kernels take these dtypes (else the operator computes with torch ops)."""
    return (x.dtype in DTYPE and (residual is None or residual.dtype in DTYPE)
            and (out_dtype is None or out_dtype in DTYPE) and D > 0 and availability().available)


def add_norm(x, residual, weight, bias, kind, D, eps, weight_offset, cast_before_weight, out_dtype, sum_dtype,
             want_stats=True):
    """Forward: y (x's shape, out_dtype), s (x's shape, sum_dtype; None when sum_dtype is None), stats
    (float32; None unless wanted: inference needs none)."""
    N = x.numel() // D
    stats = torch.empty(2 if kind == "layer" else 1, N, device="cpu", dtype=torch.float32) if want_stats else None
    out = empty_rows_like(x, out_dtype)
    s = None if sum_dtype is None else empty_rows_like(x, sum_dtype)
    contiguous = x.is_contiguous() and (residual is None or residual.is_contiguous())
    if not contiguous:
        x, residual = as_rows(x, D), None if residual is None else as_rows(residual, D)
    forward(kind, x, residual, weight, bias, eps, weight_offset, cast_before_weight, out, s, stats, N, D, contiguous)
    return out, s, stats


def add_norm_backward(dy, dres, s, stats, weight, bias, kind, D, weight_offset, x_dtype, want_w, want_b):
    """Backward: ds in s's dtype, dx in x_dtype when that differs (else None), dweight, dbias (or None)."""
    N = s.numel() // D
    w, b, pcode = params(weight, bias, D)  # as the forward read them
    ds = empty_rows_like(s)
    dx = None if x_dtype == s.dtype else empty_rows_like(s, x_dtype)
    contiguous = dy.is_contiguous() and (dres is None or dres.is_contiguous()) and s.is_contiguous()
    if not contiguous:
        dy, s, dres = as_rows(dy, D), as_rows(s, D), None if dres is None else as_rows(dres, D)
    dw, db = backward(kind, dy, s, stats, w, pcode, weight_offset, dres, ds, want_w and weight is not None,
                      want_b and bias is not None, N, D, contiguous, dx)
    return ds, dx, like(dw, spec(weight, w)), like(db, spec(bias, b))
