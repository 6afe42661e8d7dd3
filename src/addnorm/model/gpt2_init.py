"""GPT-2's init, as functions over a built GPT (the regimes decide which of them a model gets)."""

from __future__ import annotations

import math

from torch import nn

from .placement import deepnorm_constants

STD = 0.02  # GPT-2's init: N(0, 0.02) for every Linear and Embedding weight


def gpt2_init_(model: nn.Module) -> None:
    """N(0, STD) for every Linear and Embedding weight, zero biases."""
    for m in model.modules():
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, 0.0, STD)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, 0.0, STD)


def scaled_residual_init_(blocks, n_layer: int) -> None:
    """N(0, 0.02/√(2·n_layer)) for the projections that write into the residual stream; DeepNorm layers get
    DeepNet's Xavier init with gain β instead, and LNS layers keep plain N(0, 0.02) (LNS's 1/√l takes the
    scaled init's place, as its paper says)."""
    _, beta = deepnorm_constants(n_layer)
    for block in blocks:
        if block.placement.residual == "scaled":
            a, f = block.attn.fn, block.mlp.fn
            q, k, v = a.c_attn.weight.data.chunk(3, dim=0)
            nn.init.xavier_normal_(q, gain=1.0)
            nn.init.xavier_normal_(k, gain=1.0)
            nn.init.xavier_normal_(v, gain=beta)
            for w in (a.c_proj.weight, f.c_fc.weight, f.c_proj.weight):
                nn.init.xavier_normal_(w, gain=beta)
        elif not block.placement.depth_scaled:
            for w in (block.attn.fn.c_proj.weight, block.mlp.fn.c_proj.weight):
                nn.init.normal_(w, 0.0, 0.02 / math.sqrt(2 * n_layer))
