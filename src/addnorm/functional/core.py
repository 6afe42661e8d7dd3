"""The core of addnorm's functional API: the one backend decision, the validation every family's functions
share, and the checks of the eager fast path. Its helpers are public inside the package (``resolve``,
``check_input``, ``check_storage``, ``functorch_active``, ...): ``norm``, ``fused``, ``pointwise``, ``stream`` and
``mhc`` call them; users call the functions those modules define (``addnorm.functional`` re-exports them).

The backends and how to choose one are in the package's docstring (``addnorm.functional``); ``resolve`` is the
one place that decides, and ``use_backend`` / ``last_backend`` set and report it.

The out= buffers' rules are in ``buffers``.
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

from ..kernels.cpu import SUPPORTED_DTYPES as _CPU_DTYPES
from ..kernels.cpu import availability
from ..kernels.triton import availability as triton_availability
from ..kernels.triton import norm as _triton
from ..ops.last import LAST

__all__ = ["BACKENDS", "FLOAT_DTYPES", "DtypeError", "LayoutError", "ShapeError", "last_backend", "use_backend"]

BACKENDS = ("auto", "cpu", "triton", "torch")
FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


class _State(threading.local):
    # per thread, and readable inside torch.compile'd code (Dynamo guards on it; a ContextVar it cannot read)
    backend = "auto"


_state = _State()


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
    return LAST["backend"]


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


def as_dim(s) -> int:
    # ints, and what torch takes as one (0-dim integer tensors, numpy ints); never bool or float
    if isinstance(s, bool) or (isinstance(s, torch.Tensor) and s.dtype == torch.bool):
        raise TypeError(f"normalized_shape must hold ints, got {s!r} (a bool)")
    try:
        return operator.index(s)
    except TypeError:
        raise TypeError(f"normalized_shape must hold ints, got {s!r} ({type(s).__name__})") from None


def check_normalized_shape(normalized_shape) -> tuple[int, ...]:
    if isinstance(normalized_shape, numbers.Integral | torch.SymInt) or (
            isinstance(normalized_shape, torch.Tensor) and normalized_shape.dim() == 0):
        normalized_shape = (as_dim(normalized_shape),)
    elif isinstance(normalized_shape, torch.Size | Sequence) and not isinstance(normalized_shape, str | bytes):
        normalized_shape = tuple(as_dim(s) for s in normalized_shape)
    else:
        raise TypeError(f"normalized_shape must be an int or a tuple of ints, got {type(normalized_shape).__name__}")
    if len(normalized_shape) == 0:
        raise ShapeError("normalized_shape must have at least one dimension, got () (torch: Expected normalized_shape "
                         "to be at least 1-dimensional, i.e., containing at least one element)")
    if any(s < 0 for s in normalized_shape):
        raise ValueError(f"normalized_shape must be non-negative, got {normalized_shape}")
    return normalized_shape


def check_input(name: str, t, shape: tuple[int, ...]) -> None:
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


def check_param(name: str, p, shape: tuple[int, ...], x: torch.Tensor) -> None:
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


def check_storage(name: str, t) -> None:
    if isinstance(t, torch.Tensor) and t.layout in _SPARSE:  # before untyped_storage(), which a sparse one lacks
        raise LayoutError(f"{name} must be a dense tensor, got layout {t.layout} (call .to_dense() first)")
    # a tensor whose storage was freed (FSDP's resize_(0)) has elements but no memory behind them
    # (plain tensors and Parameters -- FSDP frees Parameters' storage; other subclasses hold no storage of their own)
    if t is not None and type(t) in _PLAIN and t.numel() and t.untyped_storage().nbytes() == 0:
        raise RuntimeError(f"{name} has {t.numel()} elements but its storage has been freed "
                           "(untyped_storage().resize_(0)); materialize it before calling addnorm")


def finite_real(name: str, value) -> float:
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


def check_eps(eps) -> float:
    """A finite float. Negative values are taken as torch takes them (its OpInfo samples use eps=-0.5:
    rows whose variance + eps is negative come out NaN, as in torch); NaN and inf are refused."""
    if type(eps) is float and -math.inf < eps < math.inf:  # the common case, checked cheaply
        return eps
    if isinstance(eps, torch.Tensor) and eps.dim() == 0 and eps.dtype.is_floating_point:
        eps = eps.item()
    return finite_real("eps", eps)


def default_rms_eps(x: torch.Tensor) -> float:
    # torch.nn.functional.rms_norm's default: machine epsilon of the type statistics are computed in
    return torch.finfo(torch.float64 if x.dtype == torch.float64 else torch.float32).eps


def check_residual(x: torch.Tensor, residual) -> None:
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


def check_float_tensor(name: str, t) -> None:
    """A tensor of a floating-point dtype the functions take, or a TypeError naming the argument."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if not t.dtype.is_floating_point or t.dtype not in FLOAT_DTYPES:
        raise TypeError(f"{name} must be a floating-point tensor (float16, bfloat16, float32, float64), got {t.dtype}")


