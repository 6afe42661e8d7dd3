"""The mistakes `addnorm check` must catch, each with the right hint."""
import torch
from torch import nn


class TutorialLayerNorm(nn.Module):
    """Seed 000's formulation: unbiased std, eps outside the square root."""

    def __init__(self, d_model, eps=1e-6):
        super().__init__()
        self.gamma = nn.Parameter(torch.ones(d_model))
        self.beta = nn.Parameter(torch.zeros(d_model))
        self.eps = eps

    def forward(self, x):
        mean = x.mean(-1, keepdim=True)
        std = x.std(-1, keepdim=True)
        return self.gamma * (x - mean) / (std + self.eps) + self.beta


class BatchNormInstead(nn.Module):
    """BatchNorm used where LayerNorm belongs: statistics over the batch."""

    def __init__(self, d_model):
        super().__init__()
        self.bn = nn.BatchNorm1d(d_model)
        self.weight, self.bias = self.bn.weight, self.bn.bias

    def forward(self, x):
        return self.bn(x.reshape(-1, x.shape[-1])).reshape(x.shape)


class ForgotResidual(nn.Module):
    def __init__(self, dim, eps=1e-5):
        super().__init__()
        self.ln = nn.LayerNorm(dim, eps=eps)

    def forward(self, x, sublayer_output):
        return sublayer_output  # the "x +" is missing


class SwappedGammaBeta(nn.Module):
    def __init__(self, d_model, eps=1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d_model))
        self.bias = nn.Parameter(torch.zeros(d_model))
        self.eps = eps

    def forward(self, x):
        xhat = (x - x.mean(-1, keepdim=True)) / torch.sqrt(x.var(-1, unbiased=False, keepdim=True) + self.eps)
        return self.bias * xhat + self.weight


class _Affine(nn.Module):
    def __init__(self, d, eps=1e-5, bias=True):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.bias = nn.Parameter(torch.zeros(d)) if bias else None
        self.eps = eps


class EpsOutsideRoot(_Affine):  # eps beside sqrt(var): invisible at variance 100, 5 % off at 10 eps
    def forward(self, x):
        m, v = x.mean(-1, keepdim=True), x.var(-1, unbiased=False, keepdim=True)
        return (x - m) / (torch.sqrt(v) + self.eps) * self.weight + self.bias


class NoEps(_Affine):
    def forward(self, x):
        m, v = x.mean(-1, keepdim=True), x.var(-1, unbiased=False, keepdim=True)
        return (x - m) / torch.sqrt(v) * self.weight + self.bias


class UnbiasedVariance(_Affine):  # eps inside the root, but D - 1
    def forward(self, x):
        m, v = x.mean(-1, keepdim=True), x.var(-1, unbiased=True, keepdim=True)
        return (x - m) / torch.sqrt(v + self.eps) * self.weight + self.bias


class RMSNoSqrt(_Affine):
    def __init__(self, d):
        super().__init__(d, eps=1e-6, bias=False)

    def forward(self, x):
        return x / (x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class RMSSumOfSquares(RMSNoSqrt):
    def forward(self, x):
        return x / torch.sqrt(x.pow(2).sum(-1, keepdim=True) + self.eps) * self.weight


class RMSEpsOutsideRoot(RMSNoSqrt):
    def forward(self, x):
        return x / (torch.sqrt(x.pow(2).mean(-1, keepdim=True)) + self.eps) * self.weight
