"""Autograd of DyT / Derf fused with the add: backward on the kernels, double backward from the formulas,
forward AD by the chain rule (``pointwise_formulas.derivative``)."""

from __future__ import annotations

import torch
import torch.autograd.forward_ad as _fwad

from ..norm.autograd import differentiable_backward, direct_subclass, primal
from . import formulas as pf
from .schema import CPU, LIB, TRITON

_op = torch.ops.addnorm.add_pointwise_norm.default
_op_backward = torch.ops.addnorm.add_pointwise_norm_backward.default


class PointwiseNorm(torch.autograd.Function):
    """(x, residual, alpha, shift, weight, bias, kind) -> (y, s)."""

    @staticmethod
    def forward(x, residual, alpha, shift, weight, bias, kind):
        with torch._C._AutoDispatchBelowAutograd():
            return _op(x, residual, alpha, shift, weight, bias, kind)

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, residual, alpha, shift, weight, bias, kind = inputs
        s = output[1] if residual is not None else x
        if residual is None:
            ctx.mark_non_differentiable(output[1])
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(s, alpha, shift, weight, bias)
        ctx.meta = (kind, residual is not None, x.dtype)
        ctx.direct = None
        if _fwad._current_level >= 0:
            ctx.primals = tuple(primal(t) for t in (s, alpha, shift, weight, bias))

    @staticmethod
    def backward(ctx, dy, ds_out):
        kind, has_res, xdt = ctx.meta
        s, alpha, shift, w, b = ctx.saved_tensors
        dres = ds_out if has_res else None
        needs = ctx.needs_input_grad
        mask = [needs[2], shift is not None and needs[3], w is not None and needs[4], b is not None and needs[5]]
        if dy is None:
            if dres is None:
                return (None,) * 7
            ds, grads = dres, [torch.zeros_like(p) if m else None for p, m in zip((alpha, shift, w, b), mask,
                                                                                   strict=True)]
        elif differentiable_backward(dy, dres):
            ds, *grads = pf.backward(dy, dres, s, alpha, shift, w, b, kind, mask)
        else:
            bwd = ctx.direct if ctx.direct is not None and type(dy) is torch.Tensor else _op_backward
            ds, *grads = bwd(dy, dres, s, alpha, shift, w, b, kind, mask)
            grads = [g if m else None for g, m in zip(grads, mask, strict=True)]
        dx = ds if ds.dtype == xdt else ds.to(xdt)
        return (dx, ds if has_res else None, *grads, None)

    @staticmethod
    def jvp(ctx, tx, tr, ta, tsh, tw, tb, _):
        kind, has_res, xdt = ctx.meta
        s, alpha, shift, w, b = ctx.primals
        ct = pf.compute_dtype(s, w)
        sf = s.to(ct)
        ts = None
        for t in (tx, tr):
            if t is not None:
                ts = t.to(ct) if ts is None else ts + t.to(ct)
        u = alpha.to(ct) * sf + (0 if shift is None else shift.to(ct))
        f, fp = pf.derivative(u, kind)
        tu = torch.zeros_like(sf)
        if ts is not None:
            tu = tu + alpha.to(ct) * ts
        if ta is not None:
            tu = tu + ta.to(ct) * sf
        if tsh is not None:
            tu = tu + tsh.to(ct)
        ty = fp * tu if w is None else w.to(ct) * fp * tu
        if tw is not None:
            ty = ty + tw.to(ct) * f
        if tb is not None:
            ty = ty + tb.to(ct)
        return ty.to(xdt), (ts.to(s.dtype) if ts is not None and has_res else None)


DirectPointwiseNorm = direct_subclass("DirectPointwiseNorm", PointwiseNorm, CPU[0], CPU[1])
TritonPointwiseNorm = direct_subclass("TritonPointwiseNorm", PointwiseNorm, TRITON[0], TRITON[1])


def _autograd(x, residual, alpha, shift, weight, bias, kind):
    return PointwiseNorm.apply(x, residual, alpha, shift, weight, bias, kind)


LIB.impl("add_pointwise_norm", _autograd, "Autograd")
