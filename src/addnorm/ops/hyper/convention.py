"""The conventions of hyper-connections without a mixing matrix: what differs between models, as values passed
to one operator, never as a copy of it.

``ProjectedGates``: gates projected from the RMS-normed vec(X) (HY-V4's iHC, its head; DeepSeek-V4's pre and post
without their mixing matrix):

    H_pre  = sigmoid(s_pre m[:n] + b[:n]) + pre_eps,   H_post = post_scale sigmoid(s_post m[n:] + b[n:]) + post_eps

with m = (vec(X) W^T) / RMS(vec(X)). DeepSeek's mHC fixes post_scale at 2 and both eps at 0; HY-V4 reads
post_scale from ``hc_magnitude`` and both eps from ``hc_eps``.

``StreamNorm``: each stream RMS-normed over its C channels with its own weight (Qwen4-exp's grouped ``hc_norm``):
N_i = X_i / sqrt(mean(X_i^2) + eps) * (weight_offset + w_i), in float32, rounded once to X's dtype.

``Rounding``: where a 16-bit write or collapse rounds. "once": the float32 result rounded once (HY-V4's write, which
casts its operands to float32 and back; addnorm's way). "products": each product first rounded to the inputs'
dtype, then the sum, as eager 16-bit code computes ``X + a y`` and ``mean(G * N)`` (Qwen4-exp) -- so that the
result is eager's to the bit. In float32 and float64 the two are the same.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


def _finite(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class ProjectedGates:
    eps: float  # the RMS of vec(X) (HF: the config's rms_norm_eps)
    pre_eps: float = 0.0  # added to every collapse gate (HY-V4: hc_eps)
    post_scale: float = 2.0  # the expand gates' magnitude (HY-V4: hc_magnitude; DeepSeek's mHC: 2)
    post_eps: float = 0.0  # added to every expand gate (HY-V4: hc_eps)

    def __post_init__(self):
        for name in ("eps", "pre_eps", "post_scale", "post_eps"):
            object.__setattr__(self, name, _finite(name, getattr(self, name)))
        if self.eps < 0:
            raise ValueError(f"eps must be >= 0 (the RMS of vec(X)), got {self.eps}")


@dataclass(frozen=True)
class StreamNorm:
    eps: float  # each stream's RMS (HF: the config's rms_norm_eps)
    weight_offset: float = 1.0  # 1.0: the scale is (1 + w), Qwen4-exp's and Gemma's zero-centred weight

    def __post_init__(self):
        for name in ("eps", "weight_offset"):
            object.__setattr__(self, name, _finite(name, getattr(self, name)))
        if self.eps < 0:
            raise ValueError(f"eps must be >= 0 (each stream's RMS), got {self.eps}")


_ROUNDINGS = ("once", "products")


@dataclass(frozen=True)
class Rounding:
    where: str = "once"  # "once" | "products"

    def __post_init__(self):
        if self.where not in _ROUNDINGS:
            raise ValueError(f"rounding must be one of {_ROUNDINGS}, got {self.where!r}")


ONCE = Rounding("once")
PRODUCTS = Rounding("products")
