"""Add & Norm and the plain norms as functions: validation (``core``) and the one backend decision, then the
operator (``torch.ops.addnorm.add_norm``) or, for the common eager call, its implementation without the
dispatcher's cost.

    layer_norm(x, normalized_shape, weight, bias, eps)              -> y
    rms_norm(x, normalized_shape, weight, eps)                      -> y
    add_layer_norm(x, residual, normalized_shape, weight, bias, eps) -> (y, residual_sum)
    add_rms_norm(x, residual, normalized_shape, weight, eps)         -> (y, residual_sum)
    tutorial_layer_norm(x, weight, bias, eps)                       -> y (seed 000's formula, not LayerNorm's)

The ``add_*`` forms are the fused "Add & Norm": ``s = x + residual; y = norm(s)``, returning the
new residual stream ``s`` beside ``y`` (that is their whole point, so there is no flag for it; in
particular nothing here is called "prenorm" -- placement lives in ``addnorm.model.placement``).
"""

from __future__ import annotations

import math

import torch
import torch.autograd.forward_ad as _fwad

from ..kernels import torch_ref
from ..kernels.cpu import norm as cpu
from ..kernels.rows import resolved
from ..kernels.triton import norm as _triton
from ..ops import DirectAddNorm, EagerAddNorm, TritonAddNorm, direct_forward, eager_inference, formulas, plain
from ..ops.last import LAST
from ..ops.native_nodes import KIND as _KIND
from ..ops.native_nodes import MAX_NUMEL as _NODES_MAX
from ..ops.native_nodes import NODES as _NODES
from .buffers import check_out_buffers, mark_written
from .core import (check_eps, check_flag, check_input, check_normalized_shape, check_out_dtype, check_param,
                   check_residual, check_storage, cpp_fast_ok, default_rms_eps, fast_path_ok, finite_real,
                   functorch_active, needs_autograd, resolve, uninferred)

__all__ = ["layer_norm", "rms_norm", "add_layer_norm", "add_rms_norm", "tutorial_layer_norm"]


