"""The fused forms beyond Add & Norm, as functions: validation and the one backend decision, as
``functional.norm`` does for Add & Norm (both through ``functional.core``).

    layer_norm_add(x, residual, normalized_shape, weight, bias, eps)          -> residual + layer_norm(x)
    rms_norm_add(x, residual, normalized_shape, weight, eps)                  -> residual + rms_norm(x)
    parallel_add_layer_norm(x, x2, residual, normalized_shape, weight, bias, weight2, bias2, eps)
                                                                              -> (y, y2 or None, s)
    parallel_add_rms_norm(x, x2, residual, normalized_shape, weight, weight2, eps) -> (y, y2 or None, s)

Norm-then-add is the post-branch norm of OLMo 2 and the output norm of sandwich / Peri-LN: the branch
output x is normalized, then added to the stream. The parallel residual is GPT-J's, GPT-NeoX's,
Falcon's: ``s = residual + x + x2`` (attention and MLP outputs), then one norm of s (``y``) or two with
their own parameters (``y2``, when ``weight2`` or ``bias2`` is given: GPT-NeoX's ln_1 and ln_2 of the
next block). ``branches_first=True`` rounds as eager ``x + x2 + residual`` does (the branches summed
first: GPT-J, GPT-NeoX, Falcon, Phi); ``False`` as ``residual + x + x2`` (Cohere).

Every result rounds where the eager composite rounds (the stream s to its dtype, the norm's output to its
own before norm-then-add's add), with float32 statistics. It is not eager's to the bit: the row sums run in
another order, so float32 results agree with eager (and with the "torch" backend) to a few ulp, and a 16-bit
result may differ from eager's by one rounding step. One pass forward and one backward on the "cpu" and
"triton" backends.
"""

from __future__ import annotations

import torch
import torch.autograd.forward_ad as _fwad

from ..kernels.cpu import fused as _cpu
from ..ops import plain
from ..ops.fused import formulas as fused_formulas
from ..ops.fused.autograd import (DirectNormAdd, DirectParallelAddNorm, EagerNormAdd, EagerParallelAddNorm,
                                  TritonNormAdd, TritonParallelAddNorm)
from ..ops.fused.schema import norm_add_cpu, norm_add_triton, parallel_cpu, parallel_triton
from ..ops.last import LAST
from ..ops.native_nodes import KIND as _KIND
from ..ops.native_nodes import MAX_NUMEL as _NODES_MAX
from ..ops.native_nodes import NODES as _NODES
from ..ops.norm.autograd import c_apply as _c_apply
from . import core

__all__ = ["layer_norm_add", "rms_norm_add", "parallel_add_layer_norm", "parallel_add_rms_norm"]


_APPLY = {("norm_add", "cpu"): _c_apply(DirectNormAdd), ("norm_add", "triton"): _c_apply(TritonNormAdd),
          ("parallel", "cpu"): _c_apply(DirectParallelAddNorm),
          ("parallel", "triton"): _c_apply(TritonParallelAddNorm)}
_EAGER_NORM_ADD = _c_apply(EagerNormAdd)
_EAGER_PARALLEL = _c_apply(EagerParallelAddNorm)
_INFER = {("norm_add", "cpu"): norm_add_cpu, ("norm_add", "triton"): norm_add_triton,
          ("parallel", "cpu"): parallel_cpu, ("parallel", "triton"): parallel_triton}


def _same(name: str, t, x: torch.Tensor, what: str) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.shape != x.shape:
        raise ValueError(f"{name} must have {what}'s shape {tuple(x.shape)}, got {tuple(t.shape)}")
    if not (t.is_cpu and x.is_cpu) and t.device != x.device:
        raise ValueError(f"{name} is on {t.device} but {what} is on {x.device}")


def _common(x, residual, shape, params, eps, weight_offset, kind):
    """Validate what every fused form takes; returns (shape, eps, weight_offset)."""
    shape = core.check_normalized_shape(shape)
    core.check_input("x", x, shape)
    if residual is None:
        raise TypeError("residual must be a torch.Tensor, got None (these forms add to an existing stream)")
    core.check_residual(x, residual)
    for name, p in params:
        core.check_param(name, p, shape, x)
    if eps is None and kind == "rms":
        eps = core.default_rms_eps(x)
    eps = core.check_eps(eps)
    weight_offset = core.finite_real("weight_offset", weight_offset)
    if not torch.compiler.is_compiling() and not core.functorch_active():
        for name, t in (("x", x), ("residual", residual), *params):
            core.check_storage(name, t)
    return shape, eps, weight_offset


