"""Let ``addnorm check`` run a MAX LayerNorm / RMSNorm / residual module (seed 004's step).

The same reading as a torch module's (``check.adapters``): the argument after ``x`` by its name, eps from the
module (``None``: torch's finfo convention), the weight and bias by their names; the checks themselves are shared.
"""

from __future__ import annotations

import numpy as np

from ..check.adapters import (EPS_NAMES, SCALE_NAMES, SHIFT_NAMES, Adapted, declared_eps, instantiate, parameters_of,
                              second_role)
from .convert import to_max


def _present(m, names):
    return next((n for n in names if getattr(m, n, None) is not None), None)


def adapt_max(target, d: int) -> Adapted:
    m = instantiate(target, d) if isinstance(target, type) else target
    fwd = getattr(m, "forward", None) or getattr(m, "__call__")
    rest = [p for p in parameters_of(fwd)[1:] if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    second = next((r for r in (second_role(p.name, p.default is p.empty) for p in rest[:1]) if r), "")
    scale_name, shift_name = _present(m, SCALE_NAMES), _present(m, SHIFT_NAMES)
    eps_name = next((n for n in EPS_NAMES if hasattr(m, n)), None)  # eps=None is torch's convention, not "none"

    def sublayer(fn):
        return lambda t: to_max(np.asarray(fn(np.asarray(t.to_numpy(), dtype=np.float64)), dtype=np.float32))

    def call(*xs):
        args = [to_max(np.asarray(xs[0], dtype=np.float32))]
        if len(xs) > 1:
            args.append(sublayer(xs[1]) if second == "sublayer" else to_max(np.asarray(xs[1], dtype=np.float32)))
        out = m(*args)
        return tuple(np.asarray(o.to_numpy(), dtype=np.float64) for o in (out if isinstance(out, tuple | list) else (out,)))

    def set_affine(scale, shift):
        state = {}
        if scale is not None and scale_name:
            state[scale_name] = to_max(np.asarray(scale, dtype=np.float32))
        if shift is not None and shift_name:
            state[shift_name] = to_max(np.asarray(shift, dtype=np.float32))
        for k, v in state.items():
            setattr(m, k, v)
        return bool(state)

    def get_affine():
        return tuple(np.asarray(getattr(m, n).to_numpy(), dtype=np.float64).reshape(-1) if n else None
                     for n in (scale_name, shift_name))

    eps, note = declared_eps(getattr(m, eps_name)) if eps_name else (None, "")
    return Adapted("max-module", f"{type(m).__name__} (MAX module)", type(m).__name__, call, set_affine, get_affine,
                   eps, note, None, second)
