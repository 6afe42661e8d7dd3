"""addnorm's PyTorch operators: their schemas, fake (meta) implementations and device implementations.

    addnorm::add_norm(x, residual?, weight?, bias?, kind, ndim, eps, weight_offset, cast_before_weight,
                      out_dtype?, residual_in_fp32) -> (y, s, stats)
    addnorm::add_norm_backward(dy, dres?, s, stats, weight?, bias?, kind, ndim, eps, weight_offset,
                               x_dtype, output_mask) -> (ds, dx, dweight, dbias)

``kind`` is "layer" or "rms"; the last ``ndim`` dims are normalized. ``y`` has x's shape in ``out_dtype``
(default x's dtype); ``s`` is the new residual stream in its dtype (see ``formulas.sum_dtype``), or an
empty tensor when the stream is x itself (no residual and nothing to widen: an operator may not return
an alias of its input); ``stats`` is (2, N) = (mean, rstd) for LayerNorm or (1, N) = (rstd,) for RMSNorm,
float32 (float64 for float64 tensors). Backward returns ``ds`` in the stream's dtype, ``dx`` in
``x_dtype`` when that differs (else empty), and the parameter gradients asked for by ``output_mask``
(else empty). Every output is contiguous.

Implementations: CPU -- the C kernels where they take the dtypes, else the torch-op formulas; CUDA --
the Triton kernels (``kernels.triton``, the optional extra ``addnorm[gpu]``) where Triton is installed
and they take the dtypes, else the formulas; every other device -- the formulas; Meta/fake -- shapes and
strides only. The Triton implementation also runs on CPU tensors under Triton's interpreter, called
directly (``backend="triton"``), never through the CPU key. Autograd is registered by
``addnorm.ops.norm.autograd``. To torch.compile every implementation is opaque: the operator is one node.
"""

from __future__ import annotations

import math

import torch

from ...kernels.cpu import norm as _cpu
from ...kernels.triton import norm as _triton
from . import formulas
from ..last import declined

LIB = torch.library.Library("addnorm", "DEF")
LIB.define(
    "add_norm(Tensor x, Tensor? residual, Tensor? weight, Tensor? bias, str kind, int ndim, float eps, "
    "float weight_offset, bool cast_before_weight, ScalarType? out_dtype, bool residual_in_fp32) "
    "-> (Tensor, Tensor, Tensor)"
)
LIB.define(
    "add_norm_backward(Tensor dy, Tensor? dres, Tensor s, Tensor stats, Tensor? weight, Tensor? bias, str kind, "
    "int ndim, float eps, float weight_offset, ScalarType x_dtype, bool[3] output_mask) "
    "-> (Tensor, Tensor, Tensor, Tensor)"
)


def row_size(x: torch.Tensor, ndim: int) -> int:
    """D: the number of elements in the last ndim dims, the rows the kernels normalize."""
    return math.prod(x.shape[x.dim() - ndim:])


