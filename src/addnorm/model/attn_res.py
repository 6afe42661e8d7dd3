"""Attention Residuals (Kimi Team 2026, arXiv:2603.15031): each sub-layer's input is a softmax over depth of the
earlier sub-layers' outputs instead of their sum.

The paper counts every attention and every MLP as a layer; sub-layer l (1-based, L = 2 n_layer of them) reads

    h_l = sum_i alpha_{i->l} v_i,   alpha_{i->l} = softmax_i(w_l^T RMSNorm(v_i))        (eqs. 2-4)

over the sources v_i: in Full AttnRes the token embedding h_1 and every earlier sub-layer output f_i(h_i)
(eq. 3); in Block AttnRes, with blocks of S sub-layers, the embedding b_0, the completed block sums b_1 ..
b_{n-1} and the current block's partial sum (eqs. 5-6) -- S = 1 is Full AttnRes. The sub-layer then computes
f_l(h_l) = F(Norm(h_l)), its own pre-norm kept. w_l starts at zero, so every source starts with equal weight.
After the last sub-layer, one more AttnRes with its own query aggregates every block (section 3.2); the
final norm reads that.

In GPT's ``(stream, pending)`` protocol the stream is the list of completed block representations
[b_0, ..., b_{n-1}] and pending the current block's partial sum (None at a block boundary): a block takes
and returns that pair. ``model/regimes/attn_res.py`` enters and leaves it.
"""

from __future__ import annotations

import torch
from torch import nn

from ..functional.attn_res import attn_res
from ..nn.factory import POINTWISE_KINDS, make_norm
from .attention import MultiHeadAttention
from .feedforward import FeedForward
from .placement import Placement
from .value_residual import FirstValues


def block_size(config) -> int:
    """S, the sub-layers per block: ``attn_res_block``, or 1 (Full AttnRes: every sub-layer its own block)."""
    return config.attn_res_block or 1


def depth_sources(blocks: list[torch.Tensor], partial: torch.Tensor | None) -> list[torch.Tensor]:
    """Eq. 6: the completed blocks, and the current block's partial sum unless a block starts here."""
    return blocks if partial is None else [*blocks, partial]


class DepthAttention(nn.Module):
    """One AttnRes: h = sum_i softmax_i(query^T RMSNorm(v_i)) v_i over the sources v_i (eqs. 2-4).

    ``query`` is the pseudo-query w_l (zero at init: the uniform average); ``weight`` the key RMSNorm's weight
    (ones at init), as the official code's per-layer norm module has one.
    """

    def __init__(self, dim: int, eps: float = 1e-5, backend: str | None = None):
        super().__init__()
        self.eps, self.backend = eps, backend
        self.query = nn.Parameter(torch.zeros(dim))
        self.weight = nn.Parameter(torch.ones(dim))

    def reset_parameters(self) -> None:
        with torch.no_grad():
            self.query.zero_()
            self.weight.fill_(1.0)

    def forward(self, sources: list[torch.Tensor]) -> torch.Tensor:
        return attn_res(sources, self.query, self.weight, self.eps, backend=self.backend)

    def extra_repr(self) -> str:
        return f"{self.query.numel()}, eps={self.eps:g}"


class AttnResSubLayer(nn.Module):
    """Sub-layer l: its input read over depth, its branch F(Norm(h)), its output added to the block's partial sum
    (eq. 5) and moved into the completed blocks at a block boundary.

    The model's first sub-layer has one source, the embedding (its softmax weight is 1), so it has no query.
    """

    def __init__(self, fn: nn.Module, config, placement: Placement, index: int, *, norm_alpha: float | None = None):
        super().__init__()
        c = config
        self.index = index  # l - 1: 0-based over the 2 n_layer sub-layers
        self.boundary = (index + 1) % block_size(c) == 0  # the last sub-layer of its block
        self.fn = fn
        self.attn_res = None if index == 0 else DepthAttention(c.n_embd, c.eps, c.backend)
        kind = placement.before
        self.norm_before = make_norm(kind, c.n_embd, c.eps, bias=c.bias, backend=c.backend,
                                     alpha=norm_alpha if kind in POINTWISE_KINDS else None)

    def forward(self, blocks: list[torch.Tensor], partial: torch.Tensor | None, **fn_kwargs):
        """(completed blocks, partial sum) -> (completed blocks, partial sum), after this sub-layer."""
        sources = depth_sources(blocks, partial)
        h = sources[0] if self.attn_res is None else self.attn_res(sources)
        f = self.fn(self.norm_before(h)[0], **fn_kwargs)
        partial = f if partial is None else partial + f  # b_n^i = b_n^{i-1} + f_l(h_l)
        if self.boundary:
            return [*blocks, partial], None
        return blocks, partial

    def extra_repr(self) -> str:
        return f"sub-layer {self.index + 1}{', ends a block' if self.boundary else ''}"


class AttnResBlock(nn.Module):
    """A transformer block under Attention Residuals: attention then feed-forward, each an ``AttnResSubLayer``.

    ``forward(blocks, attention_mask, pending=partial, stream=True)`` takes and returns the depth state
    (completed block representations, the current block's partial sum); GPT calls it so.
    """

    def __init__(self, config, layer_idx: int, placement: Placement):
        super().__init__()
        c = config
        self.layer_idx, self.placement = layer_idx, placement
        attn = MultiHeadAttention(c.n_embd, c.n_head, c.bias, c.dropout, value_residual=c.value_residual,
                                  first_layer=layer_idx == 0)
        self.attn = AttnResSubLayer(attn, c, placement, 2 * layer_idx, norm_alpha=c.slot_alpha("attn"))
        self.mlp = AttnResSubLayer(FeedForward(c.n_embd, c.ff_dim, c.activation, c.bias, c.dropout), c,
                                   placement.for_mlp(), 2 * layer_idx + 1, norm_alpha=c.slot_alpha("mlp"))

    def forward(self, x, attention_mask: torch.Tensor | None = None, *, pending=None, stream: bool = False,
                values: FirstValues | None = None):
        if not stream or not isinstance(x, list):
            raise TypeError("an Attention Residuals block reads the depth state, not one stream: call it with "
                            "stream=True and x the list of completed block representations [b_0, ...] (the "
                            "embedding first), pending the current block's partial sum or None, as GPT does")
        if not torch.is_grad_enabled() and any(t.requires_grad for t in x):
            # tensors that want a gradient, read with autograd off: the first pass of reentrant activation
            # checkpointing, which tracks the tensors handed to it and not those inside this list -- their gradients
            # would come out wrong without a word
            raise RuntimeError("Attention Residuals: the depth state's tensors need a gradient but this block runs "
                               "without autograd. Reentrant activation checkpointing does this, and it does not track "
                               "the tensors inside the depth-state list: use torch.utils.checkpoint(..., "
                               "use_reentrant=False). Running a block under no_grad on a depth state that needs a "
                               "gradient does it too: to freeze blocks, set their parameters' requires_grad_(False) "
                               "instead")
        x, pending = self.attn(x, pending, attention_mask=attention_mask, values=values)
        return self.mlp(x, pending)
