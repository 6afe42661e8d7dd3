"""Make any implementation callable as ``f(x: float64 ndarray) -> ndarray`` with settable scale/shift.

Supported: torch ``nn.Module`` classes or instances, NumPy or torch functions (``f(x)``,
``f(x, gamma, beta[, eps])``, ``f(x, weight, bias)``), and whatever the caller adds through ``extra``
(the command line adds MAX modules from ``addnorm.max.check_adapter``: ``check/`` never imports ``max/``).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import numpy as np

SCALE_NAMES = ("weight", "gamma", "scale", "g")
SHIFT_NAMES = ("bias", "beta", "shift", "b")
EPS_NAMES = ("eps", "epsilon", "variance_epsilon")


@dataclass
class Adapted:
    kind: str  # "torch-module", "numpy-function", "torch-function", "max-module", "residual"
    description: str
    call: object  # f(x ndarray[, y ndarray]) -> ndarray
    set_affine: object  # f(scale ndarray|None, shift ndarray|None) -> bool (False: no such parameters)
    get_affine: object  # () -> (scale, shift) as ndarrays or None
    eps: float | None
    torch_module: object = None  # for gradient checks
    n_inputs: int = 1


def positional_params(fn) -> list[str]:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return []
    return [p.name for p in sig.parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.name != "self"]


def find_attr(obj, names):
    for n in names:
        if hasattr(obj, n):
            return n
    return None


def instantiate(cls, d: int):
    errors = []
    for args, kwargs in (((d,), {}), ((), {"d_model": d}), ((), {"normalized_shape": d}), ((), {"dim": d}),
                         ((), {"hidden_size": d}), ((), {"num_features": d})):
        try:
            return cls(*args, **kwargs)
        except TypeError as e:
            errors.append(str(e))
    raise TypeError(f"could not construct {cls.__name__} with the feature size {d}: {errors[0]}")


def is_max_module(obj) -> bool:
    mod = type(obj).__module__ if not isinstance(obj, type) else obj.__module__
    bases = [c.__module__ for c in (obj.__mro__ if isinstance(obj, type) else type(obj).__mro__)]
    return any(m.startswith("max.") for m in bases) or mod.startswith("max.")


def adapt(target, d: int, extra=()) -> Adapted:
    """``extra``: (predicate, adapter) pairs tried first, ``adapter(target, d) -> Adapted``."""
    import torch

    for applies, adapter in extra:
        if applies(target):
            return adapter(target, d)
    if is_max_module(target):
        raise TypeError("this is a MAX module: checking it needs addnorm's MAX extra (pip install 'addnorm[max]')")
    if isinstance(target, type) and issubclass(target, torch.nn.Module):
        target = instantiate(target, d)
    if isinstance(target, torch.nn.Module):
        return _adapt_torch_module(target)
    if callable(target):
        return _adapt_function(target, d)
    raise TypeError(f"cannot check a {type(target).__name__}: expected an nn.Module class/instance, a function "
                    "or a MAX module")


def _adapt_torch_module(m) -> Adapted:
    import torch

    fwd = getattr(m, "forward", None)
    n_inputs = len(positional_params(fwd)) if fwd is not None else 1
    scale_name, shift_name = find_attr(m, SCALE_NAMES), find_attr(m, SHIFT_NAMES)
    eps_name = find_attr(m, EPS_NAMES)

    def call(*xs):
        with torch.no_grad():
            out = m(*[torch.as_tensor(x, dtype=torch.float32) for x in xs])
        if isinstance(out, tuple):
            out = out[0]
        return out.detach().double().numpy()

    def set_affine(scale, shift):
        ok = False
        with torch.no_grad():
            for name, val in ((scale_name, scale), (shift_name, shift)):
                p = getattr(m, name, None) if name else None
                if val is not None and isinstance(p, torch.Tensor):
                    p.copy_(torch.as_tensor(val, dtype=p.dtype).reshape(p.shape))
                    ok = True
        return ok

    def get_affine():
        out = []
        for name in (scale_name, shift_name):
            p = getattr(m, name, None) if name else None
            out.append(p.detach().double().numpy().copy() if isinstance(p, torch.Tensor) else None)
        return tuple(out)

    eps = getattr(m, eps_name, None) if eps_name else None
    return Adapted("torch-module" if n_inputs == 1 else "residual", f"{type(m).__name__} (torch nn.Module)", call,
                   set_affine, get_affine, float(eps) if isinstance(eps, int | float) else None, m, n_inputs)


def _adapt_function(fn, d: int) -> Adapted:
    import torch

    params = positional_params(fn)
    state = {"scale": np.ones(d), "shift": np.zeros(d)}
    has_affine = len(params) >= 3 or any(p in SCALE_NAMES for p in params)
    residual = len(params) == 2 and not has_affine

    def _call_with(xs, to):
        args = [to(x) for x in xs]
        if has_affine:
            args += [to(state["scale"]), to(state["shift"])]
        return fn(*args)

    # NumPy first (seeds 001/002), torch if it refuses arrays
    kind = "numpy-function"
    try:
        probe = _call_with([np.zeros((2, d))] * (2 if residual else 1), lambda a: np.asarray(a, dtype=np.float64))
        if not isinstance(probe, np.ndarray):
            raise TypeError
    except Exception:  # noqa: BLE001 - any failure means "try torch"
        kind = "torch-function"

    def call(*xs):
        if kind == "numpy-function":
            return np.asarray(_call_with(xs, lambda a: np.asarray(a, dtype=np.float64)), dtype=np.float64)
        with torch.no_grad():
            out = _call_with(xs, lambda a: torch.as_tensor(a, dtype=torch.float32))
        return out.detach().double().numpy()

    def set_affine(scale, shift):
        if not has_affine:
            return False
        if scale is not None:
            state["scale"] = np.asarray(scale, dtype=np.float64)
        if shift is not None:
            state["shift"] = np.asarray(shift, dtype=np.float64)
        return True

    eps = None
    try:
        p = inspect.signature(fn).parameters
        for n in EPS_NAMES:
            if n in p and isinstance(p[n].default, int | float):
                eps = float(p[n].default)
    except (TypeError, ValueError):
        pass
    return Adapted("residual" if residual else kind, f"{getattr(fn, '__name__', 'function')} ({kind.replace('-', ' ')})",
                   call, set_affine, lambda: (state["scale"].copy(), state["shift"].copy()) if has_affine else (None, None),
                   eps, None, 2 if residual else 1)
