"""addnorm's functional API: one place that validates input and decides which backend runs.

    layer_norm(x, normalized_shape, weight, bias, eps)              -> y
    rms_norm(x, normalized_shape, weight, eps)                      -> y
    add_layer_norm(x, residual, normalized_shape, weight, bias, eps) -> (y, residual_sum)
    add_rms_norm(x, residual, normalized_shape, weight, eps)         -> (y, residual_sum)

The ``add_*`` forms are the fused "Add & Norm": ``s = x + residual; y = norm(s)``, returning the
new residual stream ``s`` beside ``y`` (that is their whole point, so there is no flag for it; in
particular nothing here is called "prenorm" -- placement lives in ``addnorm.placement``).

Backends (chosen explicitly, never by environment at import time):
    "cpu"   -- the fused C kernels (float32/bfloat16/float16 on the CPU), one pass each way
    "torch" -- exact composite of torch ops (any dtype/device, double-differentiable)
    "auto"  -- "cpu" where it applies, else "torch"  (the default)
Set it per call (``backend=``) or for a region (``with addnorm.use_backend("torch"): ...``);
``last_backend()`` says which one ran most recently.

HuggingFace conventions:
    weight_offset=1.0       -- zero-centred weight, scale is ``1 + w`` (Gemma)
    cast_before_weight=True -- Llama's order: normalize in float32, cast to the input dtype, then
                               multiply by the weight (default: multiply in float32, cast once)
"""

from __future__ import annotations

import contextlib
import contextvars
import math
import numbers
from collections.abc import Sequence

import torch

from .kernels import torch_ref
from .kernels.cpu import SUPPORTED_DTYPES as _CPU_DTYPES
from .kernels.cpu import availability
from .kernels.cpu import ops as _cpu_ops

__all__ = [
    "layer_norm",
    "rms_norm",
    "add_layer_norm",
    "add_rms_norm",
    "tutorial_layer_norm",
    "use_backend",
    "last_backend",
    "BACKENDS",
]

BACKENDS = ("auto", "cpu", "torch")
FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
_backend: contextvars.ContextVar[str] = contextvars.ContextVar("addnorm_backend", default="auto")
_last = {"backend": None}


@contextlib.contextmanager
def use_backend(name: str):
    """Run the enclosed addnorm calls on backend ``name`` ("auto", "cpu" or "torch")."""
    _check_backend_name(name)
    token = _backend.set(name)
    try:
        yield
    finally:
        _backend.reset(token)


def last_backend() -> str | None:
    """The backend ("cpu" or "torch") that ran the most recent addnorm call in this process."""
    return _last["backend"]


def _check_backend_name(name) -> None:
    if name not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {name!r}")


# ---------------------------------------------------------------- validation


def _normalized_shape(normalized_shape) -> tuple[int, ...]:
    if isinstance(normalized_shape, numbers.Integral):
        normalized_shape = (int(normalized_shape),)
    elif isinstance(normalized_shape, torch.Size | Sequence) and not isinstance(normalized_shape, str | bytes):
        normalized_shape = tuple(int(s) for s in normalized_shape)
    else:
        raise TypeError(f"normalized_shape must be an int or a tuple of ints, got {type(normalized_shape).__name__}")
    if len(normalized_shape) == 0:
        raise ValueError("normalized_shape must have at least one dimension, got ()")
    if any(s < 0 for s in normalized_shape):
        raise ValueError(f"normalized_shape must be non-negative, got {normalized_shape}")
    return normalized_shape


def _check_input(name: str, t, shape: tuple[int, ...]) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in FLOAT_DTYPES:
        raise TypeError(f"{name} must be a floating-point tensor (float16, bfloat16, float32, float64), got {t.dtype}")
    n = len(shape)
    if t.dim() < n or tuple(t.shape[t.dim() - n:]) != shape:
        raise ValueError(
            f"{name} of shape {tuple(t.shape)} does not end in normalized_shape {shape}; "
            f"the last {n} dim(s) of {name} are the ones normalized"
        )


