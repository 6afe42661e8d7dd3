"""The residual stream's model-wide form, as one strategy: how GPT carries the stream from the embedding to the
final norm.

A placement says what happens inside each block; a regime says what flows *between* them. GPT's forward is
nanoGPT's loop with three calls into it::

    x, memory = regime.enter(embedding)                 # the stream the blocks carry
    for i, block in enumerate(blocks):
        x, pending = block(x, pending=pending, ...)
        x, pending = regime.after_block(i, x, pending, memory)
    x, pending = regime.leave(x, pending)               # one (B, T, C) stream for the final norm

``memory`` is what a regime keeps across the blocks of one forward pass (DenseFormer's block outputs), never
state on the regime itself, so a regime may serve any number of calls at once. ``pending`` is the ``(stream,
pending)`` protocol of ``ResidualSubLayer``: a branch output not yet added, which the next norm adds in its
fused pass.

A regime also builds the parts of GPT that only it needs (learned positions, the blocks, DenseFormer's
averages, nGPT's logit scale: GPT registers them under the names checkpoints use), initialises what its paper
initialises, and validates the GPTConfig fields that only it reads. It holds no parameters itself.

This base class is the plain regime, one (B, T, C) stream (GPT-2's); ``SingleStream`` names it.
"""

from __future__ import annotations

import torch
from torch import nn

from ..block import TransformerBlock
from ..gpt2_init import scaled_residual_init_
from ..placement import Placement

DEFAULT_SINKHORN_ITERS = 20  # GPTConfig.sinkhorn_iters' default (mHC's t_max): only mhc reads it


class Regime:
    """One (B, T, C) stream: the embedding goes in as it is, nothing happens between blocks."""

    name = "single"

    def __init__(self, config, placements: list[Placement]):
        self.config, self.placements = config, placements

    # --- validation: the GPTConfig fields this regime reads, or refuses because it would ignore them

    @classmethod
    def validate(cls, config, placements: list[Placement]) -> None:
        """Refuse the GPTConfig fields this regime reads at values it cannot take (ConfigError)."""

    # --- the parts of GPT this regime builds (GPT calls these in the order it registers its modules)

    def position_embedding(self) -> nn.Module | None:
        c = self.config
        return nn.Embedding(c.block_size, c.n_embd)

    def block(self, layer_idx: int, placement: Placement) -> nn.Module:
        return TransformerBlock(self.config, layer_idx, placement)

    def between_blocks(self) -> nn.Module | None:
        """Modules that act between blocks (DenseFormer's averages), registered by GPT as ``dwa``."""
        return None

    def after_blocks(self) -> nn.Module | None:
        """Modules that act after the last block (Attention Residuals' final aggregation), registered by GPT as
        ``attn_res``."""
        return None

    def logit_scale(self) -> nn.Module | None:
        """A learned scale on the logits (nGPT's s_z), registered by GPT as ``s_z``."""
        return None

    def ties_output_embedding(self) -> bool:
        """Does the LM head share the token embedding? GPT-2's, unless ``tie_weights=False``."""
        return self.config.tie_weights

    # --- init: after GPT-2's N(0, 0.02) over every Linear and Embedding (``gpt2_init_``)

    def init_weights_(self, model: nn.Module) -> None:
        scaled_residual_init_(model.h, self.config.n_layer)

    def normalize_(self, model: nn.Module) -> None:
        """Put the weights back where the regime keeps them after an optimizer step (nothing here)."""

    # --- the stream

    def enter(self, x: torch.Tensor):
        """The embedding (B, T, C) -> (the stream the first block reads, the memory kept across blocks)."""
        return x, None

    def after_block(self, i: int, x: torch.Tensor, pending: torch.Tensor | None, memory):
        """(stream, pending) after block i -> (stream, pending) for block i + 1."""
        return x, pending

    def leave(self, x: torch.Tensor, pending: torch.Tensor | None):
        """The last block's (stream, pending) -> a (B, T, C) stream and its pending branch, for the final norm."""
        return x, pending

    def logits(self, logits: torch.Tensor) -> torch.Tensor:
        return logits


SingleStream = Regime

