"""DyT and Derf fused with the residual add, as functions (the ``nn.DyT`` / ``nn.Derf`` modules call these):

    add_dyt(x, residual, alpha, weight, bias)          -> (weight * tanh(alpha s) + bias, s),  s = x + residual
    add_derf(x, residual, alpha, shift, weight, bias)  -> (weight * erf(alpha s + shift) + bias, s)

``residual=None``: s is x. alpha and shift are numbers or one-element tensors (the learned scalars: a tensor
that requires grad gets its gradient); weight and bias have the shape of x's trailing dims. One pass forward,
one backward on the "cpu" and "triton" backends.
"""

from __future__ import annotations

import torch
import torch.autograd.forward_ad as _fwad

from ..ops import plain
from ..ops.last import LAST
from ..ops.native_nodes import NODES as _NODES
from ..ops.norm.autograd import c_apply as _c_apply
from ..ops.pointwise import formulas as pf
from ..ops.pointwise.autograd import DirectPointwiseNorm, TritonPointwiseNorm
from ..ops.pointwise.schema import CPU, TRITON
from . import core

__all__ = ["add_dyt", "add_derf"]


_PW_KIND = {"dyt": 0, "derf": 1}  # kernels.cpu.pointwise.KINDS
_APPLY = {"cpu": _c_apply(DirectPointwiseNorm), "triton": _c_apply(TritonPointwiseNorm)}
_INFER = {"cpu": CPU[0], "triton": TRITON[0]}


def _scalar(name, t, x):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a number or a one-element torch.Tensor (a learned scalar), got "
                        f"{type(t).__name__}")
    if t.numel() != 1 or not t.dtype.is_floating_point:
        raise ValueError(f"{name} must be a one-element floating-point tensor, got shape {tuple(t.shape)} {t.dtype}")
    if not (t.is_cpu and x.is_cpu) and t.device != x.device:
        raise ValueError(f"{name} is on {t.device} but x is on {x.device}")


def _param_shape(x, weight, bias) -> tuple[int, ...]:
    """The trailing dims of x that weight and bias cover (x's last dim when neither is given). A weight or
    bias whose shape is not a trailing part of x's is refused by its own name: there is no normalized_shape
    argument here, the parameters' shapes are the claim."""
    if not isinstance(x, torch.Tensor) or not x.dim():
        return (1,)  # _check_input refuses x by name
    given = [(name, p) for name, p in (("weight", weight), ("bias", bias)) if isinstance(p, torch.Tensor)]
    for name, p in given:
        s = tuple(p.shape)
        if p.dim() > x.dim() or tuple(x.shape[x.dim() - p.dim():]) != s:
            raise ValueError(f"{name} of shape {s} must equal the trailing dims of x's shape {tuple(x.shape)} "
                             f"(one value per element of x's last dims)")
    if len(given) == 2 and given[0][1].shape != given[1][1].shape:
        raise ValueError(f"bias must have weight's shape {tuple(weight.shape)}, got {tuple(bias.shape)}")
    return tuple(given[0][1].shape) if given else (tuple(x.shape[-1:]) if x.dim() else (1,))


_SCALARS = frozenset((torch.Tensor, torch.nn.Parameter))


def _fast(x, residual, alpha, shift, weight, bias, backend) -> bool:
    """The common call, checked cheaply (Add & Norm's fast-path rules, plus plain one-element CPU scalars);
    anything else is validated in full. Same kernel either way."""
    # (a freed scalar -- FSDP frees Parameters' storage -- has a null data pointer: the general path names it;
    # asked last, after _fast_path_ok has refused compiled code, which cannot read pointers)
    return (type(alpha) in _SCALARS and alpha.numel() == 1 and alpha.is_cpu and alpha.dtype.is_floating_point
            and (shift is None or (type(shift) in _SCALARS and shift.numel() == 1 and shift.is_cpu
                                   and shift.dtype.is_floating_point))
            and isinstance(x, torch.Tensor) and x.dim() > 0
            and core.fast_path_ok(x, residual, x.shape[-1], weight, bias, 0.0, 0.0, backend)
            and alpha.data_ptr() != 0 and (shift is None or shift.data_ptr() != 0))


