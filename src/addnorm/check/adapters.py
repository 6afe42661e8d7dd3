"""Make any implementation callable on float64 arrays, with its scale/shift settable and its eps known.

Supported: torch ``nn.Module`` classes or instances, NumPy or torch functions, and whatever the caller adds
through ``extra`` (the command line adds MAX modules from ``addnorm.max.check_adapter``: ``check/`` never
imports ``max/``). A function's arguments after ``x`` are given by their role, told from their names
(``weight``/``gamma``, ``bias``/``beta``, ``eps``, ``d``/``dim``/``normalized_shape``, ``sublayer_output``,
``sublayer``) or, for a name none of these, from how the function behaves; arguments with a default are left
to it (its ``eps=1e-6`` is the eps it declares).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

SCALE_NAMES = ("weight", "gamma", "scale", "g", "w")
SHIFT_NAMES = ("bias", "beta", "shift", "b")
EPS_NAMES = ("eps", "epsilon", "variance_epsilon", "norm_eps", "layer_norm_eps", "rms_norm_eps")
SIZE_NAMES = ("d", "dim", "d_model", "hidden_size", "normalized_shape", "num_features", "features", "n_embd",
              "embed_dim", "size", "shape", "n_features")
RESIDUAL_NAMES = ("residual", "sublayer_output", "sublayer_out", "sub", "sub_out", "skip", "res", "y", "h",
                  "fx", "branch", "input_tensor")
SUBLAYER_NAMES = ("sublayer", "fn", "func", "f", "layer", "module", "block")
EPS_PASSED = 1e-5  # what the check gives a function whose eps has no default
TORCH_DEFAULT_EPS = float(np.finfo(np.float32).eps)  # eps=None in torch.nn.RMSNorm: finfo(input dtype).eps


@dataclass
class Adapted:
    kind: str  # "torch-module", "numpy-function", "torch-function", "max-module"
    description: str
    name: str  # the user's name for it: "LayerNorm", "rms_norm" (what it means to be, where behaviour can't tell)
    call: Callable  # f(x ndarray[, second]) -> tuple of float64 ndarrays, one per output
    set_affine: Callable  # f(scale ndarray|None, shift ndarray|None) -> bool (False: no such parameters)
    get_affine: Callable  # () -> (scale, shift) as float64 ndarrays, None where absent
    eps: float | None  # the eps it declares; None: not declared (the check measures it)
    eps_note: str = ""  # how eps is known, shown beside it
    torch_forward: Callable | None = None  # torch tensor -> torch tensor, for the gradient check
    second: str = ""  # the input after x: "" none, "tensor" (a sublayer's output), "sublayer" (a callable)
    module: object = None  # the torch module itself (a block's sublayer and norm are found in it)

    @property
    def n_inputs(self) -> int:
        return 2 if self.second else 1

    def first(self, *xs) -> np.ndarray:
        return self.call(*xs)[0]


def parameters_of(fn) -> list[inspect.Parameter]:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return []
    return [p for p in sig.parameters.values() if p.name != "self"]


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


def declared_eps(value) -> tuple[float | None, str]:
    """(eps, note) from an ``eps`` attribute or default: None means torch's convention, finfo(dtype).eps."""
    if value is None:
        return TORCH_DEFAULT_EPS, "eps=None: torch.finfo(float32).eps, as torch.nn.RMSNorm"
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value), ""
    return None, ""


def second_role(name: str, required: bool) -> str:
    """The role of a forward's argument after x, by its name: "sublayer", "tensor" or "" (left to its default)."""
    if name in SUBLAYER_NAMES:
        return "sublayer"
    if name in RESIDUAL_NAMES or (required and name not in SIZE_NAMES + EPS_NAMES + SCALE_NAMES + SHIFT_NAMES):
        return "tensor"
    return ""


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
        return _adapt_torch_module(target, d)
    if callable(target):
        return _adapt_function(target, d)
    raise TypeError(f"cannot check a {type(target).__name__}: expected an nn.Module class/instance, a function "
                    "or a MAX module")


# --- torch modules ---------------------------------------------------------------------------------------------

def norm_inside(m):
    """The one norm among a module's descendants (a wrapper's or a block's), or None."""
    inner = [c for n, c in m.named_modules() if n and "norm" in type(c).__name__.lower()]
    return inner[0] if len(inner) == 1 else None


