"""The fused forms' operators: schemas, fake implementations, and their device implementations.

    addnorm::norm_add(x, residual, weight?, bias?, kind, ndim, eps, weight_offset, cast_before_weight)
        -> (out, stats)                      out = residual + Norm(x), in promote(x, residual)
    addnorm::parallel_add_norm(x, x2?, residual, weight?, bias?, weight2?, bias2?, kind, ndim, eps,
                               weight_offset, cast_before_weight, two, branches_first)
        -> (y, y2, s, stats)                 s = residual + x + x2 (see ``formulas``); y2 empty unless two
    addnorm::parallel_add_norm_backward(dy?, dy2?, dres?, s, stats, weight?, bias?, weight2?, bias2?, kind, ndim,
                                        eps, weight_offset, output_mask[4])
        -> (ds, dweight, dbias, dweight2, dbias2)     absent ones empty

Norm-then-add's backward is ``addnorm::add_norm_backward`` on x. Implementations as ``schema``'s: the C
kernels on CPU, Triton on CUDA, the formulas elsewhere (and where the kernels do not take the dtypes);
opaque to torch.compile. Autograd is registered by ``autograd``.
"""

from __future__ import annotations

import math

import torch

from ...kernels.cpu import fused as _cpu
from ...kernels.triton import fused as _triton
from ..last import declined
from ..norm.schema import LIB, empty_if_none, row_size
from . import formulas as fused_formulas

LIB.define(
    "norm_add(Tensor x, Tensor residual, Tensor? weight, Tensor? bias, str kind, int ndim, float eps, "
    "float weight_offset, bool cast_before_weight) -> (Tensor, Tensor)"
)
LIB.define(
    "parallel_add_norm(Tensor x, Tensor? x2, Tensor residual, Tensor? weight, Tensor? bias, Tensor? weight2, "
    "Tensor? bias2, str kind, int ndim, float eps, float weight_offset, bool cast_before_weight, bool two, "
    "bool branches_first) -> (Tensor, Tensor, Tensor, Tensor)"
)
LIB.define(
    "parallel_add_norm_backward(Tensor? dy, Tensor? dy2, Tensor? dres, Tensor s, Tensor stats, Tensor? weight, "
    "Tensor? bias, Tensor? weight2, Tensor? bias2, str kind, int ndim, float eps, float weight_offset, "
    "bool[4] output_mask) -> (Tensor, Tensor, Tensor, Tensor, Tensor)"
)


def _stats_shape(kind, x, ndim):
    return (2 if kind == "layer" else 1, math.prod(x.shape[:x.dim() - ndim]))


def _stats_dtype(*ts):
    return torch.float64 if any(t is not None and t.dtype == torch.float64 for t in ts) else torch.float32


# ---------------------------------------------------------------- norm-then-add


def _norm_add_formulas(x, residual, weight, bias, kind, ndim, eps, weight_offset, cast_before_weight):
    out, stats = fused_formulas.norm_add(x, residual, weight, bias, kind, ndim, eps, weight_offset,
                                         cast_before_weight)
    return out.contiguous(), stats.contiguous()


def _norm_add_on(kernels):
    def impl(x, residual, weight, bias, kind, ndim, eps, weight_offset, cast_before_weight):
        D = row_size(x, ndim)
        if not kernels.applies(x, residual, weight, bias, D=D):
            declined()
            return _norm_add_formulas(x, residual, weight, bias, kind, ndim, eps, weight_offset, cast_before_weight)
        return kernels.norm_add(x, residual, weight, bias, kind, D, eps, weight_offset, cast_before_weight,
                                fused_formulas.norm_add_dtype(x, residual))

    return impl


norm_add_cpu = _norm_add_on(_cpu)
norm_add_triton = _norm_add_on(_triton)


@torch.library.register_fake("addnorm::norm_add", lib=LIB)
def _norm_add_fake(x, residual, weight, bias, kind, ndim, eps, weight_offset, cast_before_weight):
    out = x.new_empty(x.shape, dtype=fused_formulas.norm_add_dtype(x, residual))
    return out, x.new_empty(_stats_shape(kind, x, ndim), dtype=_stats_dtype(x))


LIB.impl("norm_add", norm_add_cpu, "CPU")
LIB.impl("norm_add", norm_add_triton, "CUDA")
LIB.impl("norm_add", _norm_add_formulas, "CompositeExplicitAutograd")


