"""The position-wise feed-forward network: Linear -> activation -> Linear."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

_ACT = {
    "gelu_tanh": lambda t: F.gelu(t, approximate="tanh"),  # GPT-2
    "gelu": F.gelu,
    "relu": F.relu,  # Vaswani et al. 2017, seeds 000/002
}


class FeedForward(nn.Module):
    r"""FFN(x) = act(x W₁ + b₁) W₂ + b₂, with GPT-2's names ``c_fc`` and ``c_proj``."""

    def __init__(self, n_embd: int, d_ff: int, activation: str = "gelu_tanh", bias: bool = True, dropout: float = 0.0):
        super().__init__()
        if activation not in _ACT:
            raise ValueError(f"activation must be one of {tuple(_ACT)}, got {activation!r}")
        self.activation = activation
        self.c_fc = nn.Linear(n_embd, d_ff, bias=bias)
        self.c_proj = nn.Linear(d_ff, n_embd, bias=bias)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.c_proj(_ACT[self.activation](self.c_fc(x))))