def _norm(kind, x, residual, normalized_shape, weight, bias, eps, weight_offset, cast_before_weight, out,
          residual_out, backend, out_dtype=None, residual_in_fp32=False):
    if type(cast_before_weight) is not bool:
        cast_before_weight = check_flag("cast_before_weight", cast_before_weight)
    if out_dtype is not None and type(x) is torch.Tensor and out_dtype == x.dtype:
        out_dtype = None  # the same output (HF's patch asks for the input's dtype): the fast path may take it
    plain_call = out is None and residual_out is None and out_dtype is None and not residual_in_fp32
    if plain_call:
        if eps is None and kind == "rms" and isinstance(x, torch.Tensor):
            eps = default_rms_eps(x)
        if _NODES is not None and type(cast_before_weight) is bool and cpp_fast_ok(backend):  # checks and call in C++
            LAST["backend"] = "cpu"  # (where it declines, the general path below says which backend ran)
            r = _NODES.fast_add_norm(x, residual, normalized_shape, weight, bias, eps, weight_offset, _KIND[kind],
                                     cast_before_weight)
            if r is not None:
                return r
    x, residual = uninferred((x, residual), (weight, bias))  # past the C++ entry, which declines such a call
    if plain_call and fast_path_ok(x, residual, normalized_shape, weight, bias, eps, weight_offset, backend):
        LAST["backend"] = "cpu"
        if needs_autograd(x, residual, weight, bias):
            if _NODES is not None and _fwad._current_level < 0 and x.numel() < _NODES_MAX:  # the C++ node
                return _NODES.add_norm(x, residual, weight, bias, _KIND[kind], eps, float(weight_offset),
                                       bool(cast_before_weight))
            return _C_APPLY(x, residual, weight, bias, kind, eps, float(weight_offset), bool(cast_before_weight))
        if _NODES is not None and x.numel() < _NODES_MAX:
            return _NODES.add_norm_inference(x, residual, weight, bias, _KIND[kind], eps, float(weight_offset),
                                             bool(cast_before_weight))
        return eager_inference(x, residual, weight, bias, kind, eps, float(weight_offset), bool(cast_before_weight))
    shape = check_normalized_shape(normalized_shape)
    if getattr(x, "is_nested", False):
        return _nested(kind, x, residual, shape, weight, bias, eps, weight_offset, cast_before_weight, out,
                       residual_out, backend, out_dtype, residual_in_fp32)
    check_input("x", x, shape)
    check_residual(x, residual)
    check_param("weight", weight, shape, x)
    check_param("bias", bias, shape, x)
    check_out_dtype(out_dtype)
    if not isinstance(residual_in_fp32, bool):
        raise TypeError(f"residual_in_fp32 must be a bool, got {type(residual_in_fp32).__name__}")
    if eps is None and kind == "rms":  # RMSNorm: torch's default; LayerNorm refuses None, as torch does
        eps = default_rms_eps(x)
    eps = check_eps(eps)
    weight_offset = finite_real("weight_offset", weight_offset)
    cast_before_weight = bool(cast_before_weight)
    if not torch.compiler.is_compiling() and not functorch_active():  # real tensors (else wrappers, no storage)
        for name, t in (("x", x), ("residual", residual), ("weight", weight), ("bias", bias), ("out", out),
                        ("residual_out", residual_out)):
            check_storage(name, t)
        # negative views resolved before the out= buffers are checked against them (the kernels resolve their
        # inputs again at their entry, which costs nothing once resolved)
        x, residual, weight, bias = resolved(x, residual, weight, bias)
    has_sum = formulas.returns_sum(x, residual, residual_in_fp32)
    if out is not None or residual_out is not None:
        # torch's rule for out= (an input or the buffer requiring grad, with grad mode on, is refused)
        if needs_autograd(x, residual, weight, bias) or (torch.is_grad_enabled() and any(
                t is not None and t.requires_grad for t in (out, residual_out))):
            raise RuntimeError("out= and residual_out= do not support automatic differentiation "
                               "(an input or an out= buffer requires grad); call under torch.no_grad() or drop "
                               "out=")
        check_out_buffers(x, residual, weight, bias, out, residual_out, math.prod(shape), out_dtype or x.dtype,
                          formulas.sum_dtype(x, residual, residual_in_fp32), has_sum)
    which = resolve(backend, x, shape, out_dtype)
    LAST["backend"] = which
    ndim = len(shape)
    if which == "torch":
        y, s = _torch_backend(kind, x, residual, shape, weight, bias, eps, weight_offset, cast_before_weight,
                              out_dtype, residual_in_fp32)
    elif plain(x) and not functorch_active() and out is None and residual_out is None:
        args = (x, residual, weight, bias, kind, ndim, eps, weight_offset, cast_before_weight, out_dtype,
                residual_in_fp32)
        if needs_autograd(x, residual, weight, bias):  # the operator's autograd node, without the dispatcher
            y, s, _ = (_C_APPLY_TRITON if which == "triton" else _C_APPLY_DIRECT)(*args)
            s = s if has_sum else None
        else:
            y, s = direct_forward(*args, triton=which == "triton")
    elif plain(x) and not functorch_active():
        return _into_buffers(kind, x, residual, shape, weight, bias, eps, weight_offset, cast_before_weight, out,
                             residual_out, out_dtype, residual_in_fp32, which)
    else:
        y, s, _ = torch.ops.addnorm.add_norm(x, residual, weight, bias, kind, ndim, eps, weight_offset,
                                             cast_before_weight, out_dtype, residual_in_fp32)
        s = s if has_sum else None
    if out is not None:
        out.copy_(y)
        y = out
    if s is not None and residual_out is not None:
        residual_out.copy_(s)
        s = residual_out
    return y, s


def _torch_backend(kind, x, residual, shape, weight, bias, eps, weight_offset, cast_before_weight, out_dtype,
                   residual_in_fp32):
    """Composite torch ops, differentiable to any order: PyTorch's own layer_norm in float32/float64, HF's
    RMSNorm formula; for 16-bit LayerNorm and mixed dtypes, ``ops.norm.formulas`` (float32 statistics, one
    rounding), which is exact where both torch paths are not: a constant row gives exactly the bias (torch's
    16-bit kernel: off by 6e-5) and normalized size 1 a weight gradient of exactly 0 (its float32 path:
    -2e-5)."""
    uniform = ((out_dtype is None or out_dtype == x.dtype) and (residual is None or residual.dtype == x.dtype)
               and not formulas.returns_sum(x, None, residual_in_fp32))
    s = torch_ref.add(x, residual) if uniform else None
    # PyTorch's own layer_norm and HF's RMSNorm overflow their float32 statistics on huge values: formulas then
    if uniform and (kind == "rms" or x.dtype in (torch.float32, torch.float64)) and not formulas.has_huge(s):
        if kind == "layer":
            y = torch_ref.layer_norm(s, shape, weight, bias, eps, weight_offset)
        else:
            y = torch_ref.rms_norm(s, shape, weight, eps, weight_offset, cast_before_weight)
        return y, (s if residual is not None else None)
    y, s, _ = formulas.forward(x, residual, weight, bias, kind, len(shape), eps, weight_offset, cast_before_weight,
                               out_dtype, residual_in_fp32)
    return y, (s if formulas.returns_sum(x, residual, residual_in_fp32) else None)


