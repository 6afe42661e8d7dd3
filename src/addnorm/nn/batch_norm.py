"""BatchNorm in a transformer's norm slot (seed 002's pitfall 2), for measuring what it does there."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class BatchNormSlot(nn.Module):
    r"""BatchNorm over every position of every sequence: per feature, statistics over batch x time.

    Training normalizes with the batch's own statistics and updates running ones; eval uses the running
    statistics. In a causal language model the training-time statistics mix every position of every
    sequence, later ones included, so a token's output depends on text it is not supposed to have seen yet:
    training and evaluation compute different functions (``addnorm study`` measures the gap).
    Same calling convention as the fused Add & Norm modules: ``(x, residual=None) -> (y, x + residual)``.
    """

    def __init__(self, dim: int, eps: float = 1e-5, momentum: float = 0.1, bias: bool = True) -> None:
        super().__init__()
        self.dim, self.eps, self.momentum = dim, eps, momentum
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim)) if bias else None
        self.register_buffer("running_mean", torch.zeros(dim))
        self.register_buffer("running_var", torch.ones(dim))

    def reset_parameters(self) -> None:
        """Weight 1, bias 0 and fresh running statistics, as torch.nn.BatchNorm1d's."""
        with torch.no_grad():
            self.weight.fill_(1.0)
            if self.bias is not None:
                self.bias.zero_()
            self.running_mean.zero_()
            self.running_var.fill_(1.0)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None, *, out_scale: float = 1.0):
        s = x if residual is None else x + residual
        flat = s.reshape(-1, self.dim)
        w, b = self.weight, self.bias
        if out_scale != 1.0:
            w, b = w * out_scale, (None if b is None else b * out_scale)
        y = F.batch_norm(flat, self.running_mean, self.running_var, w, b, self.training, self.momentum, self.eps)
        return y.view(s.shape), s

    def add_to(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """Norm-then-add: residual + self(x)."""
        return residual + self(x)[0]

    def extra_repr(self) -> str:
        return f"{self.dim}, eps={self.eps}, momentum={self.momentum}, statistics over batch x time"