def _pointwise(kind, x, residual, alpha, shift, weight, bias, backend):
    if _NODES is not None and core.cpp_fast_ok(backend):  # the checks and the call (or the C++ node) in one C++ call
        LAST["backend"] = "cpu"  # (where it declines, the path below says which backend ran)
        out = _NODES.fast_pointwise(x, residual, alpha, shift, weight, bias, _PW_KIND[kind])
        if out is not None:
            return out
    x, residual = core.uninferred((x, residual), (alpha, shift, weight, bias))  # past the C++ entry, which declines
    if _fast(x, residual, alpha, shift, weight, bias, backend):
        LAST["backend"] = "cpu"
        args = (x, residual, alpha, shift, weight, bias, kind)
        needs = _fwad._current_level >= 0 or (torch.is_grad_enabled() and (
            x.requires_grad or alpha.requires_grad or (residual is not None and residual.requires_grad)
            or (shift is not None and shift.requires_grad) or (weight is not None and weight.requires_grad)
            or (bias is not None and bias.requires_grad)))
        y, s = _APPLY["cpu"](*args) if needs else _INFER["cpu"](*args)
        return y, (x if residual is None else s)
    shape = _param_shape(x, weight, bias)
    core.check_input("x", x, shape)
    core.check_residual(x, residual)
    core.check_param("weight", weight, shape, x)
    core.check_param("bias", bias, shape, x)
    _scalar("alpha", alpha, x)
    if shift is not None:
        _scalar("shift", shift, x)
    if not torch.compiler.is_compiling() and not core.functorch_active():
        for name, t in (("x", x), ("residual", residual), ("weight", weight), ("bias", bias), ("alpha", alpha),
                        ("shift", shift)):
            core.check_storage(name, t)
    which = core.resolve(backend, x, shape, None)
    LAST["backend"] = which
    args = (x, residual, alpha, shift, weight, bias, kind)
    if which == "torch":
        return pf.forward(*args)
    if plain(x) and not core.functorch_active():
        needs = _fwad._current_level >= 0 or (torch.is_grad_enabled() and any(
            t is not None and t.requires_grad for t in (x, residual, alpha, shift, weight, bias)))
        y, s = _APPLY[which](*args) if needs else _INFER[which](*args)
    else:
        y, s = torch.ops.addnorm.add_pointwise_norm(*args)
    return y, (x if residual is None else s)


def _number(t, x):
    """A Python number as the one-element tensor the kernels take (float32, float64 for a float64 x, as a learned
    scalar would be); a tensor as given (a bool is neither: refused by name further on)."""
    if isinstance(t, int | float) and not isinstance(t, bool) and isinstance(x, torch.Tensor):
        return torch.tensor(t, dtype=torch.float64 if x.dtype == torch.float64 else torch.float32, device=x.device)
    return t


def add_dyt(x, residual, alpha, weight=None, bias=None, *, backend: str | None = None):
    """DyT (arXiv 2503.10622) of s = x + residual: ``(weight * tanh(alpha * s) + bias, s)``. ``alpha``: a number
    (``0.5``) or a one-element tensor (``nn.DyT``'s learned ``alpha``, which then gets its gradient)."""
    return _pointwise("dyt", x, residual, _number(alpha, x), None, weight, bias, backend)


def add_derf(x, residual, alpha, shift, weight=None, bias=None, *, backend: str | None = None):
    """Derf (arXiv 2512.10938) of s = x + residual: ``(weight * erf(alpha * s + shift) + bias, s)``;
    ``shift=None`` is no shift (``erf(alpha * s)``), on every backend. ``alpha`` and ``shift``: numbers or
    one-element tensors (``nn.Derf``'s learned scalars, which then get their gradients)."""
    return _pointwise("derf", x, residual, _number(alpha, x), _number(shift, x), weight, bias, backend)
