"""nGPT's regime: the stream lives on the unit sphere (``model/ngpt.py`` has the blocks and the math).

What the regime changes in GPT: no learned positions (attention rotates q and k, RoPE), nGPT's own blocks,
a separate output embedding with a learned logit scale s_z (eq. 3), the init on the sphere, and the weights
put back on it after every optimizer step (``GPT.normalize_``). Nothing happens between blocks: each block
leaves the stream normalized and nothing pending.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from ..errors import ConfigError
from ..ngpt import NormalizedBlock, Scale, normalize_ngpt_
from .base import Regime

# the GPTConfig fields that nGPT's blocks do not read, with their defaults: anything else would be ignored
_UNREAD = {"activation": ("gelu_tanh", "its MLP is SwiGLU"),
           "eps": (1e-5, "it normalizes by the L2 norm, with no norm layer"),
           "backend": (None, "it has no norm layer to run on a backend"),
           "embed_scale": (None, "its stream starts on the unit sphere, where a scale would take it off")}


class NormalizedStream(Regime):
    name = "ngpt"

    def __init__(self, config, placements):
        super().__init__(config, placements)
        self.s_z: Scale | None = None

    @classmethod
    def validate(cls, config, placements) -> None:
        if config.norm is not None:
            raise ConfigError(f"norm: nGPT normalizes by the L2 norm on the sphere and takes no norm kind, "
                              f"got norm={config.norm!r}")
        for field, (default, why) in _UNREAD.items():
            if getattr(config, field) != default:
                raise ConfigError(f"{field}: nGPT does not read it ({why}), got {field}={getattr(config, field)!r}")
        for p in placements:  # nGPT's blocks read none of these: refuse rather than ignore them
            for q in (p, p.for_mlp()):
                for field in ("before", "after_branch", "after_sum"):
                    if getattr(q, field) is not None:
                        raise ConfigError(f"placement: nGPT (residual='normalized') normalizes by the L2 norm "
                                          f"and takes no norm slot, got {field}={getattr(q, field)!r} in "
                                          f"placement {q.name!r}")
                for field in ("dense", "depth_scaled", "qkv_norm"):
                    if getattr(q, field):
                        raise ConfigError(f"placement: nGPT (residual='normalized') takes no {field}, "
                                          f"got {field}=True in placement {q.name!r}")

    def position_embedding(self) -> None:
        return None  # RoPE inside attention

    def block(self, layer_idx, placement) -> nn.Module:
        return NormalizedBlock(self.config, layer_idx, placement)

    def logit_scale(self) -> Scale:
        self.s_z = Scale(self.config.vocab_size, 1.0, 1.0 / math.sqrt(self.config.n_embd))
        return self.s_z

    def ties_output_embedding(self) -> bool:
        return False  # E_out is an embedding of its own, on the sphere

    def init_weights_(self, model: nn.Module) -> None:
        """N(0, 1/sqrt(d)), then every embedding-dimension vector put on the sphere."""
        for m in model.modules():
            if isinstance(m, nn.Linear | nn.Embedding):
                nn.init.normal_(m.weight, 0.0, 1.0 / math.sqrt(self.config.n_embd))
        self.normalize_(model)

    def normalize_(self, model: nn.Module) -> None:
        normalize_ngpt_(model)

    def logits(self, logits: torch.Tensor) -> torch.Tensor:
        return logits * self.s_z()
