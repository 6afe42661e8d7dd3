"""A transformer block: an attention sub-layer then a feed-forward sub-layer, each with Add & Norm."""

from __future__ import annotations

import math

import torch
from torch import nn

from ..nn.factory import make_norm
from .placement import Placement, deepnorm_constants
from .attention import MultiHeadAttention
from .feedforward import FeedForward
from .streams import PendingWrite, finish, make_connection
from .sublayer import ResidualSubLayer
from .value_residual import FirstValues


class TransformerBlock(nn.Module):
    """Pre-norm (GPT-2) by default: ``x = x + attn(ln_1(x)); x = x + mlp(ln_2(x))``.

    The placement (``config.placement``, resolved for ``layer_idx``) decides where the norms sit.
    ``forward(x)`` returns the new stream; ``forward(x, pending=p, stream=True)`` is the fused protocol
    (see ``ResidualSubLayer``) that ``GPT`` uses between blocks. With a widened stream (hc, mhc,
    mhc_lite) ``x`` is (B, T, n, C) and each sub-layer has its own stream connection.
    """

    def __init__(self, config, layer_idx: int = 0, placement: Placement | None = None):
        """``config``: a GPTConfig (not imported here: the config imports the regimes that build blocks)."""
        super().__init__()
        c = config
        self.layer_idx = layer_idx
        self.placement = p = placement or c.placements()[layer_idx]
        alpha = deepnorm_constants(c.n_layer)[0] if p.residual == "scaled" else 1.0
        kw = dict(eps=c.eps, bias=c.bias, alpha=alpha, backend=c.backend,
                  depth_scale=1.0 / math.sqrt(layer_idx + 1) if p.depth_scaled else 1.0)
        qkv_norm = (lambda: make_norm(c.norm, c.n_embd // c.n_head, c.eps, bias=c.bias, backend=c.backend,  # noqa: E731
                                      alpha=c.slot_alpha("attn") if c.norm in ("dyt", "derf") else None)
                    ) if p.qkv_norm else None
        attn = MultiHeadAttention(c.n_embd, c.n_head, c.bias, c.dropout, qkv_norm=qkv_norm,
                                  value_residual=c.value_residual, first_layer=layer_idx == 0)
        self.attn = ResidualSubLayer(attn, c.n_embd, p, norm_alpha=c.slot_alpha("attn"),
                                     streams=make_connection(c, p, 2 * layer_idx), **kw)
        pm = p.for_mlp()
        self.mlp = ResidualSubLayer(FeedForward(c.n_embd, c.ff_dim, c.activation, c.bias, c.dropout), c.n_embd,
                                    pm, norm_alpha=c.slot_alpha("mlp"), streams=make_connection(c, pm, 2 * layer_idx + 1),
                                    **kw)

    def forward(self, x: torch.Tensor, attention_mask: torch.Tensor | None = None, *, pending=None,
                stream: bool = False, values: FirstValues | None = None):
        """The new stream; with ``stream=True`` the fused protocol: ``(stream, pending)`` in and out.

        GPT calls blocks through ``__call__`` with ``stream=True``, so module hooks (FSDP2's
        ``fully_shard`` per block, forward hooks, activation checkpointing wrappers) see every block.
        ``values`` carries the first layer's attention values to later layers (``value_residual``).
        """
        x, pending = self.attn(x, pending, attention_mask=attention_mask, values=values)
        x, pending = self.mlp(x, pending)
        if isinstance(pending, PendingWrite):
            # a widened stream's last write is done here, not handed to the next block: what wraps a block (a
            # hook, reentrant checkpointing, which sees only the tensors a block returns) would not see the
            # tensors inside it
            x, pending = finish(x, pending), None
        if stream:
            return x, pending
        return finish(x, pending)

    def forward_stream(self, x, pending=None, attention_mask=None, values=None):
        return self(x, attention_mask, pending=pending, stream=True, values=values)