# ---------------------------------------------------------------- parallel residual


def _parallel_formulas(x, x2, residual, weight, bias, weight2, bias2, kind, ndim, eps, weight_offset,
                       cast_before_weight, two, branches_first):
    y, y2, s, stats = fused_formulas.parallel_add_norm(x, x2, residual, weight, bias, weight2, bias2, kind, ndim, eps,
                                                       weight_offset, cast_before_weight, two, branches_first)
    return y.contiguous(), empty_if_none(None if y2 is None else y2.contiguous(), x), s.contiguous(), stats.contiguous()


def _parallel_on(kernels):
    def impl(x, x2, residual, weight, bias, weight2, bias2, kind, ndim, eps, weight_offset, cast_before_weight, two,
             branches_first):
        D = row_size(x, ndim)
        if not kernels.applies(x, x2, residual, weight, bias, weight2, bias2, D=D):
            declined()
            return _parallel_formulas(x, x2, residual, weight, bias, weight2, bias2, kind, ndim, eps, weight_offset,
                                      cast_before_weight, two, branches_first)
        y, y2, s, stats = kernels.parallel_add_norm(x, x2, residual, weight, bias, weight2, bias2, kind, D, eps,
                                                    weight_offset, cast_before_weight, two, branches_first)
        return y, empty_if_none(y2, x), s, stats

    return impl


parallel_cpu = _parallel_on(_cpu)
parallel_triton = _parallel_on(_triton)


@torch.library.register_fake("addnorm::parallel_add_norm", lib=LIB)
def _parallel_fake(x, x2, residual, weight, bias, weight2, bias2, kind, ndim, eps, weight_offset,
                   cast_before_weight, two, branches_first):
    y = x.new_empty(x.shape)
    y2 = x.new_empty(x.shape) if two else x.new_empty((0,))
    s = residual.new_empty(residual.shape)
    return y, y2, s, x.new_empty(_stats_shape(kind, x, ndim), dtype=_stats_dtype(residual))


LIB.impl("parallel_add_norm", parallel_cpu, "CPU")
LIB.impl("parallel_add_norm", parallel_triton, "CUDA")
LIB.impl("parallel_add_norm", _parallel_formulas, "CompositeExplicitAutograd")


def _parallel_backward_formulas(dy, dy2, dres, s, stats, weight, bias, weight2, bias2, kind, ndim, eps,
                                weight_offset, output_mask):
    ds, *grads = fused_formulas.parallel_backward(dy, dy2, dres, s, weight, bias, weight2, bias2, kind, ndim, eps,
                                                  weight_offset, output_mask)
    return (ds.contiguous(), *(empty_if_none(g, s) for g in grads))


def _parallel_backward_on(kernels):
    def impl(dy, dy2, dres, s, stats, weight, bias, weight2, bias2, kind, ndim, eps, weight_offset, output_mask):
        D = row_size(s, ndim)
        if ((dy is None and dy2 is None) or stats.dtype != torch.float32
                or not kernels.applies(dy, dy2, dres, s, weight, bias, weight2, bias2, D=D)):
            return _parallel_backward_formulas(dy, dy2, dres, s, stats, weight, bias, weight2, bias2, kind, ndim, eps,
                                               weight_offset, output_mask)
        ds, *grads = kernels.parallel_backward(dy, dy2, dres, s, stats, weight, bias, weight2, bias2, kind, D,
                                               weight_offset, output_mask)
        return (ds, *(empty_if_none(g, s) for g in grads))

    return impl


parallel_backward_cpu = _parallel_backward_on(_cpu)
parallel_backward_triton = _parallel_backward_on(_triton)


@torch.library.register_fake("addnorm::parallel_add_norm_backward", lib=LIB)
def _parallel_backward_fake(dy, dy2, dres, s, stats, weight, bias, weight2, bias2, kind, ndim, eps, weight_offset,
                            output_mask):
    grads = [p.new_empty(p.shape) if p is not None and m else s.new_empty((0,))
             for p, m in zip((weight, bias, weight2, bias2), output_mask, strict=True)]
    return (s.new_empty(s.shape), *grads)


LIB.impl("parallel_add_norm_backward", parallel_backward_cpu, "CPU")
LIB.impl("parallel_add_norm_backward", parallel_backward_triton, "CUDA")
LIB.impl("parallel_add_norm_backward", _parallel_backward_formulas, "CompositeExplicitAutograd")