def _into_buffers(kind, x, residual, shape, weight, bias, eps, weight_offset, cast_before_weight, out, residual_out,
                  out_dtype, residual_in_fp32, which):
    """Inference into the caller's buffers (checked by ``buffers``): no allocation, no autograd node."""
    D = math.prod(shape)
    has_sum = formulas.returns_sum(x, residual, residual_in_fp32)
    odt = out_dtype or x.dtype
    out_t = out if out is not None else torch.empty(x.shape, dtype=odt, device=x.device)
    res_t = None
    if has_sum:
        res_t = residual_out if residual_out is not None else torch.empty(
            x.shape, dtype=formulas.sum_dtype(x, residual, residual_in_fp32), device=x.device)
    if which == "triton":
        _triton.add_norm(x, residual, weight, bias, kind, D, eps, weight_offset, cast_before_weight, odt,
                         None if res_t is None else res_t.dtype, False, out_t, res_t)
        mark_written(out, residual_out)
        return out_t, res_t
    if not (x.is_contiguous() and (residual is None or residual.is_contiguous())):
        x, residual = cpu.as_rows(x, D), None if residual is None else cpu.as_rows(residual, D)
    o = out_t if out_t.is_contiguous() else out_t.view(-1, D)  # buffers.check_out_buffers checked it can be
    ro = res_t if res_t is None or res_t.is_contiguous() else res_t.view(-1, D)
    cpu.forward(kind, x, residual, weight, bias, eps, weight_offset, cast_before_weight, o, ro, None,
                x.numel() // D, D)
    mark_written(out, residual_out)
    return out_t, res_t


def _nested(kind, x, residual, shape, weight, bias, eps, weight_offset, cast_before_weight, out, residual_out,
            backend, out_dtype, residual_in_fp32):
    """Nested jagged tensors, as F.layer_norm takes them: the normalized dims must be regular (after the
    ragged one); the norm runs on the packed values and the result keeps x's offsets."""
    if x.layout != torch.jagged:
        raise ValueError(f"x is a nested tensor with layout {x.layout}; addnorm takes nested tensors of layout "
                         "torch.jagged only")
    if out is not None or residual_out is not None:
        raise ValueError("out= and residual_out= are not supported for nested tensors")
    ragged = x._ragged_idx
    if len(shape) > x.dim() - 1 - ragged:
        raise ValueError(f"normalized_shape {shape} reaches the ragged dim {ragged} of x; only the regular "
                         "trailing dims of a nested tensor can be normalized")
    if residual is not None and not (getattr(residual, "is_nested", False) and residual.layout == torch.jagged
                                     and residual.offsets() is x.offsets()):
        raise ValueError("residual must be a nested jagged tensor with the same offsets as x")
    values = x.values()
    rv = None if residual is None else residual.values()
    y, s = _norm(kind, values, rv, shape, weight, bias, eps, weight_offset, cast_before_weight, None, None, backend,
                 out_dtype, residual_in_fp32)
    wrap = lambda v: torch.nested.nested_tensor_from_jagged(v, x.offsets(), lengths=x.lengths())  # noqa: E731
    return wrap(y), (None if s is None else wrap(s))


# EagerAddNorm.apply is a Python classmethod whose prologue -- functorch checks, unwrapping dead
# functorch wrappers over every argument -- costs ~2 us, 3 % of a whole 64 x 768 training step. The fast
# path, which has already sent functorch transforms elsewhere, calls the C-level apply the prologue
# ends in (plain tensors: nothing to unwrap).
# DirectAddNorm (setup_context style) is worse: its public apply binds every call's arguments through
# inspect.signature (~40 us at 64 x 768); all of them are passed positionally here, so there is nothing to bind.
try:
    _C_APPLY = torch._C._FunctionBase.__dict__["apply"].__get__(None, EagerAddNorm)
    _C_APPLY_DIRECT = torch._C._FunctionBase.__dict__["apply"].__get__(None, DirectAddNorm)
    _C_APPLY_TRITON = torch._C._FunctionBase.__dict__["apply"].__get__(None, TritonAddNorm)
except (AttributeError, KeyError):  # private entry point gone in some torch version: the public apply
    _C_APPLY, _C_APPLY_DIRECT, _C_APPLY_TRITON = EagerAddNorm.apply, DirectAddNorm.apply, TritonAddNorm.apply


# ---------------------------------------------------------------- public functions


def layer_norm(input, normalized_shape, weight=None, bias=None, eps: float = 1e-5, *, weight_offset: float = 0.0,
               out=None, out_dtype=None, backend: str | None = None):
    """LayerNorm (Ba, Kiros & Hinton 2016): ``y = (x - E[x]) / sqrt(Var[x] + eps) * (weight + weight_offset) + bias``.

    Statistics over the last ``len(normalized_shape)`` dims, biased variance, in float32 (float64
    for float64 input); same signature (``input`` first) and results as ``torch.nn.functional.layer_norm``.
    A bad shape raises ``ShapeError`` (a ValueError and torch's RuntimeError), a bad dtype ``DtypeError``.
    """
    y, _ = _norm("layer", input, None, normalized_shape, weight, bias, eps, weight_offset, False, out, None, backend,
                 out_dtype)
    return y


def rms_norm(input, normalized_shape, weight=None, eps: float | None = None, *, weight_offset: float = 0.0,
             cast_before_weight: bool = False, out=None, out_dtype=None, backend: str | None = None):
    """RMSNorm (Zhang & Sennrich 2019): ``y = x / sqrt(mean(x²) + eps) * (weight + weight_offset)``.

    ``eps=None`` uses ``torch.finfo`` of the statistics dtype, as ``torch.nn.functional.rms_norm``, whose
    signature (``input`` first) this has.
    """
    y, _ = _norm("rms", input, None, normalized_shape, weight, None, eps, weight_offset, cast_before_weight, out, None,
                 backend, out_dtype)
    return y


def add_layer_norm(x, residual, normalized_shape, weight=None, bias=None, eps: float = 1e-5, *,
                   weight_offset: float = 0.0, out=None, residual_out=None, out_dtype=None,
                   residual_in_fp32: bool = False, backend: str | None = None):
    """Fused Add & Norm: ``s = x + residual; return (layer_norm(s), s)``.

    ``residual=None`` means no residual yet (the first block): returns ``(layer_norm(x), x)``, or with
    ``residual_in_fp32=True`` and a 16-bit x, ``(layer_norm(x), x.float())``. A float32 residual beside a
    16-bit x keeps the stream in float32: ``s`` is float32, ``y`` in x's dtype (or ``out_dtype``).
    ``out=`` / ``residual_out=`` write into given buffers (inference only); see ``addnorm.functional.buffers`` for
    the aliasing rules (``residual_out=residual`` updates the stream in place, vLLM-style).
    """
    y, s = _norm("layer", x, residual, normalized_shape, weight, bias, eps, weight_offset, False, out, residual_out,
                 backend, out_dtype, residual_in_fp32)
    return y, (x if s is None else s)


def add_rms_norm(x, residual, normalized_shape, weight=None, eps: float | None = None, *,
                 weight_offset: float = 0.0, cast_before_weight: bool = False, out=None, residual_out=None,
                 out_dtype=None, residual_in_fp32: bool = False, backend: str | None = None):
    """Fused Add & Norm with RMSNorm: ``s = x + residual; return (rms_norm(s), s)`` (options as
    ``add_layer_norm``)."""
    y, s = _norm("rms", x, residual, normalized_shape, weight, None, eps, weight_offset, cast_before_weight, out,
                 residual_out, backend, out_dtype, residual_in_fp32)
    return y, (x if s is None else s)


def tutorial_layer_norm(x, weight=None, bias=None, eps: float = 1e-6):
    """The tutorial formulation of seed 000 -- *not* LayerNorm as PyTorch defines it.

    ``y = weight * (x - mean) / (std_unbiased + eps) + bias``: the std uses Bessel's correction
    (divides by D - 1) and eps is added *outside* the square root. Outputs are scaled by
    sqrt((D-1)/D) relative to ``torch.nn.LayerNorm`` and rows of tiny variance are not protected
    by eps the same way; ``docs/tutorial_pitfall.md`` gives the measured gap. Kept so the
    difference can be measured and so ``addnorm check`` can recognise it.
    """
    check_input("x", x, tuple(x.shape[-1:]) if isinstance(x, torch.Tensor) and x.dim() else (1,))
    eps = check_eps(eps)
    mean = x.mean(-1, keepdim=True)
    std = x.std(-1, keepdim=True)  # unbiased: divides by D - 1
    y = (x - mean) / (std + eps)
    if weight is not None:
        y = y * weight
    if bias is not None:
        y = y + bias
    return y