def empty_if_none(t: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return like.new_empty((0,)) if t is None else t


# ---------------------------------------------------------------- forward


def _forward_formulas(x, residual, weight, bias, kind, ndim, eps, weight_offset, cast_before_weight, out_dtype,
                      residual_in_fp32):
    y, s, stats = formulas.forward(x, residual, weight, bias, kind, ndim, eps, weight_offset, cast_before_weight,
                                   out_dtype, residual_in_fp32)
    s = s.contiguous() if formulas.returns_sum(x, residual, residual_in_fp32) else x.new_empty((0,))
    return y.contiguous(), s, stats.contiguous()


def _forward_on(kernels):
    """The forward implementation on a kernel family (``kernels.cpu.norm`` or ``kernels.triton.norm``): its
    kernels where they take the call, else the formulas."""

    def forward(x, residual, weight, bias, kind, ndim, eps, weight_offset, cast_before_weight, out_dtype,
                residual_in_fp32):
        D = row_size(x, ndim)
        if not kernels.applies(x, residual, out_dtype, D):
            declined()
            return _forward_formulas(x, residual, weight, bias, kind, ndim, eps, weight_offset, cast_before_weight,
                                     out_dtype, residual_in_fp32)
        sdt = formulas.sum_dtype(x, residual, residual_in_fp32) if formulas.returns_sum(x, residual,
                                                                                        residual_in_fp32) else None
        y, s, stats = kernels.add_norm(x, residual, weight, bias, kind, D, eps, weight_offset, cast_before_weight,
                                       out_dtype, sdt)
        return y, empty_if_none(s, x), stats

    return forward


forward_cpu = _forward_on(_cpu)
forward_triton = _forward_on(_triton)


@torch.library.register_fake("addnorm::add_norm", lib=LIB)
def _forward_fake(x, residual, weight, bias, kind, ndim, eps, weight_offset, cast_before_weight, out_dtype,
                  residual_in_fp32):
    n = x.dim() - ndim
    y = x.new_empty(x.shape, dtype=out_dtype or x.dtype)
    if formulas.returns_sum(x, residual, residual_in_fp32):
        s = x.new_empty(x.shape, dtype=formulas.sum_dtype(x, residual, residual_in_fp32))
    else:
        s = x.new_empty((0,))
    rows = math.prod(x.shape[:n])
    stats = x.new_empty((2 if kind == "layer" else 1, rows), dtype=formulas.compute_dtype(x, residual))
    return y, s, stats


LIB.impl("add_norm", forward_cpu, "CPU")
LIB.impl("add_norm", forward_triton, "CUDA")
LIB.impl("add_norm", _forward_formulas, "CompositeExplicitAutograd")


# ---------------------------------------------------------------- backward


def _backward_formulas(dy, dres, s, stats, weight, bias, kind, ndim, eps, weight_offset, x_dtype, output_mask):
    ds, dx, dw, db = formulas.backward(dy, dres, s, weight, bias, kind, ndim, eps, weight_offset, x_dtype,
                                       output_mask)
    return ds.contiguous(), empty_if_none(dx, s), empty_if_none(dw, s), empty_if_none(db, s)


def _backward_on(kernels):
    """The backward implementation on a kernel family, as ``_forward_on``."""

    def backward(dy, dres, s, stats, weight, bias, kind, ndim, eps, weight_offset, x_dtype, output_mask):
        D = row_size(s, ndim)
        if not (kernels.applies(s, dy, None, D) and stats.dtype == torch.float32):
            return _backward_formulas(dy, dres, s, stats, weight, bias, kind, ndim, eps, weight_offset, x_dtype,
                                      output_mask)
        if dres is not None and dres.dtype != s.dtype:
            dres = dres.to(s.dtype)
        ds, dx, dw, db = kernels.add_norm_backward(dy, dres, s, stats, weight, bias, kind, D, weight_offset, x_dtype,
                                                   output_mask[1], output_mask[2])
        return ds, empty_if_none(dx, s), empty_if_none(dw, s), empty_if_none(db, s)

    return backward


backward_cpu = _backward_on(_cpu)
backward_triton = _backward_on(_triton)


@torch.library.register_fake("addnorm::add_norm_backward", lib=LIB)
def _backward_fake(dy, dres, s, stats, weight, bias, kind, ndim, eps, weight_offset, x_dtype, output_mask):
    ds = s.new_empty(s.shape)
    dx = s.new_empty(s.shape, dtype=x_dtype) if x_dtype != s.dtype else s.new_empty((0,))
    dw = weight.new_empty(weight.shape) if weight is not None and output_mask[1] else s.new_empty((0,))
    db = bias.new_empty(bias.shape) if bias is not None and output_mask[2] else s.new_empty((0,))
    return ds, dx, dw, db


LIB.impl("add_norm_backward", backward_cpu, "CPU")
LIB.impl("add_norm_backward", backward_triton, "CUDA")
LIB.impl("add_norm_backward", _backward_formulas, "CompositeExplicitAutograd")
