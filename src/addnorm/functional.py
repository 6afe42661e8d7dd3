"""addnorm's functional API: one place that validates input and decides which backend runs.

    layer_norm(x, normalized_shape, weight, bias, eps)              -> y
    rms_norm(x, normalized_shape, weight, eps)                      -> y
    add_layer_norm(x, residual, normalized_shape, weight, bias, eps) -> (y, residual_sum)
    add_rms_norm(x, residual, normalized_shape, weight, eps)         -> (y, residual_sum)

The ``add_*`` forms are the fused "Add & Norm": ``s = x + residual; y = norm(s)``, returning the
new residual stream ``s`` beside ``y`` (that is their whole point, so there is no flag for it; in
particular nothing here is called "prenorm" -- placement lives in ``addnorm.placement``).

Backends (chosen explicitly, never by environment at import time):
    "cpu"    -- the fused C kernels (float32/bfloat16/float16 on the CPU), one pass each way
    "triton" -- the fused Triton kernels (float32/bfloat16/float16 on CUDA; the optional extra
                ``addnorm[gpu]``); on CPU tensors too when TRITON_INTERPRET=1 is set (Triton's
                interpreter: slow, for testing)
    "torch"  -- exact composite of torch ops (any dtype/device, double-differentiable)
    "auto"   -- "cpu" on CPU tensors and "triton" on CUDA ones where they apply, else "torch" (the default)
Set it per call (``backend=``) or for a region (``with addnorm.use_backend("torch"): ...``);
``last_backend()`` says which one ran most recently.

HuggingFace conventions:
    weight_offset=1.0       -- zero-centred weight, scale is ``1 + w`` (Gemma)
    cast_before_weight=True -- Llama's order: normalize in float32, cast to the input dtype, then
                               multiply by the weight (default: multiply in float32, cast once)

Mixed precision (flash-attention's ``residual_in_fp32``): the residual may be float32 beside a
float16/bfloat16 x; the sum is formed and returned in the residual's dtype, the normed output in x's
dtype or ``out_dtype``. ``residual_in_fp32=True`` starts such a stream where there is no residual yet.

Every call goes through addnorm's PyTorch operators (``torch.ops.addnorm.add_norm``, see
``addnorm.ops``) -- under torch.compile, torch.export, make_fx, jit.trace, FakeTensorMode -- except
the eager fast path, which calls the same CPU implementation without the dispatcher's cost.
"""

from __future__ import annotations

import contextlib
import math
import numbers
import operator
import threading
from collections.abc import Sequence

import torch
import torch.autograd.forward_ad as _fwad

from .kernels import torch_ref
from .kernels.rows import resolved
from .kernels.cpu import SUPPORTED_DTYPES as _CPU_DTYPES
from .kernels.cpu import availability
from .kernels.triton import availability as triton_availability
from .kernels.triton import ops as _triton
from .ops import DirectAddNorm, EagerAddNorm, TritonAddNorm, direct_forward, eager_inference, formulas, plain
from .ops.last import LAST
from .ops.native_nodes import KIND as _KIND
from .ops.native_nodes import MAX_NUMEL as _NODES_MAX
from .ops.native_nodes import NODES as _NODES

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

BACKENDS = ("auto", "cpu", "triton", "torch")
FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


class _State(threading.local):
    # per thread, and readable inside torch.compile'd code (Dynamo guards on it; a ContextVar it cannot read)
    backend = "auto"


_state = _State()
_last = LAST  # (ops.last: the kernel implementations write it too)


@contextlib.contextmanager
def use_backend(name: str):
    """Run the enclosed addnorm calls on backend ``name`` ("auto", "cpu", "triton" or "torch"); works
    inside torch.compile'd code too."""
    _check_backend_name(name)
    if name == "triton":
        triton_availability()  # imported here, before any compiled code asks
    old = _state.backend
    _state.backend = name
    try:
        yield
    finally:
        _state.backend = old


def last_backend() -> str | None:
    """The backend ("cpu", "triton" or "torch") that ran the most recent addnorm call in this process."""
    return _last["backend"]


def _check_backend_name(name) -> None:
    if name not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {name!r}")


# ---------------------------------------------------------------- validation


