"""Attention Residuals' regime (``model/attn_res.py`` has the blocks and the math): what flows between the blocks
is the depth state -- the completed block representations [b_0 = the embedding, b_1, ...] as the stream and the
current block's partial sum as pending -- and after the last block one more AttnRes, with a query of its own,
aggregates every block into the (B, T, C) stream the final norm reads (arXiv:2603.15031, section 3.2).

Its option: ``attn_res_block``, the sub-layers per block (the paper's S; None: Full AttnRes). The placement's
norm slots are fixed by the paper -- a pre-norm inside every sub-layer, no residual add to norm, a final norm --
and any other choice is refused rather than ignored.
"""

from __future__ import annotations

import numbers

import torch
from torch import nn

from ..attn_res import AttnResBlock, DepthAttention, depth_sources
from ..errors import ConfigError
from .base import Regime

# the Placement fields whose value Attention Residuals fixes, with that value and why
_FIXED = {"after_branch": (None, "its sub-layer output is a source of the depth softmax as it is"),
          "after_sum": (None, "there is no residual sum: the depth softmax replaces it"),
          "residual": ("add", "the depth softmax replaces the residual form"),
          "stream": ("single", "its sources are (B, T, C) tensors"),
          "dense": (False, "DenseFormer's averages are another depth mix"),
          "depth_scaled": (False, "LayerNorm Scaling is a form of the summed stream"),
          "qkv_norm": (False, "HybridNorm's attention is a form of its own"),
          "final_norm": (True, "the paper's model ends with a norm after the final aggregation")}


class AttnResStream(Regime):
    name = "attn_res"

    def __init__(self, config, placements):
        super().__init__(config, placements)
        self.out: DepthAttention | None = None

    @classmethod
    def validate(cls, config, placements) -> None:
        S = config.attn_res_block
        if S is not None and (isinstance(S, bool) or not isinstance(S, numbers.Integral) or S < 1):
            raise ConfigError(f"attn_res_block must be None (Full AttnRes) or an integer >= 1 (sub-layers per "
                              f"block: Block AttnRes), got {S!r}")
        for p in placements:
            for q in (p, p.for_mlp()):
                if q.before is None:
                    raise ConfigError(f"placement: Attention Residuals normalises each sub-layer's input (its "
                                      f"pre-norm, 'before'), got before=None in placement {q.name!r}")
                for field, (want, why) in _FIXED.items():
                    if getattr(q, field) != want:
                        raise ConfigError(f"placement: Attention Residuals needs {field}={want!r} ({why}), got "
                                          f"{field}={getattr(q, field)!r} in placement {q.name!r}")

    def block(self, layer_idx, placement) -> nn.Module:
        return AttnResBlock(self.config, layer_idx, placement)

    def after_blocks(self) -> DepthAttention:
        c = self.config
        self.out = DepthAttention(c.n_embd, c.eps, c.backend)
        return self.out

    def enter(self, x: torch.Tensor):
        return [x], None  # b_0 = h_1, the token embedding: a source of every layer

    def leave(self, x: list, pending: torch.Tensor | None):
        return self.out(depth_sources(x, pending)), None
