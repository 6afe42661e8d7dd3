"""One residual sub-layer: a branch F, up to three norm slots, and a residual form.

The residual stream flows through as ``(x, pending)``: ``pending`` is a branch output that has not
been added to ``x`` yet. A sub-layer whose placement ends with a plain ``x + F`` returns F as
pending instead of adding it; the next norm then does the add and the norm in one fused pass
(``add_layer_norm``), which is what makes a pre-norm stack move each activation once instead of
twice. Placements that norm the sum (post-norm, DeepNorm) fuse their own add the same way.

A widened stream (HC, mHC, mHC-lite) is ``x`` of shape (B, T, n, C) with a connection
(``model/streams.py``) that reads the branch input out of it and writes the branch output back:
``h, mix = conn.read(x)``; ``x' = conn.write(x, F(norm(h)), mix)``. Its pending is that write
(``PendingWrite``), which the next sub-layer's read finishes (mHC's in the same pass) and ``streams.finish``
anywhere else.
"""

from __future__ import annotations

import torch
from torch import nn

from ..nn.factory import POINTWISE_KINDS, make_norm
from ..nn.scalars import ScalarParameters, as_scalar
from .placement import Placement
from .streams import PendingWrite


class ResidualSubLayer(ScalarParameters):
    def __init__(self, fn: nn.Module, dim: int, placement: Placement, *, eps: float = 1e-5, bias: bool = True,
                 alpha: float = 1.0, backend: str | None = None, depth_scale: float = 1.0,
                 norm_alpha: float | None = None, streams: nn.Module | None = None):
        super().__init__()
        if "default" in (placement.before, placement.after_branch, placement.after_sum):
            raise ValueError("placement has 'default' slots; call placement.with_norm(kind) first")
        if placement.residual == "normalized":
            raise ValueError(f"placement {placement.name!r}: residual='normalized' is nGPT's stream on the sphere, "
                             f"built by nGPT's own block (model/ngpt.py, GPT with placement='ngpt'), "
                             f"not by a ResidualSubLayer")
        if placement.widened != (streams is not None):
            raise ValueError(f"placement {placement.name!r} (stream {placement.stream!r}) needs "
                             f"{'a' if placement.widened else 'no'} stream connection")
        self.placement = placement
        self.fn = fn

        def mk(kind):
            if kind is None:
                return None
            a = norm_alpha if kind in POINTWISE_KINDS else None
            return make_norm(kind, dim, eps, bias=bias, backend=backend, alpha=a)

        self.norm_before = mk(placement.before)
        self.norm_branch = mk(placement.after_branch)
        self.norm_sum = mk(placement.after_sum)
        self.alpha = alpha  # "scaled" residual: alpha * x + F (a constant, not learned)
        self.depth_scale = depth_scale  # LayerNorm Scaling: 1/sqrt(l) on the branch input's norm
        self.streams = streams
        if placement.residual == "gated":
            shape = (dim,) if placement.gate_per_channel else (1,)  # (1,): FSDP2 shards no 0-d parameter
            self.gate = nn.Parameter(torch.full(shape, float(placement.gate_init)))
        else:
            self.register_parameter("gate", None)

    def reset_parameters(self) -> None:
        if self.gate is not None:
            with torch.no_grad():
                self.gate.fill_(float(self.placement.gate_init))

    def _branch(self, h: torch.Tensor, fn_kwargs: dict, branch_norm: bool = True) -> torch.Tensor:
        if self.depth_scale != 1.0 and self.norm_before is None:  # else folded into the norm (out_scale)
            h = h * self.depth_scale
        f = self.fn(h, **fn_kwargs)
        if self.norm_branch is not None and branch_norm:
            f, _ = self.norm_branch(f)
        if self.gate is not None:
            f = (self.gate if self.placement.gate_per_channel else as_scalar(self.gate)) * f  # 0-d: f's dtype kept
        return f

    def _norm_in(self, x: torch.Tensor, pending: torch.Tensor | None = None):
        """The branch input's norm, with LayerNorm Scaling's 1/sqrt(l) folded into its parameters."""
        kw = {} if self.depth_scale == 1.0 else {"out_scale": self.depth_scale}
        return self.norm_before(pending, x, **kw) if pending is not None else self.norm_before(x, **kw)

    def forward(self, x: torch.Tensor, pending: torch.Tensor | None = None, **fn_kwargs):
        """(stream, pending) -> (stream, pending). Call with pending=None at the first layer."""
        p = self.placement
        if self.streams is not None:  # widened: (B, T, n, C); the write is left pending for the next read
            x, h, mix = self.streams.write_read(x, pending)
            if self.norm_before is not None:
                h, _ = self._norm_in(h)
            return x, PendingWrite(self.streams, self._branch(h, fn_kwargs), mix)
        if self.norm_before is not None:
            h, x = self._norm_in(x, pending)
            if p.residual == "from_norm":
                x = h  # HybridNorm's FFN: the skip path carries Norm(x)
        else:
            x = x if pending is None else x + pending
            h = x
        # sandwich / Peri-LN: x + Norm_out(F) in one pass (norm-then-add); left pending, the normed branch
        # would be written and read once more
        fuse_out = (self.norm_branch is not None and self.norm_sum is None and p.residual == "add"
                    and self.gate is None)
        f = self._branch(h, fn_kwargs, branch_norm=not fuse_out)
        if fuse_out:
            return self.norm_branch.add_to(f, x), None
        if p.residual == "none":
            return (f if self.norm_sum is None else self.norm_sum(f)[0]), None
        base = self.alpha * x if p.residual == "scaled" else x
        if self.norm_sum is not None:
            y, _ = self.norm_sum(f, base)  # Add & Norm in one call
            return y, None
        if p.residual == "scaled":
            return base + f, None
        return x, f  # x + f ("add", "from_norm") is left to the next norm (or to the caller)

    def extra_repr(self) -> str:
        p = self.placement
        extra = f", alpha={self.alpha:.4g}" if p.residual == "scaled" else ""
        extra += f", depth_scale={self.depth_scale:.4g}" if self.depth_scale != 1.0 else ""
        return f"placement={p.name!r}: {p.formula}{extra}"
