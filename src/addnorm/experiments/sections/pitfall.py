"""The tutorial pitfall (unbiased std, eps outside the root) vs torch.nn.LayerNorm, measured."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ... import functional as AF


def run(seed: int = 1, d: int = 768) -> dict:
    rows = []
    for std in (1.0, 1e-1, 1e-2, 3e-3, 1e-3, 1e-4):
        x = std * torch.randn(64, d, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
        tut = AF.tutorial_layer_norm(x, eps=1e-6).double()
        ref = F.layer_norm(x, (d,), eps=1e-5)
        rows.append({"input_std": std, "max_abs_diff": (tut - ref).abs().max().item(),
                     "std_ratio": (tut.std(-1, unbiased=False) / ref.std(-1, unbiased=False)).mean().item(),
                     "torch_output_std": ref.std(-1, unbiased=False).mean().item()})
    return {"d": d, "rows": rows, "bessel_factor_d768": ((d - 1) / d) ** 0.5, "bessel_factor_d8": (7 / 8) ** 0.5}
