"""Statistics of activations: per row over the features, then averaged over rows."""

from __future__ import annotations

import torch


@torch.no_grad()
def tensor_stats(t: torch.Tensor) -> dict[str, float]:
    """mean / std over the last dim (averaged over rows), RMS and max |x| over everything."""
    t = t.detach().float()
    if t.numel() == 0:
        return {"mean": float("nan"), "std": float("nan"), "rms": float("nan"), "max_abs": float("nan")}
    rows = t.reshape(-1, t.shape[-1])
    return {
        "mean": rows.mean(-1).mean().item(),
        "std": rows.std(-1, unbiased=False).mean().item(),
        "rms": rows.pow(2).mean().sqrt().item(),
        "max_abs": rows.abs().max().item(),
    }
