"""The complete transformer block: shape preserved, parameter counts, output differs from input."""

from __future__ import annotations

import torch

from ...model import GPTConfig, MultiHeadAttention, ResidualSubLayer, TransformerBlock
from ...model.placement import PLACEMENTS


def run(seed: int = 0) -> dict:
    torch.manual_seed(seed)
    block = TransformerBlock(GPTConfig(n_embd=512, n_head=8, d_ff=2048, activation="relu", n_layer=1))
    x = torch.randn(2, 10, 512)
    with torch.no_grad():
        y = block(x)
    sub = ResidualSubLayer(MultiHeadAttention(512, 8), 512, PLACEMENTS["post"].with_norm("layer"))
    parts = {name: sum(p.numel() for p in m.parameters()) for name, m in (
        ("attention", block.attn.fn), ("feed_forward", block.mlp.fn), ("norms", torch.nn.ModuleList(
            [block.attn.norm_before, block.mlp.norm_before])))}
    return {
        "input_shape": list(x.shape), "output_shape": list(y.shape), "shape_preserved": list(x.shape) == list(y.shape),
        "block_parameters": sum(p.numel() for p in block.parameters()),
        "seed000_expected": 3_152_384,
        "attention_sublayer_parameters": sum(p.numel() for p in sub.parameters()),
        "seed002_expected": 1_051_648,
        "parts": parts,
        "mean_abs_difference": (y - x).abs().mean().item(),
    }
