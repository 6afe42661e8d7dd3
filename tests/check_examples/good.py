"""A correct LayerNorm, the way a learner would write it."""
import numpy as np
import torch
from torch import nn


class LayerNorm(nn.Module):
    def __init__(self, d_model, eps=1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d_model))
        self.bias = nn.Parameter(torch.zeros(d_model))
        self.eps = eps

    def forward(self, x):
        mean = x.mean(-1, keepdim=True)
        var = x.var(-1, unbiased=False, keepdim=True)
        return self.weight * (x - mean) / torch.sqrt(var + self.eps) + self.bias


class RMSNorm(nn.Module):
    def __init__(self, d_model, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d_model))
        self.eps = eps

    def forward(self, x):
        return self.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)


def layer_norm(x, gamma, beta, eps=1e-5):
    """Seed 002's NumPy LayerNorm."""
    mu = x.mean(-1, keepdims=True)
    var = x.var(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * gamma + beta


class ResidualBlock(nn.Module):
    def __init__(self, dim, eps=1e-5):
        super().__init__()
        self.ln = LayerNorm(dim, eps)

    def forward(self, x, sublayer_output):
        return x + sublayer_output


def apply_residual_connection(input_tensor, sublayer_output):
    return input_tensor + sublayer_output
