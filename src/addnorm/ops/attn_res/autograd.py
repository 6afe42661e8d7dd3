"""Autograd of Attention Residuals' depth mix: backward on the kernels (one pass over the sources), double backward
and forward-mode AD from ``formulas``. ``AttnRes`` redispatches to the operator (what tracing sees); its
``Direct`` variant calls the CPU implementation without the dispatcher.

The sources are a variable number of tensors: ``apply(query, weight, eps, *sources)`` takes them as separate
arguments, so that autograd sees each one (a list argument would hide them from it).
"""

from __future__ import annotations

import torch
import torch.autograd.forward_ad as _fwad

from ..norm.autograd import c_apply, differentiable_backward, primal
from . import formulas as af
from .schema import CPU, LIB

_forward = torch.ops.addnorm.attn_res.default
_backward = torch.ops.addnorm.attn_res_backward.default


class AttnRes(torch.autograd.Function):
    """(query, weight, eps, *sources) -> (h, alpha, rstd); alpha and rstd are not differentiable (they are what
    backward reads)."""

    @staticmethod
    def forward(query, weight, eps, *sources):
        with torch._C._AutoDispatchBelowAutograd():
            return _forward(list(sources), query, weight, eps)

    @staticmethod
    def setup_context(ctx, inputs, output):
        query, weight, eps, *sources = inputs
        ctx.save_for_backward(query, weight, output[1], output[2], *sources)
        ctx.eps = eps
        ctx.mark_non_differentiable(output[1], output[2])
        ctx.set_materialize_grads(False)
        ctx.direct = None
        if _fwad._current_level >= 0:  # jvp cannot read saved tensors
            ctx.primals = tuple(primal(t) for t in (query, weight, *sources))

    @staticmethod
    def backward(ctx, dh, _dalpha, _drstd):
        if dh is None:
            return (None,) * (len(ctx.saved_tensors) - 1)  # one per input: 4 + S saved, 3 + S inputs
        query, weight, alpha, rstd, *sources = ctx.saved_tensors
        if differentiable_backward(dh):  # double backward, or tangents to carry: the formulas (torch ops)
            dsources, dq, dw = af.backward(dh, sources, query, weight, ctx.eps)
        else:
            bwd = ctx.direct if ctx.direct is not None and type(dh) is torch.Tensor else _backward
            dsources, dq, dw = bwd(dh, sources, query, weight, alpha, rstd, ctx.eps)
        need = ctx.needs_input_grad
        return (dq if need[0] else None, dw if need[1] else None, None,
                *(d if need[3 + s] else None for s, d in enumerate(dsources)))

    @staticmethod
    def jvp(ctx, t_query, t_weight, _t_eps, *t_sources):
        query, weight, *sources = ctx.primals
        return af.jvp(sources, query, weight, t_sources, t_query, t_weight, ctx.eps), None, None


class DirectAttnRes(AttnRes):
    """``AttnRes`` on the CPU implementation both ways, without the dispatcher."""

    @staticmethod
    def forward(query, weight, eps, *sources):
        return CPU[0](list(sources), query, weight, eps)

    @staticmethod
    def setup_context(ctx, inputs, output):
        AttnRes.setup_context(ctx, inputs, output)
        ctx.direct = CPU[1]


def _autograd(sources, query, weight, eps):
    return c_apply(AttnRes)(query, weight, eps, *sources)


LIB.impl("attn_res", _autograd, "Autograd")
