"""A transformer block: an attention sub-layer then a feed-forward sub-layer, each with Add & Norm."""

from __future__ import annotations

import torch
from torch import nn

from ..placement import Placement, deepnorm_constants
from .attention import MultiHeadAttention
from .config import GPTConfig
from .feedforward import FeedForward
from .sublayer import ResidualSubLayer


class TransformerBlock(nn.Module):
    """Pre-norm (GPT-2) by default: ``x = x + attn(ln_1(x)); x = x + mlp(ln_2(x))``.

    The placement (``config.placement``, resolved for ``layer_idx``) decides where the norms sit.
    ``forward(x)`` returns the new stream; ``forward(x, pending=p, stream=True)`` is the fused protocol
    (see ``ResidualSubLayer``) that ``GPT`` uses between blocks.
    """

    def __init__(self, config: GPTConfig, layer_idx: int = 0, placement: Placement | None = None):
        super().__init__()
        c = config
        self.placement = placement or c.placements()[layer_idx]
        alpha = deepnorm_constants(c.n_layer)[0] if self.placement.residual == "scaled" else 1.0
        kw = dict(eps=c.eps, bias=c.bias, alpha=alpha, backend=c.backend)
        self.attn = ResidualSubLayer(MultiHeadAttention(c.n_embd, c.n_head, c.bias, c.dropout), c.n_embd,
                                     self.placement, **kw)
        self.mlp = ResidualSubLayer(FeedForward(c.n_embd, c.ff_dim, c.activation, c.bias, c.dropout), c.n_embd,
                                    self.placement, **kw)

    def forward(self, x: torch.Tensor, attention_mask: torch.Tensor | None = None, *, pending=None,
                stream: bool = False):
        """The new stream; with ``stream=True`` the fused protocol: ``(stream, pending)`` in and out.

        GPT calls blocks through ``__call__`` with ``stream=True``, so module hooks (FSDP2's
        ``fully_shard`` per block, forward hooks, activation checkpointing wrappers) see every block.
        """
        x, pending = self.attn(x, pending, attention_mask=attention_mask)
        x, pending = self.mlp(x, pending)
        if stream:
            return x, pending
        return x if pending is None else x + pending

    def forward_stream(self, x, pending=None, attention_mask=None):
        return self(x, attention_mask, pending=pending, stream=True)
