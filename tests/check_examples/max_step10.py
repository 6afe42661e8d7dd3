"""Seed 004's step 10, written against the current MAX API (max.experimental.nn.Module)."""
from max.experimental import functional as F
from max.experimental.nn import Module
from max.experimental.tensor import Tensor


class LayerNorm(Module):
    def __init__(self, dim, *, eps=1e-5):
        super().__init__()
        self.eps = eps
        self.weight = Tensor.ones([dim])
        self.bias = Tensor.zeros([dim])

    def forward(self, x):
        return F.layer_norm(x, gamma=self.weight, beta=self.bias, epsilon=self.eps)


class ResidualBlock(Module):
    def __init__(self, dim, eps=1e-5):
        super().__init__()
        self.ln = LayerNorm(dim, eps=eps)

    def forward(self, x, sublayer_output):
        return x + sublayer_output


class ForgotResidual(ResidualBlock):
    def forward(self, x, sublayer_output):
        return sublayer_output