class ShapeError(ValueError, RuntimeError):
    """A tensor or normalized_shape of the wrong shape: a ValueError naming the argument, and the RuntimeError
    torch raises for the same call (its message included), so code written for torch's norms catches it."""


class DtypeError(TypeError, NotImplementedError):
    """A tensor of a dtype the norms do not take: a TypeError naming the argument, and what torch raises for it
    (NotImplementedError for an integer input, a RuntimeError for an integer weight)."""


class LayoutError(TypeError, NotImplementedError):
    """A sparse tensor: a TypeError naming the argument, and what torch raises for it (NotImplementedError, a
    RuntimeError)."""


def _dim(s) -> int:
    # ints, and what torch takes as one (0-dim integer tensors, numpy ints); never bool or float
    if isinstance(s, bool) or (isinstance(s, torch.Tensor) and s.dtype == torch.bool):
        raise TypeError(f"normalized_shape must hold ints, got {s!r} (a bool)")
    try:
        return operator.index(s)
    except TypeError:
        raise TypeError(f"normalized_shape must hold ints, got {s!r} ({type(s).__name__})") from None


def _normalized_shape(normalized_shape) -> tuple[int, ...]:
    if isinstance(normalized_shape, numbers.Integral | torch.SymInt) or (
            isinstance(normalized_shape, torch.Tensor) and normalized_shape.dim() == 0):
        normalized_shape = (_dim(normalized_shape),)
    elif isinstance(normalized_shape, torch.Size | Sequence) and not isinstance(normalized_shape, str | bytes):
        normalized_shape = tuple(_dim(s) for s in normalized_shape)
    else:
        raise TypeError(f"normalized_shape must be an int or a tuple of ints, got {type(normalized_shape).__name__}")
    if len(normalized_shape) == 0:
        raise ShapeError("normalized_shape must have at least one dimension, got () (torch: Expected normalized_shape "
                         "to be at least 1-dimensional, i.e., containing at least one element)")
    if any(s < 0 for s in normalized_shape):
        raise ValueError(f"normalized_shape must be non-negative, got {normalized_shape}")
    return normalized_shape


def _check_input(name: str, t, shape: tuple[int, ...]) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in FLOAT_DTYPES:
        raise DtypeError(f"{name} must be a floating-point tensor (float16, bfloat16, float32, float64), got {t.dtype}")
    n = len(shape)
    if t.dim() < n or tuple(t.shape[t.dim() - n:]) != shape:
        raise ShapeError(
            f"{name} of shape {tuple(t.shape)} does not end in normalized_shape {shape}; "
            f"the last {n} dim(s) of {name} are the ones normalized (torch: Given normalized_shape={list(shape)}, "
            f"expected input with shape [*, {', '.join(map(str, shape))}], but got input of size{list(t.shape)})"
        )


def _check_param(name: str, p, shape: tuple[int, ...], x: torch.Tensor) -> None:
    if p is None:
        return
    if not isinstance(p, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor or None, got {type(p).__name__}")
    if p.dtype not in FLOAT_DTYPES:
        raise DtypeError(f"{name} must be floating-point, got {p.dtype}")
    if tuple(p.shape) != shape:
        raise ShapeError(f"{name} must have shape normalized_shape={shape}, got {tuple(p.shape)} (torch: Expected "
                         f"{name} to be of same shape as normalized_shape, but got {name} of shape "
                         f"{list(p.shape)} and normalized_shape = {list(shape)})")
    if not (p.is_cpu and x.is_cpu) and p.device != x.device:
        raise ValueError(f"{name} is on {p.device} but x is on {x.device}")


_SPARSE = frozenset((torch.sparse_coo, torch.sparse_csr, torch.sparse_csc, torch.sparse_bsr, torch.sparse_bsc))


def _check_storage(name: str, t) -> None:
    if isinstance(t, torch.Tensor) and t.layout in _SPARSE:  # before untyped_storage(), which a sparse one lacks
        raise LayoutError(f"{name} must be a dense tensor, got layout {t.layout} (call .to_dense() first)")
    # a tensor whose storage was freed (FSDP's resize_(0)) has elements but no memory behind them
    # (plain tensors and Parameters -- FSDP frees Parameters' storage; other subclasses hold no storage of their own)
    if t is not None and type(t) in _PLAIN and t.numel() and t.untyped_storage().nbytes() == 0:
        raise RuntimeError(f"{name} has {t.numel()} elements but its storage has been freed "
                           "(untyped_storage().resize_(0)); materialize it before calling addnorm")


def _finite_real(name: str, value) -> float:
    # the common case first, checked by comparisons: compiled with dynamic=True, a float attribute is a symbolic
    # float, which the comparisons take and math.isfinite does not (a graph break, an error under fullgraph)
    if type(value) is float and -math.inf < value < math.inf:
        return value
    if not isinstance(value, numbers.Real) or isinstance(value, bool):
        raise TypeError(f"{name} must be a float, got {type(value).__name__}")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value}")
    return value


