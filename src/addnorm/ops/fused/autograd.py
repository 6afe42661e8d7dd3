"""Autograd of the fused forms' operators: backward (the kernels, one pass), double backward (the torch
formulas, differentiable again) and forward-mode AD, registered once.

As ``autograd.AddNorm``: the base Function redispatches below autograd to the operator (what tracing
sees); its ``Direct`` and ``Triton`` variants call one implementation without the dispatcher, both ways,
for eager calls with nothing tracing (and ``backend="triton"`` on CPU tensors under the interpreter).
"""

from __future__ import annotations

import torch
import torch.autograd.forward_ad as _fwad

from ...kernels.cpu import fused as _cpu_fused
from ...kernels.cpu import norm as _cpu_ops
from ..norm import formulas
from ..norm.autograd import differentiable_backward, direct_subclass, primal
from ..norm.schema import backward_cpu, backward_triton
from . import formulas as fused_formulas
from .schema import (LIB, norm_add_cpu, norm_add_triton, parallel_backward_cpu, parallel_backward_triton, parallel_cpu,
                     parallel_triton)

_norm_add = torch.ops.addnorm.norm_add.default
_parallel = torch.ops.addnorm.parallel_add_norm.default
_parallel_backward = torch.ops.addnorm.parallel_add_norm_backward.default
_norm_backward = torch.ops.addnorm.add_norm_backward.default


def _to(t, dtype):
    return None if t is None or t.dtype == dtype else t.to(dtype)


class NormAdd(torch.autograd.Function):
    """(x, residual, weight, bias) -> (out, stats): out = residual + Norm(x)."""

    @staticmethod
    def forward(x, residual, weight, bias, kind, ndim, eps, weight_offset, cast_before_weight):
        with torch._C._AutoDispatchBelowAutograd():
            return _norm_add(x, residual, weight, bias, kind, ndim, eps, weight_offset, cast_before_weight)

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, residual, weight, bias, kind, ndim, eps, off, cbw = inputs
        out, stats = output
        ctx.set_materialize_grads(False)
        ctx.mark_non_differentiable(stats)
        ctx.save_for_backward(x, stats, weight, bias)
        if _fwad._current_level >= 0:
            ctx.primals = (primal(x), primal(weight))
        ctx.meta = (kind, ndim, eps, off, cbw, residual.dtype, out.dtype)
        ctx.direct = None  # the backward implementation to call without the dispatcher (the direct subclasses)

    @staticmethod
    def backward(ctx, dout, _dstats):
        if dout is None:
            return (None,) * 9
        kind, ndim, eps, off, _, rdt, _ = ctx.meta
        x, stats, w, b = ctx.saved_tensors
        needs = ctx.needs_input_grad
        want_w, want_b = w is not None and needs[2], b is not None and needs[3]
        dx = dw = db = None
        if needs[0] or want_w or want_b:
            if differentiable_backward(dout):
                dx, _, dw, db = formulas.backward(dout, None, x, w, b, kind, ndim, eps, off, x.dtype,
                                                  (True, want_w, want_b))
            else:
                direct = ctx.direct is not None and type(dout) is torch.Tensor
                bwd = ctx.direct if direct else _norm_backward
                dx, _, dw, db = bwd(dout, None, x, stats, w, b, kind, ndim, eps, off, x.dtype, [True, want_w, want_b])
                dw, db = (dw if want_w else None), (db if want_b else None)
        dres = (dout if dout.dtype == rdt else dout.to(rdt)) if needs[1] else None
        return dx, dres, dw, db, None, None, None, None, None

    @staticmethod
    def jvp(ctx, tx, tr, tw, tb, *_):
        kind, ndim, eps, off, cbw, _, odt = ctx.meta
        x, w = ctx.primals
        ty, _ = formulas.jvp(x, w, kind, ndim, eps, off, cbw, x.dtype, tx, None, tw, tb)
        parts = [t for t in (tr, ty) if t is not None]
        if not parts:
            return None, None
        ct = formulas.compute_dtype(x, *parts)
        total = parts[0].to(ct) if len(parts) == 1 else parts[0].to(ct) + parts[1].to(ct)
        return total.to(odt), None