def _check_param(name: str, p, shape: tuple[int, ...], x: torch.Tensor) -> None:
    if p is None:
        return
    if not isinstance(p, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor or None, got {type(p).__name__}")
    if p.dtype not in FLOAT_DTYPES:
        raise TypeError(f"{name} must be floating-point, got {p.dtype}")
    if tuple(p.shape) != shape:
        raise ValueError(f"{name} must have shape normalized_shape={shape}, got {tuple(p.shape)}")
    if not (p.is_cpu and x.is_cpu) and p.device != x.device:
        raise ValueError(f"{name} is on {p.device} but x is on {x.device}")


def _check_eps(eps) -> float:
    if type(eps) is float and 0.0 <= eps < math.inf:  # the common case, checked cheaply
        return eps
    if not isinstance(eps, numbers.Real) or isinstance(eps, bool):
        raise TypeError(f"eps must be a float, got {type(eps).__name__}")
    eps = float(eps)
    if not eps >= 0 or math.isinf(eps):  # also rejects NaN
        raise ValueError(f"eps must be a finite number >= 0, got {eps}")
    return eps


def _default_rms_eps(x: torch.Tensor) -> float:
    # torch.nn.functional.rms_norm's default: machine epsilon of the type statistics are computed in
    return torch.finfo(torch.float64 if x.dtype == torch.float64 else torch.float32).eps


def _check_residual(x: torch.Tensor, residual) -> None:
    if residual is None:
        return
    if not isinstance(residual, torch.Tensor):
        raise TypeError(f"residual must be a torch.Tensor or None, got {type(residual).__name__}")
    if residual.shape != x.shape:
        raise ValueError(f"residual must have x's shape {tuple(x.shape)}, got {tuple(residual.shape)}")
    if residual.dtype != x.dtype:
        raise TypeError(f"residual dtype {residual.dtype} must equal x dtype {x.dtype} (cast one of them first)")
    if not (residual.is_cpu and x.is_cpu) and residual.device != x.device:
        raise ValueError(f"residual is on {residual.device} but x is on {x.device}")


# ---------------------------------------------------------------- dispatch


def _resolve(backend: str | None, x: torch.Tensor, shape: tuple[int, ...], params: tuple) -> str:
    name = _backend.get() if backend is None else backend
    if name == "torch":
        return "torch"
    _check_backend_name(name)
    reason = None
    if not x.is_cpu:
        reason = f"x is on {x.device}"
    elif x.dtype not in _CPU_DTYPES:
        reason = f"x has dtype {x.dtype}"
    elif math.prod(shape) == 0:
        reason = "normalized_shape has no elements"
    elif torch.compiler.is_compiling():
        reason = "torch.compile is tracing"
    elif _functorch_active():
        reason = "a torch.func transform (vmap, grad, jacrev, ...) is active"
    elif not (av := availability()).available:
        reason = av.reason
    if reason is None:
        return "cpu"
    if name == "cpu":
        raise RuntimeError(f"backend='cpu' cannot run this call: {reason}; use backend='torch' or 'auto'")
    return "torch"


# torch.func transforms (vmap, grad, jvp, ...) wrap tensors the kernels cannot read; the torch backend
# composes with them
_functorch_active = torch._C._are_functorch_transforms_active


def _needs_grad(x, residual, weight, bias) -> bool:
    # written out, not any(...) over a generator: this runs on every fast-path call
    return torch.is_grad_enabled() and (x.requires_grad or (residual is not None and residual.requires_grad)
                                        or (weight is not None and weight.requires_grad)
                                        or (bias is not None and bias.requires_grad))


def _fast_path_ok(x, residual, D, weight, bias, eps, weight_offset, backend) -> bool:
    """The common call, validated with a handful of cheap checks: contiguous CPU tensors the kernels
    take, an int normalized size matching x, 1-D parameters, a plain float eps. Anything else takes the
    general path, which validates fully and decides. Same kernel, same results either way. (Written
    for speed: at 64 x 768 every check here costs a visible fraction of the kernel's own time.)"""
    if type(x) is not torch.Tensor or type(D) is not int or type(eps) is not float:
        return False
    dt = x.dtype
    if (dt not in _CPU_DTYPES or not x.is_cpu or not x.is_contiguous() or not x.dim() or x.shape[-1] != D
            or D <= 0 or not 0.0 <= eps < math.inf or type(weight_offset) not in (int, float)):
        return False
    if residual is not None and (type(residual) is not torch.Tensor or residual.dtype != dt or not residual.is_cpu
                                 or not residual.is_contiguous() or residual.shape != x.shape):
        return False
    for p in (weight, bias):
        if p is not None and (not isinstance(p, torch.Tensor) or p.dtype not in FLOAT_DTYPES or not p.is_cpu
                              or p.dim() != 1 or p.shape[0] != D):
            return False
    return ((backend or _backend.get()) in ("auto", "cpu") and not torch.compiler.is_compiling()
            and not _functorch_active() and availability().available)


def _norm(kind, x, residual, normalized_shape, weight, bias, eps, weight_offset, cast_before_weight,
          out, residual_out, backend):
    if out is None and residual_out is None:
        if eps is None and isinstance(x, torch.Tensor):
            eps = _default_rms_eps(x)
        if _fast_path_ok(x, residual, normalized_shape, weight, bias, eps, weight_offset, backend):
            _last["backend"] = "cpu"
            return _run_cpu(kind, x, residual, (normalized_shape,), weight, bias, eps, weight_offset,
                            cast_before_weight, None, None)
    shape = _normalized_shape(normalized_shape)
    _check_input("x", x, shape)
    _check_residual(x, residual)
    _check_param("weight", weight, shape, x)
    _check_param("bias", bias, shape, x)
    if eps is None:
        eps = _default_rms_eps(x)
    eps = _check_eps(eps)
    if not isinstance(weight_offset, int | float):
        raise TypeError(f"weight_offset must be a float, got {type(weight_offset).__name__}")
    if out is not None or residual_out is not None:
        if _needs_grad(x, residual, weight, bias):
            raise RuntimeError("out= and residual_out= do not support automatic differentiation "
                               "(an input requires grad); call under torch.no_grad() or drop out=")
        from .out_buffers import check_out_buffers

        check_out_buffers(x, residual, out, residual_out)
    which = _resolve(backend, x, shape, (weight, bias))
    _last["backend"] = which
    if which == "cpu":
        return _run_cpu(kind, x, residual, shape, weight, bias, eps, weight_offset, cast_before_weight, out, residual_out)
    s = torch_ref.add(x, residual)
    if kind == "layer":
        y = torch_ref.layer_norm(s, shape, weight, bias, eps, weight_offset)
    else:
        y = torch_ref.rms_norm(s, shape, weight, eps, weight_offset, cast_before_weight)
    if out is not None:
        out.copy_(y)
        y = out
    if residual is not None and residual_out is not None:
        residual_out.copy_(s)
        s = residual_out
    return y, (s if residual is not None else None)


def _run_cpu(kind, x, residual, shape, weight, bias, eps, weight_offset, cast_before_weight, out, residual_out):
    D = math.prod(shape)
    if _needs_grad(x, residual, weight, bias):  # callers have sent torch.func transforms to the torch backend
        return _cpu_ops.apply_fused(x, residual, weight, bias, kind, D, eps, float(weight_offset),
                                    bool(cast_before_weight))
    # inference: no autograd node, no saved statistics; outputs are contiguous whatever x's layout
    out_t = _cpu_ops.empty_rows_like(x) if out is None else out
    res_t = None
    if residual is not None:
        res_t = _cpu_ops.empty_rows_like(x) if residual_out is None else residual_out
    if not (x.is_contiguous() and (residual is None or residual.is_contiguous())):
        x, residual = _cpu_ops.as_rows(x, D), None if residual is None else _cpu_ops.as_rows(residual, D)
    o = out_t if out_t.is_contiguous() else out_t.view(-1, D)  # out_buffers checked it can be
    ro = res_t if res_t is None or res_t.is_contiguous() else res_t.view(-1, D)
    _cpu_ops.forward(kind, x, residual, weight, bias, eps, float(weight_offset), bool(cast_before_weight),
                     o, ro, None, x.numel() // D, D)
    return out_t, res_t


# ---------------------------------------------------------------- public functions


def layer_norm(x, normalized_shape, weight=None, bias=None, eps: float = 1e-5, *, weight_offset: float = 0.0,
               out=None, backend: str | None = None):
    """LayerNorm (Ba, Kiros & Hinton 2016): ``y = (x - E[x]) / sqrt(Var[x] + eps) * (weight + weight_offset) + bias``.

    Statistics over the last ``len(normalized_shape)`` dims, biased variance, in float32 (float64
    for float64 input); same signature and results as ``torch.nn.functional.layer_norm``.
    """
    y, _ = _norm("layer", x, None, normalized_shape, weight, bias, eps, weight_offset, False, out, None, backend)
    return y


def rms_norm(x, normalized_shape, weight=None, eps: float | None = None, *, weight_offset: float = 0.0,
             cast_before_weight: bool = False, out=None, backend: str | None = None):
    """RMSNorm (Zhang & Sennrich 2019): ``y = x / sqrt(mean(x²) + eps) * (weight + weight_offset)``.

    ``eps=None`` uses ``torch.finfo`` of the statistics dtype, as ``torch.nn.functional.rms_norm``.
    """
    y, _ = _norm("rms", x, None, normalized_shape, weight, None, eps, weight_offset, cast_before_weight, out, None, backend)
    return y


def add_layer_norm(x, residual, normalized_shape, weight=None, bias=None, eps: float = 1e-5, *,
                   weight_offset: float = 0.0, out=None, residual_out=None, backend: str | None = None):
    """Fused Add & Norm: ``s = x + residual; return (layer_norm(s), s)``.

    ``residual=None`` means no residual yet (the first block): returns ``(layer_norm(x), x)``.
    ``out=`` / ``residual_out=`` write into given buffers (inference only); see ``out_buffers`` for
    the aliasing rules (``residual_out=residual`` updates the stream in place, vLLM-style).
    """
    y, s = _norm("layer", x, residual, normalized_shape, weight, bias, eps, weight_offset, False, out, residual_out, backend)
    return y, (x if residual is None else s)


def add_rms_norm(x, residual, normalized_shape, weight=None, eps: float | None = None, *,
                 weight_offset: float = 0.0, cast_before_weight: bool = False, out=None, residual_out=None,
                 backend: str | None = None):
    """Fused Add & Norm with RMSNorm: ``s = x + residual; return (rms_norm(s), s)``."""
    y, s = _norm("rms", x, residual, normalized_shape, weight, None, eps, weight_offset, cast_before_weight, out,
                 residual_out, backend)
    return y, (x if residual is None else s)


def tutorial_layer_norm(x, weight=None, bias=None, eps: float = 1e-6):
    """The tutorial formulation of seed 000 -- *not* LayerNorm as PyTorch defines it.

    ``y = weight * (x - mean) / (std_unbiased + eps) + bias``: the std uses Bessel's correction
    (divides by D - 1) and eps is added *outside* the square root. Outputs are scaled by
    sqrt((D-1)/D) relative to ``torch.nn.LayerNorm`` and rows of tiny variance are not protected
    by eps the same way; ``docs/tutorial_pitfall.md`` gives the measured gap. Kept so the
    difference can be measured and so ``addnorm check`` can recognise it.
    """
    _check_input("x", x, tuple(x.shape[-1:]) if isinstance(x, torch.Tensor) and x.dim() else (1,))
    eps = _check_eps(eps)
    mean = x.mean(-1, keepdim=True)
    std = x.std(-1, keepdim=True)  # unbiased: divides by D - 1
    y = (x - mean) / (std + eps)
    if weight is not None:
        y = y * weight
    if bias is not None:
        y = y + bias
    return y