def _check_eps(eps) -> float:
    """A finite float. Negative values are taken as torch takes them (its OpInfo samples use eps=-0.5:
    rows whose variance + eps is negative come out NaN, as in torch); NaN and inf are refused."""
    if type(eps) is float and -math.inf < eps < math.inf:  # the common case, checked cheaply
        return eps
    if isinstance(eps, torch.Tensor) and eps.dim() == 0 and eps.dtype.is_floating_point:
        eps = eps.item()
    return _finite_real("eps", eps)


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
    if residual.dtype != x.dtype and not (residual.dtype == torch.float32 and x.dtype in (torch.float16,
                                                                                          torch.bfloat16)):
        raise TypeError(f"residual dtype {residual.dtype} must equal x dtype {x.dtype}, or be float32 beside a "
                        "float16/bfloat16 x (a float32 residual stream); cast one of them first")
    if not (residual.is_cpu and x.is_cpu) and residual.device != x.device:
        raise ValueError(f"residual is on {residual.device} but x is on {x.device}")


def _check_out_dtype(out_dtype) -> None:
    if out_dtype is not None and out_dtype not in FLOAT_DTYPES:
        raise TypeError(f"out_dtype must be None or a floating-point dtype, got {out_dtype!r}")


# ---------------------------------------------------------------- dispatch


def _triton_reason(x: torch.Tensor, shape: tuple[int, ...], out_dtype) -> str | None:
    """Why the Triton kernels cannot run this call, or None."""
    if x.dtype not in _triton.SUPPORTED_DTYPES:
        return f"x has dtype {x.dtype}"
    if out_dtype is not None and out_dtype not in _triton.SUPPORTED_DTYPES:
        return f"out_dtype is {out_dtype}"
    if math.prod(shape) == 0:
        return "normalized_shape has no elements"
    if not torch.compiler.is_compiling() and _functorch_active():
        return "a torch.func transform (vmap, grad, jacrev, ...) is active"
    av = triton_availability()
    if not av.available:
        return av.reason
    if not x.is_cuda and not av.interpreted:
        return (f"x is on {x.device}: the Triton kernels run on CUDA tensors, or on any tensor under Triton's "
                "interpreter (set TRITON_INTERPRET=1 before addnorm first uses Triton)")
    return None


def _resolve(backend: str | None, x: torch.Tensor, shape: tuple[int, ...], out_dtype) -> str:
    name = _state.backend if backend is None else backend
    if name == "torch":
        return "torch"
    _check_backend_name(name)
    if name == "triton" or (name == "auto" and x.is_cuda):
        reason = _triton_reason(x, shape, out_dtype)
        if reason is None:
            return "triton"
        if name == "triton":
            raise RuntimeError(f"backend='triton' cannot run this call: {reason}; use backend='torch' or 'auto'")
        return "torch"
    reason = None
    if not x.is_cpu:
        reason = f"x is on {x.device}"
    elif x.dtype not in _CPU_DTYPES:
        reason = f"x has dtype {x.dtype}"
    elif out_dtype is not None and out_dtype not in _CPU_DTYPES:
        reason = f"out_dtype is {out_dtype}"
    elif math.prod(shape) == 0:
        reason = "normalized_shape has no elements"
    elif not torch.compiler.is_compiling() and _functorch_active():
        reason = "a torch.func transform (vmap, grad, jacrev, ...) is active"
    elif not (av := availability()).available:
        reason = av.reason
    if reason is None:
        return "cpu"
    if name == "cpu":
        raise RuntimeError(f"backend='cpu' cannot run this call: {reason}; use backend='torch' or 'auto'")
    return "torch"


