"""DenseFormer's regime: after every ``dense_period``-th block, the stream becomes a depth-weighted average of
every block output so far (``model/denseformer.py``), over whatever stream its inner regime carries (one
stream, or a widened one)."""

from __future__ import annotations

import torch
from torch import nn

from ..denseformer import DepthWeightedAverage
from ..errors import ConfigError
from ..streams import finish
from .base import Regime


class DenseFormer(Regime):
    name = "denseformer"

    def __init__(self, config, placements, inner: Regime):
        super().__init__(config, placements)
        self.inner = inner  # enters and leaves the stream (one stream or n)
        self.dwa: nn.ModuleList | None = None

    @classmethod
    def validate(cls, config, placements) -> None:
        for name in ("dense_dilation", "dense_period"):
            v = getattr(config, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(f"{name} must be an integer >= 1, got {v!r}")

    def between_blocks(self) -> nn.ModuleList:
        c = self.config  # a DWA after every dense_period-th block (an Identity, no parameters, elsewhere)
        self.dwa = nn.ModuleList(DepthWeightedAverage(i + 1, c.dense_dilation) if (i + 1) % c.dense_period == 0
                                 else nn.Identity() for i in range(c.n_layer))
        return self.dwa

    def enter(self, x: torch.Tensor):
        x, _ = self.inner.enter(x)
        return x, [x]  # the block outputs so far: X_0 (the embedding), X_1, ...

    def after_block(self, i: int, x: torch.Tensor, pending: torch.Tensor | None, memory: list):
        x = finish(x, pending)  # the DWA reads whole block outputs
        memory.append(x)
        if isinstance(self.dwa[i], DepthWeightedAverage):
            x = self.dwa[i](memory)
        return x, None

    def leave(self, x: torch.Tensor, pending: torch.Tensor | None):
        return self.inner.leave(x, pending)
