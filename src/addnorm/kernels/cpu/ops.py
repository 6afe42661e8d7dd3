"""Host wrappers and the autograd.Function for the fused CPU kernels.

Layout: host ``forward``/``backward`` (tensors in, tensors out, one C call each) ->
``FusedAddNorm`` (autograd) -> called by ``addnorm.functional``. Inputs are viewed as
(rows, D) with unit stride along D; a layout that cannot be (e.g. a transposed last dim) is
copied first, never read wrongly. What backward needs: the residual sum (or the input of a
plain norm) and per-row mean / rstd in float32; xhat is recomputed.
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from .library import DTYPE_CODES, KIND_CODES, library

SUPPORTED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_DTYPE = {torch.float32: DTYPE_CODES["float32"], torch.bfloat16: DTYPE_CODES["bfloat16"],
          torch.float16: DTYPE_CODES["float16"]}
_PARAM_DTYPE = {code: dt for dt, code in _DTYPE.items()}


def as_rows(t: torch.Tensor, D: int) -> torch.Tensor:
    """(…, *normalized_shape) -> (N, D) with unit stride on D; copies only when it must."""
    if t.is_contiguous():
        return t.view(-1, D)
    t2 = t.reshape(-1, D)
    if D > 1 and t2.stride(1) != 1:
        t2 = t2.contiguous()
    return t2


def empty_rows_like(t: torch.Tensor) -> torch.Tensor:
    """An uninitialised contiguous tensor of t's shape and dtype (``empty_like`` parses fastest)."""
    return torch.empty_like(t) if t.is_contiguous() else torch.empty_like(t, memory_format=torch.contiguous_format)