availability()  # loaded once here, so that compiled code only reads the answer
if torch.cuda.is_available():
    triton_availability()  # likewise: CUDA tensors ask for it (Triton imports in ~0.3 s)

# torch.func transforms (vmap, grad, jvp, ...) wrap tensors the kernels cannot read; the torch backend
# composes with them
_functorch_active = torch._C._are_functorch_transforms_active
_dispatch_depth = torch._C._len_torch_dispatch_stack
_tracing_state = torch._C._get_tracing_state
_is_compiling = torch.compiler.is_compiling


def _needs_grad(x, residual, weight, bias) -> bool:
    # written out, not any(...) over a generator: this runs on every fast-path call
    return torch.is_grad_enabled() and (x.requires_grad or (residual is not None and residual.requires_grad)
                                        or (weight is not None and weight.requires_grad)
                                        or (bias is not None and bias.requires_grad))


def _needs_autograd(x, residual, weight, bias) -> bool:
    """Backward may be asked for, or forward-mode AD is on (dual tensors exist only inside a dual level)."""
    return _fwad._current_level >= 0 or _needs_grad(x, residual, weight, bias)


# the fast path's constants: set lookups and module globals cost less than tuple scans and attributes
_FAST_DTYPES = frozenset(_CPU_DTYPES)
_PARAM_DTYPES = frozenset(FLOAT_DTYPES)
_PLAIN = frozenset((torch.Tensor, torch.nn.Parameter))
_NUMBER = frozenset((int, float))
_KERNEL_BACKENDS = frozenset(("auto", "cpu"))
_INF = math.inf


def _fast_path_ok(x, residual, D, weight, bias, eps, weight_offset, backend) -> bool:
    """The common call, validated with a handful of cheap checks: contiguous CPU tensors of one dtype
    the kernels take, an int normalized size matching x, 1-D parameters, a plain float eps, nothing
    between the tensors and the kernels (no transform, dispatch mode, tracer or compiler). Anything else
    takes the general path, which validates fully and decides. Same kernel, same results either way.
    (Written for speed: at 64 x 768 every check here costs a visible fraction of the kernel's own time.)"""
    if torch.compiler.is_compiling() or type(x) is not torch.Tensor or type(D) is not int or type(eps) is not float:
        return False
    dt = x.dtype
    if (dt not in _FAST_DTYPES or not x.is_cpu or x.is_nested or not x.is_contiguous() or not x.dim()
            or x.shape[-1] != D or D <= 0 or not 0.0 <= eps < _INF or type(weight_offset) not in _NUMBER
            or not -_INF < weight_offset < _INF or x.is_neg()):
        return False
    if residual is not None and (type(residual) is not torch.Tensor or residual.dtype is not dt
                                 or not residual.is_cpu or not residual.is_contiguous() or residual.shape != x.shape
                                 or residual.is_neg()):
        return False
    for p in (weight, bias):
        # plain tensors and Parameters; other subclasses (DTensor, FakeTensor, ...) take the general path
        if p is not None and (type(p) not in _PLAIN or p.dtype not in _PARAM_DTYPES or not p.is_cpu
                              or p.dim() != 1 or p.shape[0] != D or p.is_neg()):
            return False
    # (a freed Parameter -- FSDP's resize_(0) -- has a null data pointer: the general path names it; asked last,
    # once no transform's wrapper, which has no storage, can be here)
    return (_names_kernel_backend(backend) and not _functorch_active() and not _dispatch_depth()
            and _tracing_state() is None and availability().available
            and (weight is None or weight.data_ptr() != 0) and (bias is None or bias.data_ptr() != 0))


def _names_kernel_backend(backend) -> bool:
    """Whether ``backend`` (None: the current default) is a kernel backend. Not ``backend or default``: a falsy
    bad name ("" or 0) must reach the general path's check, not run on the default."""
    return (backend is None or type(backend) is str) and (_state.backend if backend is None else backend) in _KERNEL_BACKENDS


