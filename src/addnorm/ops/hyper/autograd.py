"""Autograd of Qwen4-exp's gated read: the stream norm, the write with the norm after it, the sigmoid-gated collapse.
Backward on the kernels (one walk over the stream; the norm's statistics and the gates recomputed, never saved),
double backward and forward-mode AD from ``formulas``. ``HyperStreamNorm`` / ``HyperWriteNorm`` /
``SigmoidGatedCollapse`` redispatch to the operators (what tracing sees); their ``Direct`` variants call the CPU
implementation without the dispatcher."""

from __future__ import annotations

import torch
import torch.autograd.forward_ad as _fwad

from ..norm.autograd import differentiable_backward, direct_subclass, primal
from . import formulas as hf
from .schema import (LIB, gate_backward_impl, gate_impl, norm_backward_impl, norm_impl, write_norm_backward_impl,
                     write_norm_impl)

_norm = torch.ops.addnorm.hyper_stream_norm.default
_norm_backward = torch.ops.addnorm.hyper_stream_norm_backward.default
_write_norm = torch.ops.addnorm.hyper_write_norm.default
_write_norm_backward = torch.ops.addnorm.hyper_write_norm_backward.default
_gate = torch.ops.addnorm.hyper_sigmoid_gated_collapse.default
_gate_backward = torch.ops.addnorm.hyper_sigmoid_gated_collapse_backward.default


def _setup(ctx, saved, primals):
    ctx.save_for_backward(*saved)
    ctx.set_materialize_grads(False)
    ctx.direct = None
    if _fwad._current_level >= 0:  # jvp cannot read saved tensors
        ctx.primals = tuple(primal(t) for t in primals)


def _backward_fn(ctx, op, grad):
    """The backward to run: the Direct variant's implementation for a plain gradient, else the operator."""
    return ctx.direct if ctx.direct is not None and (grad is None or type(grad) is torch.Tensor) else op


class HyperStreamNorm(torch.autograd.Function):
    """(x, weight (n, C), eps, weight_offset) -> N."""

    @staticmethod
    def forward(x, weight, eps, weight_offset):
        with torch._C._AutoDispatchBelowAutograd():
            return _norm(x, weight, eps, weight_offset)

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, weight, ctx.eps, ctx.weight_offset = inputs
        _setup(ctx, (x, weight), (x, weight))

    @staticmethod
    def backward(ctx, dn):
        if dn is None:
            return None, None, None, None
        x, weight = ctx.saved_tensors
        if differentiable_backward(dn):  # double backward, or tangents to carry: the formulas (torch ops)
            dx, dw = hf.stream_norm_backward(dn, x, weight, ctx.eps, ctx.weight_offset)
        else:
            dx, dw = _backward_fn(ctx, _norm_backward, dn)(dn, x, weight, ctx.eps, ctx.weight_offset)
        need = ctx.needs_input_grad
        return dx if need[0] else None, dw if need[1] else None, None, None

    @staticmethod
    def jvp(ctx, tx, tw, _teps, _toff):
        x, weight = ctx.primals
        return hf.stream_norm_jvp(x, weight, tx, tw, ctx.eps, ctx.weight_offset)


class HyperWriteNorm(torch.autograd.Function):
    """(x, y, h_post, weight (n, C), eps, weight_offset, rounding) -> (X', N')."""

    @staticmethod
    def forward(x, y, h_post, weight, eps, weight_offset, rounding):
        with torch._C._AutoDispatchBelowAutograd():
            return _write_norm(x, y, h_post, weight, eps, weight_offset, rounding)

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, y, h_post, weight, ctx.eps, ctx.weight_offset, ctx.rounding = inputs
        # X' is what the norm read and what the write's backward needs; X itself is not kept
        _setup(ctx, (output[0], y, h_post, weight), (x, y, h_post, weight, output[0]))

    @staticmethod
    def backward(ctx, dx2, dn):
        if dx2 is None and dn is None:
            return (None,) * 7
        x2, y, h_post, weight = ctx.saved_tensors
        args = (x2, y, h_post, weight, ctx.eps, ctx.weight_offset)
        if differentiable_backward(dx2, dn):
            gs = hf.write_norm_backward(dx2, dn, *args)
        else:
            gs = _backward_fn(ctx, _write_norm_backward, dn if dn is not None else dx2)(dx2, dn, *args)
        return (*(g if ctx.needs_input_grad[i] else None for i, g in enumerate(gs)), None, None, None)

    @staticmethod
    def jvp(ctx, tx, ty, tpost, tw, _teps, _toff, _trounding):
        x, y, h_post, weight, x2 = ctx.primals
        tx2 = hf.write_jvp(x, y, h_post, tx, ty, tpost)
        return tx2, hf.stream_norm_jvp(x2, weight, tx2, tw, ctx.eps, ctx.weight_offset)


class SigmoidGatedCollapse(torch.autograd.Function):
    """(x, logits, rounding) -> h = (1/n) sum_i sigmoid(U_i) X_i."""

    @staticmethod
    def forward(x, logits, rounding):
        with torch._C._AutoDispatchBelowAutograd():
            return _gate(x, logits, rounding)

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, logits, ctx.rounding = inputs
        _setup(ctx, (x, logits), (x, logits))

    @staticmethod
    def backward(ctx, dh):
        if dh is None:
            return None, None, None
        x, logits = ctx.saved_tensors
        if differentiable_backward(dh):
            dx, du = hf.sigmoid_gated_collapse_backward(dh, x, logits, ctx.rounding)
        else:
            dx, du = _backward_fn(ctx, _gate_backward, dh)(dh, x, logits, ctx.rounding)
        need = ctx.needs_input_grad
        return dx if need[0] else None, du if need[1] else None, None

    @staticmethod
    def jvp(ctx, tx, tu, _trounding):
        x, logits = ctx.primals
        return hf.sigmoid_gated_collapse_jvp(x, logits, tx, tu, ctx.rounding)


DirectHyperStreamNorm = direct_subclass("DirectHyperStreamNorm", HyperStreamNorm, norm_impl, norm_backward_impl)
DirectHyperWriteNorm = direct_subclass("DirectHyperWriteNorm", HyperWriteNorm, write_norm_impl,
                                       write_norm_backward_impl)
DirectSigmoidGatedCollapse = direct_subclass("DirectSigmoidGatedCollapse", SigmoidGatedCollapse, gate_impl,
                                             gate_backward_impl)


def _norm_autograd(x, weight, eps, weight_offset):
    return HyperStreamNorm.apply(x, weight, eps, weight_offset)


def _write_norm_autograd(x, y, h_post, weight, eps, weight_offset, rounding):
    return HyperWriteNorm.apply(x, y, h_post, weight, eps, weight_offset, rounding)


def _gate_autograd(x, logits, rounding):
    return SigmoidGatedCollapse.apply(x, logits, rounding)


LIB.impl("hyper_stream_norm", _norm_autograd, "Autograd")
LIB.impl("hyper_write_norm", _write_norm_autograd, "Autograd")
LIB.impl("hyper_sigmoid_gated_collapse", _gate_autograd, "Autograd")
