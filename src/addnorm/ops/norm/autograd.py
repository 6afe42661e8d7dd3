"""Autograd of ``addnorm::add_norm``: backward, double backward and forward-mode AD, registered once.

``AddNorm`` is the operator's Autograd kernel. Its forward redispatches below autograd to the device
implementation, so torch.compile, make_fx, torch.export and FakeTensorMode record the operator, not
what it computes. In eager code with nothing tracing, the same math runs without the dispatcher's cost
(~64 us a call at 64 x 768): ``DirectAddNorm`` (``AddNorm`` calling the CPU implementation directly) for
general calls, ``EagerAddNorm`` (two outputs, host calls made directly) for the fast path.

* backward: ``addnorm::add_norm_backward`` (the kernels), one pass;
* backward under ``create_graph=True``: the torch-op formulas, so the gradient is itself differentiable
  (gradient penalties, hessians, hvp);
* forward-mode AD: ``jvp``, the formula in ``formulas.jvp``.
"""

from __future__ import annotations

import math

import torch
import torch.autograd.forward_ad as _fwad

from ...kernels.cpu import norm as _cpu
from ...kernels.triton import norm as _triton
from . import formulas
from .schema import LIB, backward_cpu, backward_triton, forward_cpu, forward_triton

_add_norm_backward = torch.ops.addnorm.add_norm_backward.default
_add_norm = torch.ops.addnorm.add_norm.default
_dispatch_depth = torch._C._len_torch_dispatch_stack


def c_apply(cls):
    """``cls.apply`` without its Python prologue: the public apply binds every call's arguments through
    inspect.signature (~40 us at 64 x 768 for setup_context-style Functions); the C-level apply it ends in
    takes them positionally. Falls back to the public apply where the private entry point is gone."""
    try:
        return torch._C._FunctionBase.__dict__["apply"].__get__(None, cls)
    except (AttributeError, KeyError):
        return cls.apply


def plain(t) -> bool:
    """A real CPU tensor with nothing between it and the kernels: no subclass, no dispatch mode,
    no tracer, no compiler."""
    return (not torch.compiler.is_compiling() and type(t) is torch.Tensor and not _dispatch_depth()
            and torch._C._get_tracing_state() is None)


def direct_forward(x, residual, weight, bias, kind, ndim, eps, weight_offset, cast_before_weight, out_dtype,
                   residual_in_fp32, triton=False):
    """Inference on the CPU implementation (``triton``: the Triton one), called without the dispatcher:
    (y, s or None)."""
    D = x.shape[-1] if ndim == 1 else math.prod(x.shape[x.dim() - ndim:])
    sdt = None
    if residual is not None:
        sdt = residual.dtype
    elif residual_in_fp32:
        sdt = formulas.sum_dtype(x, None, True)
        sdt = None if sdt == x.dtype else sdt
    kernels = _triton if triton else _cpu
    y, s, _ = kernels.add_norm(x, residual, weight, bias, kind, D, eps, weight_offset, cast_before_weight, out_dtype,
                               sdt, False)
    return y, s


def eager_inference(x, residual, weight, bias, kind, eps, weight_offset, cast_before_weight):
    """The fast path without autograd: contiguous CPU tensors of one dtype, one normalized dim (the caller
    checks), straight to the kernel; no statistics kept."""
    D = x.shape[-1]
    out = _cpu.empty_rows_like(x)
    s = None if residual is None else _cpu.empty_rows_like(x)
    _cpu.forward(kind, x, residual, weight, bias, eps, weight_offset, cast_before_weight, out, s, None, x.numel() // D,
                 D, True)
    return out, s


_has_storage = torch._C._has_storage


def differentiable_backward(*grads) -> bool:
    """Whether a backward must run as torch ops rather than on the kernels: under create_graph=True (it is itself
    differentiated), inside a forward-mode AD level (a Hessian-vector product taken forward-over-reverse: the
    tangents of the saved tensors and the incoming gradients must reach the result, and the kernels read primal
    values only -- they would drop them silently), or when an incoming gradient (``grads``) has no storage: a
    batch of gradients under ``autograd.grad(..., is_grads_batched=True)`` (a vmap wrapper) or a functorch
    transform over the backward, which torch ops batch or transform and the kernels cannot read."""
    return torch.is_grad_enabled() or _fwad._current_level >= 0 or any(
        g is not None and not _has_storage(g) for g in grads)


def direct_subclass(name, base, forward_impl, backward_impl, doc=None):
    """A subclass of the autograd Function ``base`` that calls one implementation directly both ways, without the
    dispatcher: ``forward_impl`` forward, ``backward_impl`` (kept as ``ctx.direct``) backward."""

    def forward(*args):
        return forward_impl(*args)

    def setup_context(ctx, inputs, output):
        base.setup_context(ctx, inputs, output)
        ctx.direct = backward_impl

    body = {"forward": staticmethod(forward), "setup_context": staticmethod(setup_context)}
    return type(name, (base,), body if doc is None else {**body, "__doc__": doc})


