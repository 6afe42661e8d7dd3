"""Autograd of mHC's pre step: backward on the kernels (one pass over the stream, reading the rounds the forward
kept), double backward and forward-mode AD from ``formulas``. ``MhcPre`` redispatches to the operator (what
tracing sees); its ``Direct``/``Triton`` variants call one implementation without the dispatcher."""

from __future__ import annotations

import torch
import torch.autograd.forward_ad as _fwad

from ..norm.autograd import differentiable_backward, direct_subclass, primal
from . import formulas as mf
from .schema import CPU, LIB, TRITON

_pre = torch.ops.addnorm.mhc_pre.default
_pre_backward = torch.ops.addnorm.mhc_pre_backward.default
N_IN = 8  # x, phi, a_pre, a_post, a_res, b_pre, b_post, b_res
N_ARGS = 9  # perms, eps, iters and the convention (pre_eps, res_eps, res_transposed, post_scale, post_eps, groups)


class MhcPre(torch.autograd.Function):
    """(x, phi, a_pre, a_post, a_res, b_pre, b_post, b_res, perms, eps, iters, *convention)
    -> (h, H_pre, H_post, H_res, p, rstd, state); p, rstd and state are not differentiable: they are what backward
    reads (state: Sinkhorn-Knopp's rounds, where the forward kept them, so that the backward does not run them
    again). The last six arguments are a model's convention (``convention.MhcConvention``'s fields); the rounds kept
    are that convention's, and the backward is handed the same one."""

    @staticmethod
    def forward(x, phi, a_pre, a_post, a_res, b_pre, b_post, b_res, perms, eps, iters, pre_eps, res_eps,
                res_transposed, post_scale, post_eps, groups):
        with torch._C._AutoDispatchBelowAutograd():
            return _pre(x, phi, a_pre, a_post, a_res, b_pre, b_post, b_res, perms, eps, iters, pre_eps, res_eps,
                        res_transposed, post_scale, post_eps, groups)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ts, (perms, eps, iters, *convention) = inputs[:N_IN], inputs[N_IN:]
        ctx.save_for_backward(*ts, output[4], output[5], output[6])
        ctx.perms, ctx.eps, ctx.iters = perms, eps, iters
        ctx.convention = tuple(convention)
        ctx.mark_non_differentiable(output[4], output[5], output[6])
        ctx.set_materialize_grads(False)
        ctx.direct = None
        if _fwad._current_level >= 0:  # jvp cannot read saved tensors
            ctx.primals = tuple(primal(t) for t in ts)

    @staticmethod
    def backward(ctx, dh, dh_pre, dh_post, dh_res, _dp, _drstd, _dstate):
        if dh is None and dh_pre is None and dh_post is None and dh_res is None:
            return (None,) * (N_IN + N_ARGS)
        *ts, p, rstd, state = ctx.saved_tensors
        if differentiable_backward(dh, dh_pre, dh_post, dh_res):  # double backward, or tangents to carry: the formulas (torch ops)
            gs = mf.pre_backward(dh, dh_pre, dh_post, dh_res, *ts, ctx.perms, ctx.eps, ctx.iters, *ctx.convention)
        else:
            bwd = ctx.direct if ctx.direct is not None and (dh is None or type(dh) is torch.Tensor) else _pre_backward
            gs = bwd(dh, dh_pre, dh_post, dh_res, *ts, ctx.perms, p, rstd, state, ctx.eps, ctx.iters, *ctx.convention)
        return (*(g if ctx.needs_input_grad[i] else None for i, g in enumerate(gs)), *(None,) * N_ARGS)

    @staticmethod
    def jvp(ctx, *tangents):
        prim = ctx.primals
        touts = mf.pre_jvp(prim, tangents[:N_IN], ctx.perms, ctx.eps, ctx.iters, *ctx.convention)
        return (*touts, None, None, None)  # p, rstd and state are not differentiable


DirectMhcPre = direct_subclass("DirectMhcPre", MhcPre, CPU[0], CPU[1])
TritonMhcPre = direct_subclass("TritonMhcPre", MhcPre, TRITON[0], TRITON[1])


def _pre_autograd(x, phi, a_pre, a_post, a_res, b_pre, b_post, b_res, perms, eps, iters, pre_eps=0.0, res_eps=0.0,
                  res_transposed=False, post_scale=2.0, post_eps=0.0, groups=3):
    return MhcPre.apply(x, phi, a_pre, a_post, a_res, b_pre, b_post, b_res, perms, eps, iters, pre_eps, res_eps,
                        res_transposed, post_scale, post_eps, groups)


LIB.impl("mhc_pre", _pre_autograd, "Autograd")
