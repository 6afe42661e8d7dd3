"""Seed 000 Part 3, on real computation: input -> sub-layer output -> add -> norm, and a "wild" vector."""

from __future__ import annotations

import torch

from ..walkthrough import WalkthroughConfig, run_walkthrough
from ... import functional as AF


def run(seed: int = 0) -> dict:
    w = run_walkthrough(WalkthroughConfig(text="Residual connections keep deep transformers trainable", d_model=64,
                                          n_head=4, seed=seed))
    pos = len(w.tokens) // 2  # one real position's vector through the four stages
    stages = [{"name": s.name, "values": s.values[pos], "mean": s.mean[pos], "std": s.std[pos]} for s in w.stages]
    g = torch.Generator().manual_seed(seed)
    wild = torch.randn(64, generator=g, dtype=torch.float64) * 10 + 5  # seed 000's "wild" distribution
    normed = AF.layer_norm(wild.float(), 64).double()
    return {
        "tokens": w.tokens,
        "position": pos,
        "backend": w.backend,
        "stages": stages,
        "per_position": [{"name": s.name, "mean": s.mean, "std": s.std} for s in w.stages],
        "wild": {"before": wild.tolist(), "after": normed.tolist(),
                 "before_mean": wild.mean().item(), "before_std": wild.std(unbiased=False).item(),
                 "after_mean": normed.mean().item(), "after_std": normed.std(unbiased=False).item()},
    }