def _uninferred(ts: tuple, others: tuple = ()) -> tuple:
    """``ts``, each inference tensor among them copied where a gradient is wanted (grad mode on, outside
    inference mode, some input -- of ``ts`` or ``others`` -- requiring grad): autograd cannot save an inference
    tensor, and the fused ops save their inputs where eager's composite (x * rsqrt(...) * w) saves only what it
    computed -- torch.nn.RMSNorm takes one there and gives a result. Compiled code skips this (dynamo cannot
    trace is_inference)."""
    if _is_compiling() or not torch.is_grad_enabled() or torch.is_inference_mode_enabled():
        return ts
    if not any(type(t) is torch.Tensor and t.is_inference() for t in ts):
        return ts
    if not any(isinstance(t, torch.Tensor) and t.requires_grad for t in (*ts, *others)):
        return ts
    return tuple(t.clone() if type(t) is torch.Tensor and t.is_inference() else t for t in ts)


def _flag(name: str, v) -> bool:
    """A bool option given as a bool, an int or a NumPy bool; anything else is named."""
    if isinstance(v, (bool, int)) or type(v).__name__ == "bool_":
        return bool(v)
    raise TypeError(f"{name} must be a bool, got {type(v).__name__}")


def _cpp_fast_ok(backend) -> bool:
    """What the C++ fast entries leave to Python: no compiler, transform, dispatch mode or tracer, a kernel
    backend. (They check the tensors themselves, as ``_fast_path_ok`` does.)"""
    return (_names_kernel_backend(backend) and not _is_compiling() and not _functorch_active()
            and not _dispatch_depth() and _tracing_state() is None and availability().available)