def _ptr(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


def _stats_ptrs(stats: torch.Tensor | None, kind: str, N: int) -> tuple[int | None, int | None]:
    """(mean, rstd) pointers into the stats tensor: rows (mean, rstd) for LayerNorm, (rstd,) for RMSNorm."""
    if stats is None:
        return None, None
    if kind == "layer":
        return stats.data_ptr(), stats.data_ptr() + 4 * N
    return None, stats.data_ptr()


def params(weight: torch.Tensor | None, bias: torch.Tensor | None, D: int):
    """(weight, bias, dtype code) as the kernels read them: contiguous, one dtype of float32/bfloat16/float16.

    Parameters already like that are passed as they are (the kernels convert 16-bit ones to float32
    rows themselves, and write their gradients in the same dtype); anything else -- float64, mixed
    dtypes, strided -- is copied to float32 here.
    """
    if weight is not None:
        dt = weight.dtype
        if dt in _DTYPE and weight.is_contiguous() and (bias is None or (bias.dtype == dt and bias.is_contiguous())):
            return weight, bias, _DTYPE[dt]
    elif bias is None:
        return None, None, 0
    elif bias.dtype in _DTYPE and bias.is_contiguous():
        return None, bias, _DTYPE[bias.dtype]
    f32 = [None if p is None else p.detach().reshape(D).to(torch.float32).contiguous() for p in (weight, bias)]
    return f32[0], f32[1], _DTYPE[torch.float32]


def _rs(t: torch.Tensor | None, D: int) -> int:
    """Row stride in elements of a contiguous tensor or of an (N, D) view made by ``as_rows``."""
    return 0 if t is None else D if t.is_contiguous() else t.stride(0)


def forward(kind, x, r, weight, bias, eps, weight_offset, cast_before_weight, out, res_out, stats, N, D,
            contiguous=False):
    """One pass over N rows of D; returns the parameters as the kernel read them (see ``params``).

    Every tensor is either contiguous (any shape) or an (N, D) view from ``as_rows``; ``res_out`` and
    ``stats`` may be None. ``stats`` is float32: (2, N) = (mean, rstd) for LayerNorm, (1, N) = (rstd,)
    for RMSNorm. ``contiguous=True`` says every tensor is (their row strides are D, not looked up).
    """
    p = params(weight, bias, D)
    if contiguous:
        xs = rs = os_ = ros = D
    else:
        xs, rs, os_, ros = _rs(x, D), _rs(r, D), _rs(out, D), _rs(res_out, D)
    mean, rstd = _stats_ptrs(stats, kind, N)
    rc = library().forward(
        KIND_CODES[kind], _DTYPE[x.dtype], N, D, x.data_ptr(), xs, _ptr(r), rs, _ptr(p[0]), _ptr(p[1]), p[2],
        weight_offset, eps, cast_before_weight, out.data_ptr(), os_, _ptr(res_out), ros, mean, rstd,
        torch.get_num_threads())
    if rc != 0:
        raise MemoryError("addnorm CPU forward kernel could not allocate its scratch rows")
    return p


def backward(kind, dy, s, stats, weight, pcode, weight_offset, dres, dx, want_dweight: bool, want_dbias: bool, N, D,
             contiguous=False):
    """One pass, writing dx; returns (dweight or None, dbias or None) in the dtype of ``pcode``.

    Tensors as in ``forward``; ``weight`` and ``pcode`` as ``params`` returned them.
    """
    pdt = _PARAM_DTYPE[pcode]
    dw = torch.empty(D, dtype=pdt) if want_dweight else None  # (D,) ints parse faster than a shape tuple
    db = torch.empty(D, dtype=pdt) if want_dbias else None
    if contiguous:
        dys = ss = drs = dxs = D
    else:
        dys, ss, drs, dxs = _rs(dy, D), _rs(s, D), _rs(dres, D), _rs(dx, D)
    mean, rstd = _stats_ptrs(stats, kind, N)
    rc = library().backward(
        KIND_CODES[kind], _DTYPE[s.dtype], N, D, dy.data_ptr(), dys, s.data_ptr(), ss, mean, rstd, _ptr(weight),
        pcode, weight_offset, _ptr(dres), drs, dx.data_ptr(), dxs, _ptr(dw), _ptr(db), torch.get_num_threads())
    if rc != 0:
        raise MemoryError("addnorm CPU backward kernel could not allocate its partial sums")
    return dw, db


def _spec(param: torch.Tensor | None, as_read: torch.Tensor | None):
    """How to turn the kernel's (D,) gradient into the parameter's: False (no parameter), None (it
    already is: the kernel read the parameter itself), or the parameter's (shape, dtype)."""
    if param is None:
        return False
    return None if as_read is param and param.dim() == 1 else (param.shape, param.dtype)


def _like(g: torch.Tensor | None, spec):
    """A parameter gradient in the parameter's own shape and dtype."""
    return g if g is None or spec is None else g.view(spec[0]).to(spec[1])


class FusedAddNorm(torch.autograd.Function):
    """(x, residual) -> (norm(x + residual), x + residual) in one pass, and back in one pass.

    residual may be None (a plain norm; the second output is then None). Gradients of x and
    residual are the same tensor values: d(x + r)/dx = d(x + r)/dr = 1. Contiguous tensors (the
    common case) go to the kernels as they are, without views: at small sizes every Python-level
    tensor operation costs about as much as the kernel itself.
    """

    @staticmethod
    def forward(ctx, x, residual, weight, bias, kind, D, eps, weight_offset, cast_before_weight):
        ctx.set_materialize_grads(False)  # an unused output's gradient stays None, not a tensor of zeros
        N = x.numel() // D
        stats = torch.empty(2 if kind == "layer" else 1, N, dtype=torch.float32)
        out = empty_rows_like(x)
        s = None if residual is None else empty_rows_like(x)
        contiguous = x.is_contiguous() and (residual is None or residual.is_contiguous())
        if not contiguous:
            x, residual = as_rows(x, D), None if residual is None else as_rows(residual, D)
        p = forward(kind, x, residual, weight, bias, eps, weight_offset, cast_before_weight, out, s, stats, N, D,
                    contiguous)
        ctx.save_for_backward(x if s is None else s, stats, p[0])
        ctx.meta = (kind, out.shape, N, D, weight_offset, p[2], _spec(weight, p[0]), _spec(bias, p[1]),
                    residual is not None)
        return out, s

    @staticmethod
    def backward(ctx, dout, dres):
        if torch.is_grad_enabled():  # create_graph=True: the kernel's backward is not differentiable again
            return _backward_once(ctx, dout, dres)
        return _backward(ctx, dout, dres)


def _backward(ctx, dout, dres):
    kind, shape, N, D, weight_offset, pcode, wspec, bspec, has_res = ctx.meta
    s, stats, w = ctx.saved_tensors
    needs = ctx.needs_input_grad
    want_w = wspec is not False and needs[2]
    want_b = bspec is not False and needs[3]
    if dout is None:  # only the residual sum was used downstream
        dx = dres if dres is not None else torch.zeros(shape, dtype=s.dtype)
        dw = torch.zeros_like(w) if want_w else None  # w: the weight as the kernel read it
        db = torch.zeros(D, dtype=_PARAM_DTYPE[pcode]) if want_b else None
        return dx, dx if has_res else None, _like(dw, wspec), _like(db, bspec), None, None, None, None, None
    dx = empty_rows_like(dout)
    contiguous = dout.is_contiguous() and (dres is None or dres.is_contiguous()) and s.is_contiguous()
    if not contiguous:
        dout, dres = as_rows(dout, D), None if dres is None else as_rows(dres, D)
    dw, db = backward(kind, dout, s, stats, w, pcode, weight_offset, dres, dx, want_w, want_b, N, D, contiguous)
    return dx, dx if has_res else None, _like(dw, wspec), _like(db, bspec), None, None, None, None, None


# under create_graph=True: computed once, and a second differentiation raises PyTorch's own error
_backward_once = once_differentiable(_backward)


# FusedAddNorm.apply is a Python classmethod whose prologue -- functorch checks, unwrapping dead
# functorch wrappers over every argument -- costs ~2 us, 3 % of a whole 64 x 768 training step. Callers
# that have already sent functorch transforms to the torch backend use this instead: the C-level apply
# that the prologue ends in, with the unwrapping done directly on the four tensors.
try:
    _C_APPLY = torch._C._FunctionBase.__dict__["apply"].__get__(None, FusedAddNorm)
    _unwrap_if_dead = torch._C._functorch.unwrap_if_dead
except (AttributeError, KeyError):  # private entry points gone in some torch version: the public apply
    _C_APPLY = FusedAddNorm.apply
    _unwrap_if_dead = lambda t: t  # noqa: E731  (FusedAddNorm.apply unwraps them itself)


def apply_fused(x, residual, weight, bias, kind, D, eps, weight_offset, cast_before_weight):
    """``FusedAddNorm.apply(...)`` outside functorch transforms (the caller checks), without the prologue."""
    return _C_APPLY(_unwrap_if_dead(x), None if residual is None else _unwrap_if_dead(residual),
                    None if weight is None else _unwrap_if_dead(weight), None if bias is None else _unwrap_if_dead(bias),
                    kind, D, eps, weight_offset, cast_before_weight)

