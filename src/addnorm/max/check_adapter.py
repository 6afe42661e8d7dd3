"""Let ``addnorm check`` run a MAX LayerNorm / RMSNorm / residual module (seed 004's step)."""

from __future__ import annotations


import numpy as np

from ..check.adapters import EPS_NAMES, SCALE_NAMES, SHIFT_NAMES, Adapted, find_attr, instantiate, positional_params
from .convert import to_max


def adapt_max(target, d: int) -> Adapted:
    m = instantiate(target, d) if isinstance(target, type) else target
    fwd = getattr(m, "forward", None) or getattr(m, "__call__")
    n_inputs = len(positional_params(fwd))
    scale_name, shift_name = find_attr(m, SCALE_NAMES), find_attr(m, SHIFT_NAMES)
    eps_name = find_attr(m, EPS_NAMES)

    def call(*xs):
        out = m(*[to_max(np.asarray(x, dtype=np.float32)) for x in xs])
        if isinstance(out, tuple):
            out = out[0]
        return np.asarray(out.to_numpy(), dtype=np.float64)

    def set_affine(scale, shift):
        state = {}
        if scale is not None and scale_name:
            state[scale_name] = to_max(np.asarray(scale, dtype=np.float32))
        if shift is not None and shift_name:
            state[shift_name] = to_max(np.asarray(shift, dtype=np.float32))
        if not state:
            return False
        for k, v in state.items():
            setattr(m, k, v)
        return True

    def get_affine():
        return tuple(np.asarray(getattr(m, n).to_numpy(), dtype=np.float64) if n else None for n in (scale_name, shift_name))

    eps = getattr(m, eps_name, None) if eps_name else None
    return Adapted("max-module" if n_inputs == 1 else "residual", f"{type(m).__name__} (MAX module)", call, set_affine,
                   get_affine, float(eps) if isinstance(eps, int | float) else None, None, n_inputs)
