"""Autograd of the widened stream's operators: backward on the kernels (one pass), double backward and
forward-mode AD from ``formulas``. ``StreamRead`` / ``StreamWrite`` redispatch to the operators (what
tracing sees); their ``Direct``/``Triton`` variants call one implementation without the dispatcher."""

from __future__ import annotations

import torch
import torch.autograd.forward_ad as _fwad

from ..norm.autograd import differentiable_backward, direct_subclass, primal
from . import formulas as sf
from .schema import CPU, TRITON, LIB

_read = torch.ops.addnorm.stream_read.default
_read_backward = torch.ops.addnorm.stream_read_backward.default
_write = torch.ops.addnorm.stream_write.default
_write_backward = torch.ops.addnorm.stream_write_backward.default


class StreamRead(torch.autograd.Function):
    @staticmethod
    def forward(x, h_pre):
        with torch._C._AutoDispatchBelowAutograd():
            return _read(x, h_pre)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(*inputs)
        ctx.set_materialize_grads(False)
        ctx.direct = None
        if _fwad._current_level >= 0:  # jvp cannot read saved tensors
            ctx.primals = tuple(primal(t) for t in inputs)

    @staticmethod
    def backward(ctx, dh):
        if dh is None:
            return None, None
        x, h_pre = ctx.saved_tensors
        if differentiable_backward(dh):
            dx, d = sf.read_backward(dh, x, h_pre)
        else:
            dx, d = (ctx.direct if ctx.direct is not None and type(dh) is torch.Tensor else _read_backward)(dh, x,
                                                                                                            h_pre)
        return dx, d

    @staticmethod
    def jvp(ctx, tx, th):
        x, h_pre = ctx.primals
        parts = ([sf.read(tx, h_pre)] if tx is not None else []) + ([sf.read(x, th)] if th is not None else [])
        return None if not parts else sum(parts[1:], parts[0])


class StreamWrite(torch.autograd.Function):
    @staticmethod
    def forward(x, y, h_post, h_res):
        with torch._C._AutoDispatchBelowAutograd():
            return _write(x, y, h_post, h_res)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(*inputs, output[0])
        ctx.set_materialize_grads(False)
        ctx.direct = None
        if _fwad._current_level >= 0:
            ctx.primals = tuple(primal(t) for t in (*inputs, output[0]))

    @staticmethod
    def backward(ctx, dx2, dq):
        if dx2 is None and dq is None:
            return None, None, None, None
        x, y, h_post, h_res, x2 = ctx.saved_tensors
        if differentiable_backward(dx2, dq) or dx2 is None:
            return sf.write_backward(dx2, dq, x, y, x2, h_post, h_res)
        bwd = ctx.direct if ctx.direct is not None and type(dx2) is torch.Tensor else _write_backward
        return tuple(bwd(dx2, dq, x, y, x2, h_post, h_res))

    @staticmethod
    def jvp(ctx, tx, ty, tpost, tres):
        x, y, h_post, h_res, x2 = ctx.primals
        ct = sf.compute_dtype(x, y, h_post, h_res)
        t = torch.zeros(x.shape, dtype=ct, device=x.device)
        if tx is not None:
            t = t + torch.matmul(h_res.to(ct), tx.to(ct))
        if tres is not None:
            t = t + torch.matmul(tres.to(ct), x.to(ct))
        if tpost is not None:
            t = t + tpost.to(ct).unsqueeze(-1) * y.to(ct).unsqueeze(-2)
        if ty is not None:
            t = t + h_post.to(ct).unsqueeze(-1) * ty.to(ct).unsqueeze(-2)
        return t.to(x.dtype), 2 * (x2.to(ct) * t).sum((-2, -1))


DirectStreamRead = direct_subclass("DirectStreamRead", StreamRead, CPU[0], CPU[1])
TritonStreamRead = direct_subclass("TritonStreamRead", StreamRead, TRITON[0], TRITON[1])
DirectStreamWrite = direct_subclass("DirectStreamWrite", StreamWrite, CPU[2], CPU[3])
TritonStreamWrite = direct_subclass("TritonStreamWrite", StreamWrite, TRITON[2], TRITON[3])


def _read_autograd(x, h_pre):
    return StreamRead.apply(x, h_pre)


def _write_autograd(x, y, h_post, h_res):
    return StreamWrite.apply(x, y, h_post, h_res)


LIB.impl("stream_read", _read_autograd, "Autograd")
LIB.impl("stream_write", _write_autograd, "Autograd")