def primal(t):
    return None if t is None else _fwad.unpack_dual(t).primal.detach()


def _zero_grads(dres, x_dtype, w, b, want_w, want_b):
    """Backward when only the residual sum was used downstream."""
    dx = dres.to(x_dtype) if dres.dtype != x_dtype else None
    return dres, dx, (torch.zeros_like(w) if want_w else None), (torch.zeros_like(b) if want_b else None)


class AddNorm(torch.autograd.Function):
    """(x, residual, weight, bias) -> (y, s, stats); see ``addnorm.ops.norm.schema`` for the outputs."""

    @staticmethod
    def forward(x, residual, weight, bias, kind, ndim, eps, weight_offset, cast_before_weight, out_dtype,
                residual_in_fp32):
        with torch._C._AutoDispatchBelowAutograd():
            return _add_norm(x, residual, weight, bias, kind, ndim, eps, weight_offset, cast_before_weight, out_dtype,
                             residual_in_fp32)

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, residual, weight, bias, kind, ndim, eps, weight_offset, cast_before_weight, out_dtype, fp32 = inputs
        _, s, stats = output
        has_sum = formulas.returns_sum(x, residual, fp32)
        saved = s if has_sum else x
        ctx.set_materialize_grads(False)  # an unused output's gradient stays None, not a tensor of zeros
        # one call: a second mark_non_differentiable replaces the first's set instead of adding to it
        ctx.mark_non_differentiable(*((stats,) if has_sum else (stats, s)))
        ctx.save_for_backward(saved, stats, weight, bias)
        if _fwad._current_level >= 0:  # jvp runs right after forward: plain detached references suffice
            ctx.primals = (primal(saved), primal(weight))
        ctx.meta = (kind, ndim, eps, weight_offset, cast_before_weight, out_dtype or x.dtype, x.dtype, has_sum,
                    residual is not None)
        ctx.direct = None  # the backward implementation to call without the dispatcher (the direct subclasses)

    @staticmethod
    def backward(ctx, dy, ds_out, _dstats):
        kind, ndim, eps, off, _, _, x_dtype, has_sum, has_res = ctx.meta
        saved, stats, w, b = ctx.saved_tensors
        needs = ctx.needs_input_grad
        want_w, want_b = w is not None and needs[2], b is not None and needs[3]
        dres = ds_out if has_sum else None
        if dy is None:  # only the residual sum was used downstream
            if dres is None:
                return (None,) * 11
            ds, dx, dw, db = _zero_grads(dres, x_dtype, w, b, want_w, want_b)
        elif differentiable_backward(dy, dres):  # create_graph=True or tangents: torch ops, themselves differentiable
            ds, dx, dw, db = formulas.backward(dy, dres, saved, w, b, kind, ndim, eps, off, x_dtype,
                                               (True, want_w, want_b))
        else:  # the operator, or (eager, nothing tracing) the forward's implementation without the dispatcher
            eager = ctx.direct is not None and type(dy) is torch.Tensor and not _dispatch_depth()
            bwd = ctx.direct if eager else _add_norm_backward
            ds, dx, dw, db = bwd(dy, dres, saved, stats, w, b, kind, ndim, eps, off, x_dtype, [True, want_w, want_b])
            dx = dx if x_dtype != saved.dtype else None
            dw, db = (dw if want_w else None), (db if want_b else None)
        return (ds if dx is None else dx, ds if has_res else None, dw, db) + (None,) * 7

    @staticmethod
    def jvp(ctx, tx, tr, tw, tb, *_):
        kind, ndim, eps, off, cbw, out_dtype, _, has_sum, _ = ctx.meta
        saved, w = ctx.primals
        ty, ts = formulas.jvp(saved, w, kind, ndim, eps, off, cbw, out_dtype, tx, tr, tw, tb)
        return ty, (ts if has_sum else None), None


class DirectAddNorm(AddNorm):
    """``AddNorm`` for eager CPU calls off the fast path (several normalized dims, strided inputs, a float32
    stream beside 16-bit x, ``out_dtype``): the operator's CPU implementation called directly, both ways.
    Going through the dispatcher costs two Python kernel calls more (~64 us at 64 x 768,
    benchmarks/bench_overhead.py), which only tracing needs."""

    @staticmethod
    def forward(x, residual, weight, bias, kind, ndim, eps, weight_offset, cast_before_weight, out_dtype,
                residual_in_fp32):
        return forward_cpu(x, residual, weight, bias, kind, ndim, eps, weight_offset, cast_before_weight, out_dtype,
                           residual_in_fp32)

    @staticmethod
    def setup_context(ctx, inputs, output):
        AddNorm.setup_context(ctx, inputs, output)
        ctx.direct = backward_cpu