DirectNormAdd = direct_subclass("DirectNormAdd", NormAdd, norm_add_cpu, backward_cpu, "NormAdd on the C kernels.")
TritonNormAdd = direct_subclass("TritonNormAdd", NormAdd, norm_add_triton, backward_triton,
                                "NormAdd on the Triton kernels.")


class ParallelAddNorm(torch.autograd.Function):
    """(x, x2, residual, weight, bias, weight2, bias2) -> (y, y2, s, stats); see ``schema``."""

    @staticmethod
    def forward(x, x2, residual, weight, bias, weight2, bias2, kind, ndim, eps, weight_offset, cast_before_weight,
                two, branches_first):
        with torch._C._AutoDispatchBelowAutograd():
            return _parallel(x, x2, residual, weight, bias, weight2, bias2, kind, ndim, eps, weight_offset,
                             cast_before_weight, two, branches_first)

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, x2, residual, weight, bias, weight2, bias2, kind, ndim, eps, off, cbw, two, _ = inputs
        _, y2, s, stats = output
        ctx.set_materialize_grads(False)
        ctx.mark_non_differentiable(*((stats,) if two else (stats, y2)))
        ctx.save_for_backward(s, stats, weight, bias, weight2, bias2)
        if _fwad._current_level >= 0:
            ctx.primals = (primal(s), primal(weight), primal(weight2))
        ctx.meta = (kind, ndim, eps, off, cbw, two, x.dtype, None if x2 is None else x2.dtype, residual.dtype)
        ctx.direct = None

    @staticmethod
    def backward(ctx, dy, dy2, dres, _dstats):
        kind, ndim, eps, off, _, two, xdt, x2dt, rdt = ctx.meta
        s, stats, w, b, w2, b2 = ctx.saved_tensors
        dy2 = dy2 if two else None
        if dy is None and dy2 is None and dres is None:
            return (None,) * 14
        needs = ctx.needs_input_grad
        mask = [w is not None and needs[3], b is not None and needs[4], w2 is not None and needs[5],
                b2 is not None and needs[6]]
        if dy is None and dy2 is None:
            ds, grads = dres, [torch.zeros_like(p) if m else None for p, m in zip((w, b, w2, b2), mask, strict=True)]
        elif differentiable_backward(dy, dy2, dres):
            ds, *grads = fused_formulas.parallel_backward(dy, dy2, dres, s, w, b, w2, b2, kind, ndim, eps, off, mask)
        else:
            direct = ctx.direct is not None and type(dy if dy is not None else dy2) is torch.Tensor
            bwd = ctx.direct if direct else _parallel_backward
            ds, *grads = bwd(dy, dy2, dres, s, stats, w, b, w2, b2, kind, ndim, eps, off, mask)
            grads = [g if m else None for g, m in zip(grads, mask, strict=True)]
        dx = (ds if xdt == s.dtype else ds.to(xdt)) if needs[0] else None
        dx2 = (ds if x2dt == s.dtype else ds.to(x2dt)) if needs[1] and x2dt is not None else None
        dr = (ds if rdt == s.dtype else ds.to(rdt)) if needs[2] else None
        return (dx, dx2, dr, *grads) + (None,) * 7

    @staticmethod
    def jvp(ctx, tx, tx2, tr, tw, tb, tw2, tb2, *_):
        kind, ndim, eps, off, cbw, two, xdt, _, _ = ctx.meta
        s, w, w2 = ctx.primals
        parts = [t for t in (tx, tx2, tr) if t is not None]
        ts = None
        if parts:
            ct = formulas.compute_dtype(s, *parts)
            ts = parts[0].to(ct)
            for t in parts[1:]:
                ts = ts + t.to(ct)
        ty, _ = formulas.jvp(s, w, kind, ndim, eps, off, cbw, xdt, ts, None, tw, tb)
        ty2 = None
        if two:
            ty2, _ = formulas.jvp(s, w2, kind, ndim, eps, off, cbw, xdt, ts, None, tw2, tb2)
        return ty, ty2, (None if ts is None else ts.to(s.dtype)), None


