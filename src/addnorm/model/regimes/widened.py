"""A widened residual stream (HC, mHC, mHC-lite): n copies of the embedding in, (B, T, n, C) through the
blocks -- each sub-layer's stream connection (``model/streams.py``) reads its input out of the n streams and
writes its output back --, the n streams summed before the final norm."""

from __future__ import annotations

import math

import torch

from ..errors import ConfigError, refuse_unless_default
from ..streams import finish, reduce_streams
from .base import DEFAULT_SINKHORN_ITERS, Regime

MHC_LITE_MAX_STREAMS = 6  # n! permutation matrices: 720 at n = 6, 40320 at n = 8


class WidenedStream(Regime):
    name = "widened"

    @classmethod
    def validate(cls, config, placements) -> None:
        n, stream = config.n_streams, placements[0].stream
        if n is not None:
            if isinstance(n, bool) or not isinstance(n, int):
                raise ConfigError(f"n_streams must be an integer, got {n!r} ({type(n).__name__})")
            if n < 1:
                raise ConfigError(f"n_streams must be >= 1, got {n}")
            if stream == "mhc_lite" and n > MHC_LITE_MAX_STREAMS:
                raise ConfigError(f"n_streams={n} is too wide for mhc_lite: it mixes all n! = {math.factorial(n)} "
                                  f"permutation matrices; use n_streams <= {MHC_LITE_MAX_STREAMS} or placement='mhc'")
        if stream != "mhc":
            refuse_unless_default(config, "sinkhorn_iters", DEFAULT_SINKHORN_ITERS, "the mhc placement")
        it = config.sinkhorn_iters
        if isinstance(it, bool) or not isinstance(it, int) or it < 1:
            raise ConfigError(f"sinkhorn_iters must be an integer >= 1, got {it!r}")

    def __init__(self, config, placements):
        super().__init__(config, placements)
        self.n, self.stream = config.streams, placements[0].stream

    def enter(self, x: torch.Tensor):
        B, T, C = x.shape
        return x.unsqueeze(-2).expand(B, T, self.n, C), None  # (B, T, n, C): n copies

    def leave(self, x: torch.Tensor, pending: torch.Tensor | None):
        return reduce_streams(finish(x, pending), self.stream), None  # (B, T, C)