def _norm_add(kind, x, residual, shape, weight, bias, eps, weight_offset, cast_before_weight, backend):
    if type(cast_before_weight) is not bool:
        cast_before_weight = core.check_flag("cast_before_weight", cast_before_weight)
    if eps is None and kind == "rms" and isinstance(x, torch.Tensor):
        eps = core.default_rms_eps(x)
    if _NODES is not None and type(cast_before_weight) is bool and core.cpp_fast_ok(backend):  # checks and call in C++
        LAST["backend"] = "cpu"  # (where it declines, the path below says which backend ran)
        out = _NODES.fast_norm_add(x, residual, shape, weight, bias, eps, weight_offset, _KIND[kind],
                                   cast_before_weight)
        if out is not None:
            return out
    x, residual = core.uninferred((x, residual), (weight, bias))  # past the C++ entry, which declines such a call
    if residual is not None and core.fast_path_ok(x, residual, shape, weight, bias, eps, weight_offset, backend):
        LAST["backend"] = "cpu"
        if not core.any_needs_autograd(x, residual, weight, bias):
            if _NODES is not None and x.numel() < _NODES_MAX:
                return _NODES.norm_add_inference(x, residual, weight, bias, _KIND[kind], eps, float(weight_offset),
                                                 bool(cast_before_weight))
            return _cpu.norm_add_contiguous(x, residual, weight, bias, kind, eps, float(weight_offset),
                                            bool(cast_before_weight), False)[0]
        if _NODES is not None and _fwad._current_level < 0 and x.numel() < _NODES_MAX:  # the C++ node
            return _NODES.norm_add(x, residual, weight, bias, _KIND[kind], eps, float(weight_offset),
                                   bool(cast_before_weight))
        return _EAGER_NORM_ADD(x, residual, weight, bias, kind, eps, float(weight_offset), bool(cast_before_weight))
    shape, eps, weight_offset = _common(x, residual, shape, (("weight", weight), ("bias", bias)), eps, weight_offset,
                                        kind)
    which = core.resolve(backend, x, shape, None)
    LAST["backend"] = which
    args = (x, residual, weight, bias, kind, len(shape), eps, weight_offset, bool(cast_before_weight))
    if which == "torch":
        return fused_formulas.norm_add(*args)[0]
    if plain(x) and not core.functorch_active():
        if core.any_needs_autograd(x, residual, weight, bias):
            return _APPLY["norm_add", which](*args)[0]
        with torch.no_grad():
            return _INFER["norm_add", which](*args)[0]
    return torch.ops.addnorm.norm_add(*args)[0]


def layer_norm_add(x, residual, normalized_shape, weight=None, bias=None, eps: float = 1e-5, *,
                   weight_offset: float = 0.0, backend: str | None = None):
    """Norm-then-add: ``residual + layer_norm(x)``; the norm's output rounded to x's dtype before the add,
    the result in ``promote(x, residual)``, as eager code computes it."""
    return _norm_add("layer", x, residual, normalized_shape, weight, bias, eps, weight_offset, False, backend)


def rms_norm_add(x, residual, normalized_shape, weight=None, eps: float | None = None, *, weight_offset: float = 0.0,
                 cast_before_weight: bool = False, backend: str | None = None):
    """Norm-then-add: ``residual + rms_norm(x)`` (options as ``addnorm.rms_norm``)."""
    return _norm_add("rms", x, residual, normalized_shape, weight, None, eps, weight_offset, cast_before_weight,
                     backend)