def check_out_dtype(out_dtype) -> None:
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
    if not torch.compiler.is_compiling() and functorch_active():
        return "a torch.func transform (vmap, grad, jacrev, ...) is active"
    av = triton_availability()
    if not av.available:
        return av.reason
    if not x.is_cuda and not av.interpreted:
        return (f"x is on {x.device}: the Triton kernels run on CUDA tensors, or on any tensor under Triton's "
                "interpreter (set TRITON_INTERPRET=1 before addnorm first uses Triton)")
    return None


def resolve(backend: str | None, x: torch.Tensor, shape: tuple[int, ...], out_dtype) -> str:
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
    elif not torch.compiler.is_compiling() and functorch_active():
        reason = "a torch.func transform (vmap, grad, jacrev, ...) is active"
    elif not (av := availability()).available:
        reason = av.reason
    if reason is None:
        return "cpu"
    if name == "cpu":
        raise RuntimeError(f"backend='cpu' cannot run this call: {reason}; use backend='torch' or 'auto'")
    return "torch"


def choose_backend(backend: str | None, x: torch.Tensor, shape: tuple[int, ...], out_dtype=None) -> str:
    """``resolve``, recorded as the backend that ran (``last_backend``)."""
    which = resolve(backend, x, shape, out_dtype)
    LAST["backend"] = which
    return which


availability()  # loaded once here, so that compiled code only reads the answer
if torch.cuda.is_available():
    triton_availability()  # likewise: CUDA tensors ask for it (Triton imports in ~0.3 s)

# torch.func transforms (vmap, grad, jvp, ...) wrap tensors the kernels cannot read; the torch backend
# composes with them
functorch_active = torch._C._are_functorch_transforms_active
_dispatch_depth = torch._C._len_torch_dispatch_stack
_tracing_state = torch._C._get_tracing_state
_is_compiling = torch.compiler.is_compiling


def _needs_grad(x, residual, weight, bias) -> bool:
    # written out, not any(...) over a generator: this runs on every fast-path call
    return torch.is_grad_enabled() and (x.requires_grad or (residual is not None and residual.requires_grad)
                                        or (weight is not None and weight.requires_grad)
                                        or (bias is not None and bias.requires_grad))


def needs_autograd(x, residual, weight, bias) -> bool:
    """Backward may be asked for, or forward-mode AD is on (dual tensors exist only inside a dual level)."""
    return _fwad._current_level >= 0 or _needs_grad(x, residual, weight, bias)


def any_needs_autograd(*ts) -> bool:
    """Backward may be asked for through any of ``ts`` (None entries are absent arguments), or forward-mode AD is on."""
    return _fwad._current_level >= 0 or (torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in ts))


# the fast path's constants: set lookups and module globals cost less than tuple scans and attributes
_FAST_DTYPES = frozenset(_CPU_DTYPES)
_PARAM_DTYPES = frozenset(FLOAT_DTYPES)
_PLAIN = frozenset((torch.Tensor, torch.nn.Parameter))
_NUMBER = frozenset((int, float))
_KERNEL_BACKENDS = frozenset(("auto", "cpu"))
_INF = math.inf


def fast_path_ok(x, residual, D, weight, bias, eps, weight_offset, backend) -> bool:
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
    # (a tensor whose storage was freed -- FSDP's resize_(0) -- has no memory behind it, and a view of it at an
    # offset a data pointer that is not null: the general path names it; asked last, once no transform's wrapper,
    # which has no storage, can be here)
    return (_names_kernel_backend(backend) and not functorch_active() and not _dispatch_depth()
            and _tracing_state() is None and availability().available
            and all(t is None or not t.numel() or t.untyped_storage().nbytes()
                    for t in (x, residual, weight, bias)))


def _names_kernel_backend(backend) -> bool:
    """Whether ``backend`` (None: the current default) is a kernel backend. Not ``backend or default``: a falsy
    bad name ("" or 0) must reach the general path's check, not run on the default."""
    return (backend is None or type(backend) is str) and (_state.backend if backend is None else backend) in _KERNEL_BACKENDS


def uninferred(ts: tuple, others: tuple = ()) -> tuple:
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


def check_flag(name: str, v) -> bool:
    """A bool option given as a bool, an int or a NumPy bool; anything else is named."""
    if isinstance(v, (bool, int)) or type(v).__name__ == "bool_":
        return bool(v)
    raise TypeError(f"{name} must be a bool, got {type(v).__name__}")


def cpp_fast_ok(backend) -> bool:
    """What the C++ fast entries leave to Python: no compiler, transform, dispatch mode or tracer, a kernel
    backend. (They check the tensors themselves, as ``fast_path_ok`` does.)"""
    return (_names_kernel_backend(backend) and not _is_compiling() and not functorch_active()
            and not _dispatch_depth() and _tracing_state() is None and availability().available)