DirectParallelAddNorm = direct_subclass("DirectParallelAddNorm", ParallelAddNorm, parallel_cpu,
                                        parallel_backward_cpu, "ParallelAddNorm on the C kernels.")
TritonParallelAddNorm = direct_subclass("TritonParallelAddNorm", ParallelAddNorm, parallel_triton,
                                        parallel_backward_triton, "ParallelAddNorm on the Triton kernels.")


def _norm_add_autograd(x, residual, weight, bias, kind, ndim, eps, weight_offset, cast_before_weight):
    return NormAdd.apply(x, residual, weight, bias, kind, ndim, eps, weight_offset, cast_before_weight)


def _parallel_autograd(x, x2, residual, weight, bias, weight2, bias2, kind, ndim, eps, weight_offset,
                       cast_before_weight, two, branches_first):
    return ParallelAddNorm.apply(x, x2, residual, weight, bias, weight2, bias2, kind, ndim, eps, weight_offset,
                                 cast_before_weight, two, branches_first)


LIB.impl("norm_add", _norm_add_autograd, "Autograd")
LIB.impl("parallel_add_norm", _parallel_autograd, "Autograd")


# ---------------------------------------------------------------- the eager fast path's autograd nodes
# Contiguous CPU tensors of one dtype, one normalized dim, nothing tracing (the caller checks): the host
# calls made directly both ways, as ``autograd.EagerAddNorm`` does for Add & Norm.


