"""DyT / Derf fused with the add, as operators.

    addnorm::add_pointwise_norm(x, residual?, alpha, shift?, weight?, bias?, kind) -> (y, s)
        s empty when there is no residual (the stream is x itself: an operator returns no alias)
    addnorm::add_pointwise_norm_backward(dy, dres?, s, alpha, shift?, weight?, bias?, kind, output_mask[4])
        -> (ds, dalpha, dshift, dweight, dbias)          absent ones empty

``kind``: "dyt" or "derf"; alpha and shift are one-element tensors (learned scalars, 0-d or (1,)). CPU: the C
kernels; CUDA: Triton; elsewhere and for other dtypes: ``formulas``. Autograd: ``autograd``.
"""

from __future__ import annotations

import math

import torch

from ...kernels.cpu import pointwise as _cpu
from ...kernels.triton import pointwise as _triton
from ..last import declined
from ..norm.schema import LIB, empty_if_none
from . import formulas as pf

LIB.define("add_pointwise_norm(Tensor x, Tensor? residual, Tensor alpha, Tensor? shift, Tensor? weight, "
           "Tensor? bias, str kind) -> (Tensor, Tensor)")
LIB.define("add_pointwise_norm_backward(Tensor dy, Tensor? dres, Tensor s, Tensor alpha, Tensor? shift, "
           "Tensor? weight, Tensor? bias, str kind, bool[4] output_mask) -> (Tensor, Tensor, Tensor, Tensor, Tensor)")


def _D(x, weight, bias):
    p = weight if weight is not None else bias
    return x.shape[-1] if p is None else math.prod(p.shape)


def _formulas(x, residual, alpha, shift, weight, bias, kind):
    y, s = pf.forward(x, residual, alpha, shift, weight, bias, kind)
    return y.contiguous(), (s.contiguous() if residual is not None else x.new_empty((0,)))


def _backward_formulas(dy, dres, s, alpha, shift, weight, bias, kind, mask):
    ds, *grads = pf.backward(dy, dres, s, alpha, shift, weight, bias, kind, mask)
    return (ds.contiguous(), *(empty_if_none(g, s) for g in grads))


def _scalar(t):
    return None if t is None else float(t.detach().float().item()) if t.device.type == "cpu" else t


def _impl(k):
    def forward(x, residual, alpha, shift, weight, bias, kind):
        D = _D(x, weight, bias)
        if not (k.applies(x, residual, weight, bias, D=D) and x.dtype != torch.float64):
            declined()
            return _formulas(x, residual, alpha, shift, weight, bias, kind)
        y, s = k.forward(x, residual, _scalar(alpha), _scalar(shift) or 0.0, weight, bias, kind, D, True)
        return y, (x.new_empty((0,)) if s is None else s)

    def backward(dy, dres, s, alpha, shift, weight, bias, kind, mask):
        D = _D(s, weight, bias)
        if not (k.applies(dy, dres, s, weight, bias, D=D) and s.dtype != torch.float64):
            return _backward_formulas(dy, dres, s, alpha, shift, weight, bias, kind, mask)
        ds, da, dsh, dw, db = k.backward(dy, dres, s, _scalar(alpha), _scalar(shift) or 0.0, weight, bias, kind, D,
                                         mask)
        da = None if da is None or not mask[0] else da.to(alpha.dtype).reshape(alpha.shape)
        dsh = None if dsh is None or shift is None or not mask[1] else dsh.to(shift.dtype).reshape(shift.shape)
        return ds, empty_if_none(da, s), empty_if_none(dsh, s), empty_if_none(dw, s), empty_if_none(db, s)

    return forward, backward


CPU = _impl(_cpu)
TRITON = _impl(_triton)
LIB.impl("add_pointwise_norm", CPU[0], "CPU")
LIB.impl("add_pointwise_norm", TRITON[0], "CUDA")
LIB.impl("add_pointwise_norm", _formulas, "CompositeExplicitAutograd")
LIB.impl("add_pointwise_norm_backward", CPU[1], "CPU")
LIB.impl("add_pointwise_norm_backward", TRITON[1], "CUDA")
LIB.impl("add_pointwise_norm_backward", _backward_formulas, "CompositeExplicitAutograd")


@torch.library.register_fake("addnorm::add_pointwise_norm", lib=LIB)
def _fake(x, residual, alpha, shift, weight, bias, kind):
    return x.new_empty(x.shape), (residual.new_empty(residual.shape) if residual is not None else x.new_empty((0,)))


@torch.library.register_fake("addnorm::add_pointwise_norm_backward", lib=LIB)
def _backward_fake(dy, dres, s, alpha, shift, weight, bias, kind, mask):
    out = [s.new_empty(s.shape)]
    for p, m in zip((alpha, shift, weight, bias), mask, strict=True):
        out.append(p.new_empty(p.shape) if p is not None and m else s.new_empty((0,)))
    return tuple(out)