class TritonAddNorm(AddNorm):
    """``AddNorm`` on the Triton kernels called directly, both ways: eager calls on CUDA tensors, and
    ``backend="triton"`` on CPU tensors under Triton's interpreter (where the operator's CPU key would run
    the C kernels). Traced calls go through the operator, whose CUDA implementation is the same kernels."""

    @staticmethod
    def forward(x, residual, weight, bias, kind, ndim, eps, weight_offset, cast_before_weight, out_dtype,
                residual_in_fp32):
        return forward_triton(x, residual, weight, bias, kind, ndim, eps, weight_offset, cast_before_weight,
                              out_dtype, residual_in_fp32)

    @staticmethod
    def setup_context(ctx, inputs, output):
        AddNorm.setup_context(ctx, inputs, output)
        ctx.direct = backward_triton


class EagerAddNorm(torch.autograd.Function):
    """The eager fast path's autograd node: plain contiguous CPU tensors of one dtype, one normalized dim,
    no transform active (the caller checks). The same math as ``AddNorm`` -- the CPU kernels both ways,
    the formulas under create_graph, the same jvp -- with less per call: two outputs, the host calls
    made directly, and the kernels' view of the parameters worked out once in forward. At 64 x 768 each
    microsecond here is a visible part of a training step.
    """

    @staticmethod
    def forward(ctx, x, residual, weight, bias, kind, eps, weight_offset, cast_before_weight):
        ctx.set_materialize_grads(False)  # an unused output's gradient stays None, not a tensor of zeros
        D = x.shape[-1]
        N = x.numel() // D
        stats = torch.empty(2 if kind == "layer" else 1, N, device="cpu", dtype=torch.float32)
        out = _cpu.empty_rows_like(x)
        s = None if residual is None else _cpu.empty_rows_like(x)
        p = _cpu.forward(kind, x, residual, weight, bias, eps, weight_offset, cast_before_weight, out, s, stats, N,
                         D, True)
        saved = x if s is None else s
        ctx.save_for_backward(saved, stats, weight, bias)
        ctx.w_read = p[0]  # the weight as the kernels read it (itself, or a float32 copy)
        if _fwad._current_level >= 0:
            ctx.primals = (primal(saved), primal(weight))
        ctx.meta = (kind, N, D, eps, weight_offset, cast_before_weight, residual is not None, p[2],
                    _cpu.spec(weight, p[0]), _cpu.spec(bias, p[1]))
        return out, s

    @staticmethod
    def backward(ctx, dy, dres):
        kind, N, D, eps, off, _, has_res, pcode, wspec, bspec = ctx.meta
        saved, stats, w, b = ctx.saved_tensors
        needs = ctx.needs_input_grad
        want_w, want_b = w is not None and needs[2], b is not None and needs[3]
        if dy is None:
            if dres is None:
                return (None,) * 8
            ds, _, dw, db = _zero_grads(dres, saved.dtype, w, b, want_w, want_b)
        elif differentiable_backward(dy, dres):  # create_graph=True or tangents: torch ops, themselves differentiable
            ds, _, dw, db = formulas.backward(dy, dres, saved, w, b, kind, 1, eps, off, saved.dtype,
                                              (True, want_w, want_b))
        elif type(dy) is torch.Tensor and not _dispatch_depth():  # a traced backward sees fake tensors or a mode
            ds = _cpu.empty_rows_like(dy)
            contiguous = dy.is_contiguous() and (dres is None or dres.is_contiguous())
            if not contiguous:
                dy, dres = _cpu.as_rows(dy, D), None if dres is None else _cpu.as_rows(dres, D)
            dw, db = _cpu.backward(kind, dy, saved, stats, ctx.w_read, pcode, off, dres, ds, want_w, want_b, N, D,
                                   contiguous)
            dw, db = _cpu.like(dw, wspec), _cpu.like(db, bspec)
        else:  # a backward traced by something (compiled autograd, a dispatch mode): the operator
            ds, _, dw, db = _add_norm_backward(dy, dres, saved, stats, w, b, kind, 1, eps, off, saved.dtype,
                                               [True, want_w, want_b])
            dw, db = (dw if want_w else None), (db if want_b else None)
        return ds, ds if has_res else None, dw, db, None, None, None, None

    @staticmethod
    def jvp(ctx, tx, tr, tw, tb, *_):
        kind, _, _, eps, off, cbw, has_res = ctx.meta[:7]
        saved, w = ctx.primals
        ty, ts = formulas.jvp(saved, w, kind, 1, eps, off, cbw, saved.dtype, tx, tr, tw, tb)
        return ty, (ts if has_res else None)


def _autograd_kernel(x, residual, weight, bias, kind, ndim, eps, weight_offset, cast_before_weight, out_dtype,
                     residual_in_fp32):
    return AddNorm.apply(x, residual, weight, bias, kind, ndim, eps, weight_offset, cast_before_weight, out_dtype,
                         residual_in_fp32)


LIB.impl("add_norm", _autograd_kernel, "Autograd")