def _norm(kind, x, residual, normalized_shape, weight, bias, eps, weight_offset, cast_before_weight, out,
          residual_out, backend, out_dtype=None, residual_in_fp32=False):
    if type(cast_before_weight) is not bool:
        cast_before_weight = _flag("cast_before_weight", cast_before_weight)
    if out_dtype is not None and type(x) is torch.Tensor and out_dtype == x.dtype:
        out_dtype = None  # the same output (HF's patch asks for the input's dtype): the fast path may take it
    plain_call = out is None and residual_out is None and out_dtype is None and not residual_in_fp32
    if plain_call:
        if eps is None and kind == "rms" and isinstance(x, torch.Tensor):
            eps = _default_rms_eps(x)
        if _NODES is not None and type(cast_before_weight) is bool and _cpp_fast_ok(backend):  # checks and call in C++
            _last["backend"] = "cpu"  # (where it declines, the general path below says which backend ran)
            r = _NODES.fast_add_norm(x, residual, normalized_shape, weight, bias, eps, weight_offset, _KIND[kind],
                                     cast_before_weight)
            if r is not None:
                return r
    x, residual = _uninferred((x, residual), (weight, bias))  # past the C++ entry, which declines such a call
    if plain_call and _fast_path_ok(x, residual, normalized_shape, weight, bias, eps, weight_offset, backend):
        _last["backend"] = "cpu"
        if _needs_autograd(x, residual, weight, bias):
            if _NODES is not None and _fwad._current_level < 0 and x.numel() < _NODES_MAX:  # the C++ node
                return _NODES.add_norm(x, residual, weight, bias, _KIND[kind], eps, float(weight_offset),
                                       bool(cast_before_weight))
            return _C_APPLY(x, residual, weight, bias, kind, eps, float(weight_offset), bool(cast_before_weight))
        if _NODES is not None and x.numel() < _NODES_MAX:
            return _NODES.add_norm_inference(x, residual, weight, bias, _KIND[kind], eps, float(weight_offset),
                                             bool(cast_before_weight))
        return eager_inference(x, residual, weight, bias, kind, eps, float(weight_offset), bool(cast_before_weight))
    shape = _normalized_shape(normalized_shape)
    if getattr(x, "is_nested", False):
        return _nested(kind, x, residual, shape, weight, bias, eps, weight_offset, cast_before_weight, out,
                       residual_out, backend, out_dtype, residual_in_fp32)
    _check_input("x", x, shape)
    _check_residual(x, residual)
    _check_param("weight", weight, shape, x)
    _check_param("bias", bias, shape, x)
    _check_out_dtype(out_dtype)
    if not isinstance(residual_in_fp32, bool):
        raise TypeError(f"residual_in_fp32 must be a bool, got {type(residual_in_fp32).__name__}")
    if eps is None and kind == "rms":  # RMSNorm: torch's default; LayerNorm refuses None, as torch does
        eps = _default_rms_eps(x)
    eps = _check_eps(eps)
    weight_offset = _finite_real("weight_offset", weight_offset)
    cast_before_weight = bool(cast_before_weight)
    if not torch.compiler.is_compiling() and not _functorch_active():  # real tensors (else wrappers, no storage)
        for name, t in (("x", x), ("residual", residual), ("weight", weight), ("bias", bias), ("out", out),
                        ("residual_out", residual_out)):
            _check_storage(name, t)
        # negative views resolved before the out= buffers are checked against them (the kernels resolve their
        # inputs again at their entry, which costs nothing once resolved)
        x, residual, weight, bias = resolved(x, residual, weight, bias)
    has_sum = formulas.returns_sum(x, residual, residual_in_fp32)
    if out is not None or residual_out is not None:
        # torch's rule for out= (an input or the buffer requiring grad, with grad mode on, is refused)
        if _needs_autograd(x, residual, weight, bias) or (torch.is_grad_enabled() and any(
                t is not None and t.requires_grad for t in (out, residual_out))):
            raise RuntimeError("out= and residual_out= do not support automatic differentiation "
                               "(an input or an out= buffer requires grad); call under torch.no_grad() or drop "
                               "out=")
        from .out_buffers import check_out_buffers

        check_out_buffers(x, residual, weight, bias, out, residual_out, math.prod(shape), out_dtype or x.dtype,
                          formulas.sum_dtype(x, residual, residual_in_fp32), has_sum)
    which = _resolve(backend, x, shape, out_dtype)
    _last["backend"] = which
    ndim = len(shape)
    if which == "torch":
        y, s = _torch_backend(kind, x, residual, shape, weight, bias, eps, weight_offset, cast_before_weight,
                              out_dtype, residual_in_fp32)
    elif plain(x) and not _functorch_active() and out is None and residual_out is None:
        args = (x, residual, weight, bias, kind, ndim, eps, weight_offset, cast_before_weight, out_dtype,
                residual_in_fp32)
        if _needs_autograd(x, residual, weight, bias):  # the operator's autograd node, without the dispatcher
            y, s, _ = (_C_APPLY_TRITON if which == "triton" else _C_APPLY_DIRECT)(*args)
            s = s if has_sum else None
        else:
            y, s = direct_forward(*args, triton=which == "triton")
    elif plain(x) and not _functorch_active():
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
    RMSNorm formula; for 16-bit LayerNorm and mixed dtypes, ``ops.formulas`` (float32 statistics, one
    rounding), which is exact where both torch paths are not: a constant row gives exactly the bias (torch's
    16-bit kernel: off by 6e-5) and normalized size 1 a weight gradient of exactly 0 (its float32 path:
    -2e-5)."""
    uniform = ((out_dtype is None or out_dtype == x.dtype) and (residual is None or residual.dtype == x.dtype)
               and not formulas.returns_sum(x, None, residual_in_fp32))
    s = torch_ref.add(x, residual) if uniform else None
    # PyTorch's own layer_norm and HF's RMSNorm overflow their float32 statistics on huge values: ops.formulas then
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
    """Inference into the caller's buffers (checked by ``out_buffers``): no allocation, no autograd node."""
    from .kernels.cpu import ops as cpu

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
        _written(out, residual_out)
        return out_t, res_t
    if not (x.is_contiguous() and (residual is None or residual.is_contiguous())):
        x, residual = cpu.as_rows(x, D), None if residual is None else cpu.as_rows(residual, D)
    o = out_t if out_t.is_contiguous() else out_t.view(-1, D)  # out_buffers checked it can be
    ro = res_t if res_t is None or res_t.is_contiguous() else res_t.view(-1, D)
    cpu.forward(kind, x, residual, weight, bias, eps, weight_offset, cast_before_weight, o, ro, None,
                x.numel() // D, D)
    _written(out, residual_out)
    return out_t, res_t


def _written(*buffers) -> None:
    """The kernels wrote the caller's buffers through their pointers: bump their version counters, as an in-place
    torch op does, so that autograd refuses a backward that saved one of them (else it would use the new values)."""
    ts = [t for t in buffers if t is not None and not t.is_inference()]
    if ts:
        torch.autograd.graph.increment_version(ts)


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
    ``out=`` / ``residual_out=`` write into given buffers (inference only); see ``out_buffers`` for
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