class EagerNormAdd(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, residual, weight, bias, kind, eps, weight_offset, cast_before_weight):
        ctx.set_materialize_grads(False)
        out, stats = _cpu_fused.norm_add_contiguous(x, residual, weight, bias, kind, eps, weight_offset,
                                                    cast_before_weight, True)
        ctx.save_for_backward(x, stats, weight, bias)
        w_read, b_read, pcode = _cpu_ops.params(weight, bias, x.shape[-1])  # as the kernels read them
        ctx.params = (w_read, pcode, _cpu_ops.spec(weight, w_read), _cpu_ops.spec(bias, b_read))
        if _fwad._current_level >= 0:
            ctx.primals = (primal(x), primal(weight))
        ctx.meta = (kind, eps, weight_offset, cast_before_weight)
        return out

    @staticmethod
    def backward(ctx, dout):
        if dout is None:
            return (None,) * 8
        kind, eps, off, _ = ctx.meta
        x, stats, w, b = ctx.saved_tensors
        needs = ctx.needs_input_grad
        want_w, want_b = w is not None and needs[2], b is not None and needs[3]
        if differentiable_backward(dout):
            dx, _, dw, db = formulas.backward(dout, None, x, w, b, kind, 1, eps, off, x.dtype, (True, want_w, want_b))
        elif type(dout) is torch.Tensor:  # the host call itself, as EagerAddNorm's backward makes it
            D = x.shape[-1]
            w_read, pcode, wspec, bspec = ctx.params
            dx = _cpu_ops.empty_rows_like(dout)
            contiguous = dout.is_contiguous()
            dw, db = _cpu_ops.backward(kind, dout if contiguous else _cpu_ops.as_rows(dout, D), x, stats, w_read, pcode,
                                       off, None, dx, want_w, want_b, x.numel() // D, D, contiguous)
            dw, db = _cpu_ops.like(dw, wspec), _cpu_ops.like(db, bspec)
        else:
            dx, _, dw, db = _norm_backward(dout, None, x, stats, w, b, kind, 1, eps, off, x.dtype,
                                           [True, want_w, want_b])
        return dx, (dout if needs[1] else None), (dw if want_w else None), (db if want_b else None), None, None, None, \
            None

    @staticmethod
    def jvp(ctx, tx, tr, tw, tb, *_):
        kind, eps, off, cbw = ctx.meta
        x, w = ctx.primals
        ty, _ = formulas.jvp(x, w, kind, 1, eps, off, cbw, x.dtype, tx, None, tw, tb)
        if ty is None:
            return tr
        return ty if tr is None else (tr.to(formulas.compute_dtype(x)) + ty.to(formulas.compute_dtype(x))).to(x.dtype)


class EagerParallelAddNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, x2, residual, weight, bias, weight2, bias2, kind, eps, weight_offset, cast_before_weight,
                branches_first):
        ctx.set_materialize_grads(False)
        y, y2, s, stats = _cpu_fused.parallel_contiguous(x, x2, residual, weight, bias, weight2, bias2, kind, eps,
                                                         weight_offset, cast_before_weight, branches_first, True)
        two = y2 is not None
        if not two:
            y2 = x.new_empty((0,))
            ctx.mark_non_differentiable(y2)
        ctx.save_for_backward(s, stats, weight, bias, weight2, bias2)
        if _fwad._current_level >= 0:
            ctx.primals = (primal(s), primal(weight), primal(weight2))
        ctx.meta = (kind, eps, weight_offset, cast_before_weight, two, x2 is not None)
        return y, y2, s

    @staticmethod
    def backward(ctx, dy, dy2, dres):
        kind, eps, off, _, two, has_x2 = ctx.meta
        s, stats, w, b, w2, b2 = ctx.saved_tensors
        dy2 = dy2 if two else None
        if dy is None and dy2 is None and dres is None:
            return (None,) * 12
        needs = ctx.needs_input_grad
        mask = [w is not None and needs[3], b is not None and needs[4], w2 is not None and needs[5],
                b2 is not None and needs[6]]
        if dy is None and dy2 is None:
            ds, grads = dres, [torch.zeros_like(p) if m else None for p, m in zip((w, b, w2, b2), mask, strict=True)]
        elif differentiable_backward(dy, dy2, dres):
            ds, *grads = fused_formulas.parallel_backward(dy, dy2, dres, s, w, b, w2, b2, kind, 1, eps, off, mask)
        elif type(dy if dy is not None else dy2) is torch.Tensor:
            ds, *grads = _cpu_fused.parallel_backward(dy, dy2, dres, s, stats, w, b, w2, b2, kind, s.shape[-1], off,
                                                      mask)
        else:
            ds, *grads = _parallel_backward(dy, dy2, dres, s, stats, w, b, w2, b2, kind, 1, eps, off, mask)
            grads = [g if m else None for g, m in zip(grads, mask, strict=True)]
        return (ds if needs[0] else None, ds if needs[1] and has_x2 else None, ds if needs[2] else None, *grads,
                None, None, None, None, None)

    @staticmethod
    def jvp(ctx, tx, tx2, tr, tw, tb, tw2, tb2, *_):
        kind, eps, off, cbw, two, _ = ctx.meta
        s, w, w2 = ctx.primals
        parts = [t for t in (tx, tx2, tr) if t is not None]
        ts = None
        if parts:
            ct = formulas.compute_dtype(s)
            ts = parts[0].to(ct)
            for t in parts[1:]:
                ts = ts + t.to(ct)
        ty, _ = formulas.jvp(s, w, kind, 1, eps, off, cbw, s.dtype, ts, None, tw, tb)
        ty2 = formulas.jvp(s, w2, kind, 1, eps, off, cbw, s.dtype, ts, None, tw2, tb2)[0] if two else None
        return ty, ty2, (None if ts is None else ts.to(s.dtype))