def _affine_names(m, d: int):
    """(owner, scale name, shift name): tensors of d elements on the module itself, else on its one norm."""
    import torch

    def found(o, names):
        return next((n for n in names if isinstance(getattr(o, n, None), torch.Tensor)
                     and getattr(o, n).numel() == d), None)

    for owner in (m, norm_inside(m)):
        if owner is not None and (found(owner, SCALE_NAMES) or found(owner, SHIFT_NAMES)):
            return owner, found(owner, SCALE_NAMES), found(owner, SHIFT_NAMES)
    return m, None, None


def _module_eps(m) -> tuple[float | None, str]:
    for owner in (m, norm_inside(m)):
        name = find_attr(owner, EPS_NAMES) if owner is not None else None
        if name is not None:
            return declared_eps(getattr(owner, name))
    return None, ""


def _sublayer_to_torch(fn):
    """A NumPy sublayer given by the check, called with the module's tensors."""
    import torch

    def sublayer(t):
        return torch.as_tensor(fn(t.detach().double().numpy()), dtype=t.dtype)

    return sublayer


def _adapt_torch_module(m, d: int) -> Adapted:
    import torch

    fwd = getattr(m, "forward", None)
    rest = [p for p in parameters_of(fwd)[1:] if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    second = next((r for r in (second_role(p.name, p.default is p.empty) for p in rest[:1]) if r), "")
    owner, scale_name, shift_name = _affine_names(m, d)

    def call(*xs):
        args = [torch.as_tensor(xs[0], dtype=torch.float32)]
        if len(xs) > 1:
            args.append(_sublayer_to_torch(xs[1]) if second == "sublayer" else torch.as_tensor(xs[1], dtype=torch.float32))
        with torch.no_grad():
            out = m(*args)
        return tuple(o.detach().double().numpy() for o in (out if isinstance(out, tuple | list) else (out,)))

    def set_affine(scale, shift):
        ok = False
        with torch.no_grad():
            for name, val in ((scale_name, scale), (shift_name, shift)):
                if name and val is not None:
                    p = getattr(owner, name)
                    p.copy_(torch.as_tensor(val, dtype=p.dtype).reshape(p.shape))
                    ok = True
        return ok

    def get_affine():
        return tuple(getattr(owner, n).detach().double().numpy().reshape(-1).copy() if n else None
                     for n in (scale_name, shift_name))

    def torch_forward(t):
        out = m(t)
        return out[0] if isinstance(out, tuple | list) else out

    eps, note = _module_eps(m)
    return Adapted("torch-module", f"{type(m).__name__} (torch nn.Module)", type(m).__name__, call, set_affine,
                   get_affine, eps, note, torch_forward, second, m)


# --- functions -------------------------------------------------------------------------------------------------

def _roles(fn) -> tuple[list[tuple[str, str]], float | None, str]:
    """[(argument, role)] for the positional arguments after x that the check gives, and the declared eps."""
    roles, eps, note = [], None, ""
    required = [p.name for p in parameters_of(fn)[1:] if p.default is p.empty
                and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    for p in parameters_of(fn)[1:]:
        needed = p.name in required
        if p.name in EPS_NAMES:
            if needed:
                roles.append((p.name, "eps"))
                eps, note = EPS_PASSED, "passed by the check: its eps has no default"
            else:
                eps, note = declared_eps(p.default)
            continue
        if p.kind not in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            continue
        role = ("scale" if p.name in SCALE_NAMES else "shift" if p.name in SHIFT_NAMES
                else "size" if p.name in SIZE_NAMES and needed else second_role(p.name, needed))
        if (role == "tensor" and p.name not in RESIDUAL_NAMES) or (required == [p.name] and len(p.name) == 1):
            role = "unknown"  # told by behaviour (_tell_unknown): f(a, b) is as likely a residual as a norm's bias
        if role:
            roles.append((p.name, role))
    return roles, eps, note


def _tell_unknown(fn, roles, d: int, to) -> list[tuple[str, str]]:
    """An argument whose name says nothing: a scale if zeros there zero the output, else the sublayer's output if
    a tensor shaped like x is taken, else the feature size."""
    x = np.random.default_rng(11).normal(size=(2, 3, d))
    for i, (name, role) in enumerate(roles):
        if role != "unknown":
            continue
        trials = {"scale": np.zeros(d), "tensor": np.zeros_like(x), "size": d}
        found = "tensor"
        for cand, val in trials.items():
            args = [to(x)] + [to(val) if j == i and cand != "size" else val if j == i
                              else _default_arg(r, d, to) for j, (_, r) in enumerate(roles)]
            try:
                out = np.asarray(_as_numpy(fn(*args)), dtype=np.float64)
            except Exception:  # noqa: BLE001 - the trial failed: not this role
                continue
            if cand == "scale" and not (out.shape == x.shape and np.abs(out).max() == 0):
                continue
            found = cand
            break
        roles[i] = (name, found)
    return roles


def _default_arg(role, d, to):
    return {"scale": to(np.ones(d)), "shift": to(np.zeros(d)), "eps": EPS_PASSED, "size": d,
            "tensor": to(np.zeros((2, 3, d)))}.get(role)


def _as_numpy(out):
    out = out[0] if isinstance(out, tuple | list) else out
    return out.detach().double().numpy() if hasattr(out, "detach") else out


def _adapt_function(fn, d: int) -> Adapted:
    import torch

    roles, eps, note = _roles(fn)
    state = {"scale": np.ones(d), "shift": np.zeros(d)}

    def to_numpy(a):
        return np.asarray(a, dtype=np.float64)

    def to_torch(a):
        return torch.as_tensor(a, dtype=torch.float32)

    def args_for(xs, to, torch_sublayer):
        args, rest = [to(xs[0])], list(xs[1:])
        for name, role in roles:
            if role in ("scale", "shift"):
                args.append(to(state[role]))
            elif role == "eps":
                args.append(EPS_PASSED)
            elif role == "size":
                args.append((d,) if name in ("normalized_shape", "shape") else d)
            elif role == "sublayer":
                s = rest.pop(0)
                args.append(_sublayer_to_torch(s) if torch_sublayer else s)
            else:
                args.append(to(rest.pop(0)))
        return args

    # NumPy first (seeds 001/002), torch if it refuses arrays
    base = roles
    for kind, to in (("numpy-function", to_numpy), ("torch-function", to_torch)):
        try:
            roles = _tell_unknown(fn, list(base), d, to)
            second = next((r for _, r in roles if r in ("tensor", "sublayer")), "")
            probe = [np.zeros((2, d))] + ([np.zeros((2, d)) if second == "tensor" else (lambda a: a)] if second else [])
            out = fn(*args_for(probe, to, kind == "torch-function"))
            if kind == "numpy-function" and not isinstance(out[0] if isinstance(out, tuple) else out, np.ndarray):
                raise TypeError("not an array")
            break
        except Exception:  # noqa: BLE001 - any failure means "try torch" (and the checks report torch's error)
            continue
    second = next((r for _, r in roles if r in ("tensor", "sublayer")), "")
    has = {r for _, r in roles}

    def call(*xs):
        if kind == "numpy-function":
            out = fn(*args_for(xs, to_numpy, False))
        else:
            with torch.no_grad():
                out = fn(*args_for(xs, to_torch, True))
        outs = out if isinstance(out, tuple | list) else (out,)
        return tuple(np.asarray(_as_numpy(o), dtype=np.float64) for o in outs)

    def set_affine(scale, shift):
        ok = False
        for role, val in (("scale", scale), ("shift", shift)):
            if role in has and val is not None:
                state[role] = np.asarray(val, dtype=np.float64)
                ok = True
        return ok

    def get_affine():
        return tuple(state[r].copy() if r in has else None for r in ("scale", "shift"))

    torch_forward = None
    if kind == "torch-function" and not second:
        def torch_forward(t):
            out = fn(*args_for([t], lambda a: a if isinstance(a, torch.Tensor) else to_torch(a), True))
            return out[0] if isinstance(out, tuple | list) else out

    name = getattr(fn, "__name__", "function")
    signature = ", ".join(["x"] + [n for n, _ in roles])
    return Adapted(kind, f"{name}({signature}) ({kind.replace('-', ' ')})", name, call, set_affine, get_affine,
                   eps, note, torch_forward, second)