def _parallel(kind, x, x2, residual, shape, weight, bias, weight2, bias2, eps, weight_offset, cast_before_weight,
              branches_first, backend):
    if type(cast_before_weight) is not bool:
        cast_before_weight = core.check_flag("cast_before_weight", cast_before_weight)
    if eps is None and kind == "rms" and isinstance(x, torch.Tensor):
        eps = core.default_rms_eps(x)
    if _NODES is not None and type(cast_before_weight) is bool and core.cpp_fast_ok(backend):  # checks and call in C++
        LAST["backend"] = "cpu"  # (where it declines, the path below says which backend ran)
        out = _NODES.fast_parallel(x, x2, residual, shape, weight, bias, weight2, bias2, eps, weight_offset,
                                   _KIND[kind], cast_before_weight, branches_first)
        if out is not None:
            return out
    x, x2, residual = core.uninferred((x, x2, residual), (weight, bias, weight2, bias2))  # past the C++ entry
    # residual=None passes _fast_path_ok (Add & Norm takes it) but not here: it must reach _common's TypeError
    if (type(branches_first) is bool and residual is not None
            and core.fast_path_ok(x, residual, shape, weight, bias, eps, weight_offset, backend)
            and core.fast_path_ok(x, x2, shape, weight2, bias2, eps, weight_offset, backend)
            and x.dim() > 0):
        LAST["backend"] = "cpu"
        if core.any_needs_autograd(x, x2, residual, weight, bias, weight2, bias2):
            if _NODES is not None and _fwad._current_level < 0 and x.numel() < _NODES_MAX:  # the C++ node
                return _NODES.parallel(x, x2, residual, weight, bias, weight2, bias2, _KIND[kind], eps,
                                       float(weight_offset), bool(cast_before_weight), branches_first)
            y, y2, s = _EAGER_PARALLEL(x, x2, residual, weight, bias, weight2, bias2, kind, eps, float(weight_offset),
                                       bool(cast_before_weight), branches_first)
            return y, (y2 if weight2 is not None or bias2 is not None else None), s
        if _NODES is not None and x.numel() < _NODES_MAX:
            return _NODES.parallel_inference(x, x2, residual, weight, bias, weight2, bias2, _KIND[kind], eps,
                                             float(weight_offset), bool(cast_before_weight), branches_first)
        y, y2, s, _ = _cpu.parallel_contiguous(x, x2, residual, weight, bias, weight2, bias2, kind, eps,
                                               float(weight_offset), bool(cast_before_weight), branches_first, False)
        return y, y2, s
    # x first (x2 is checked against it), so a non-tensor x is named rather than failing on x.shape
    shape, eps, weight_offset = _common(
        x, residual, shape, (("weight", weight), ("bias", bias), ("weight2", weight2), ("bias2", bias2)), eps,
        weight_offset, kind)
    if x2 is not None:
        _same("x2", x2, x, "x")
        if x2.dtype != x.dtype:
            raise TypeError(f"x2 dtype {x2.dtype} must equal x dtype {x.dtype} (the two branch outputs)")
    if not isinstance(branches_first, bool):
        raise TypeError(f"branches_first must be a bool, got {type(branches_first).__name__}")
    if x2 is not None and not torch.compiler.is_compiling() and not core.functorch_active():
        core.check_storage("x2", x2)
    two = weight2 is not None or bias2 is not None
    which = core.resolve(backend, x, shape, None)
    LAST["backend"] = which
    args = (x, x2, residual, weight, bias, weight2, bias2, kind, len(shape), eps, weight_offset,
            bool(cast_before_weight), two, branches_first)
    if which == "torch":
        y, y2, s, _ = fused_formulas.parallel_add_norm(*args)
    elif plain(x) and not core.functorch_active():
        if core.any_needs_autograd(x, x2, residual, weight, bias, weight2, bias2):
            y, y2, s, _ = _APPLY["parallel", which](*args)
        else:
            with torch.no_grad():
                y, y2, s, _ = _INFER["parallel", which](*args)
    else:
        y, y2, s, _ = torch.ops.addnorm.parallel_add_norm(*args)
    return y, (y2 if two else None), s


def parallel_add_layer_norm(x, x2, residual, normalized_shape, weight=None, bias=None, weight2=None, bias2=None,
                            eps: float = 1e-5, *, weight_offset: float = 0.0, branches_first: bool = True,
                            backend: str | None = None):
    """The parallel residual: ``s = residual + x + x2``; returns ``(layer_norm(s), layer_norm2(s) or None, s)``.

    ``x2=None`` adds one branch. The second output exists when ``weight2`` or ``bias2`` is given; both norms
    share eps and the statistics of s. The stream ``s`` is in residual's dtype (float32 beside 16-bit
    branches keeps a float32 stream), the normed outputs in x's.
    """
    return _parallel("layer", x, x2, residual, normalized_shape, weight, bias, weight2, bias2, eps, weight_offset,
                     False, branches_first, backend)


def parallel_add_rms_norm(x, x2, residual, normalized_shape, weight=None, weight2=None, eps: float | None = None, *,
                          weight_offset: float = 0.0, cast_before_weight: bool = False, branches_first: bool = True,
                          backend: str | None = None):
    """The parallel residual with RMSNorm: ``(rms_norm(s), rms_norm2(s) or None, s)`` (see
    ``parallel_add_layer_norm``; the second output exists when ``weight2`` is given)."""
    return _parallel("rms", x, x2, residual, normalized_shape, weight, None, weight2, None, eps, weight_offset,
                     cast_before_weight, branches_first, backend)
