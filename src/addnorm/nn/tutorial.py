"""Seed 000's tutorial LayerNorm, kept under a name that says it is not torch.nn.LayerNorm."""

from __future__ import annotations

import torch
from torch import nn

from .. import functional as AF


class TutorialLayerNorm(nn.Module):
    r"""y = weight * (x - mean) / (std_unbiased + eps) + bias   -- the common tutorial pitfall.

    Differs from ``torch.nn.LayerNorm`` twice: Bessel-corrected std (1/(D-1)) and eps outside the
    square root. See ``addnorm.functional.tutorial_layer_norm`` and docs/tutorial_pitfall.md.
    """

    def __init__(self, d_model: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d_model))
        self.bias = nn.Parameter(torch.zeros(d_model))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return AF.tutorial_layer_norm(x, self.weight, self.bias, self.eps)
