"""One residual sub-layer: a branch F, up to three norm slots, and a residual form.

The residual stream flows through as ``(x, pending)``: ``pending`` is a branch output that has not
been added to ``x`` yet. A sub-layer whose placement ends with a plain ``x + F`` returns F as
pending instead of adding it; the next norm then does the add and the norm in one fused pass
(``add_layer_norm``), which is what makes a pre-norm stack move each activation once instead of
twice. Placements that norm the sum (post-norm, DeepNorm) fuse their own add the same way.
"""

from __future__ import annotations

import torch
from torch import nn

from ..nn.factory import make_norm
from ..placement import Placement

_FUSED = ("layer", "rms")  # kinds whose add is fused into the norm kernel


class ResidualSubLayer(nn.Module):
    def __init__(self, fn: nn.Module, dim: int, placement: Placement, *, eps: float = 1e-5, bias: bool = True,
                 alpha: float = 1.0, backend: str | None = None):
        super().__init__()
        if "default" in (placement.before, placement.after_branch, placement.after_sum):
            raise ValueError("placement has 'default' slots; call placement.with_norm(kind) first")
        self.placement = placement
        self.fn = fn
        mk = lambda kind: None if kind is None else make_norm(kind, dim, eps, bias=bias, backend=backend)  # noqa: E731
        self.norm_before = mk(placement.before)
        self.norm_branch = mk(placement.after_branch)
        self.norm_sum = mk(placement.after_sum)
        self.alpha = alpha  # "scaled" residual: alpha * x + F (a constant, not learned)
        if placement.residual == "gated":
            shape = (dim,) if placement.gate_per_channel else ()
            self.gate = nn.Parameter(torch.full(shape, float(placement.gate_init)))
        else:
            self.register_parameter("gate", None)

    def forward(self, x: torch.Tensor, pending: torch.Tensor | None = None, **fn_kwargs):
        """(stream, pending) -> (stream, pending). Call with pending=None at the first layer."""
        p = self.placement
        if self.norm_before is not None:
            h, x = self.norm_before(pending, x) if pending is not None else self.norm_before(x)
        else:
            x = x if pending is None else x + pending
            h = x
        f = self.fn(h, **fn_kwargs)
        if self.norm_branch is not None:
            f, _ = self.norm_branch(f)
        if self.gate is not None:
            f = self.gate * f
        if p.residual == "none":
            return (f if self.norm_sum is None else self.norm_sum(f)[0]), None
        base = self.alpha * x if p.residual == "scaled" else x
        if self.norm_sum is not None:
            y, _ = self.norm_sum(f, base)  # Add & Norm in one call
            return y, None
        if p.residual == "scaled":
            return base + f, None
        return x, f  # x + f is left to the next norm (or to the caller)

    def extra_repr(self) -> str:
        p = self.placement
        extra = f", alpha={self.alpha:.4g}" if p.residual == "scaled" else ""
        return f"placement={p.name!r}: {p.formula}{extra}"
