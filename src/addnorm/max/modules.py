"""MAX modules mirroring addnorm.nn: parameters named like HuggingFace GPT-2's (``weight``/``bias``),
initialised with ``Tensor.ones`` / ``Tensor.zeros`` as in seed 004."""

from __future__ import annotations

from max.experimental import functional as F
from max.experimental.nn import Module
from max.experimental.tensor import Tensor


class LayerNorm(Module):
    r"""y = (x - E[x]) / sqrt(Var[x] + eps) * weight + bias, over the last dim (GPT-2's LayerNorm)."""

    def __init__(self, dim: int, *, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = Tensor.ones([dim])  # gamma
        self.bias = Tensor.zeros([dim])  # beta

    def forward(self, x: Tensor) -> Tensor:
        return F.layer_norm(x, gamma=self.weight, beta=self.bias, epsilon=self.eps)


class RMSNorm(Module):
    r"""y = x / sqrt(mean(x²) + eps) * (weight + weight_offset); ``weight_offset=1`` is Gemma's convention,
    ``multiply_before_cast=False`` Llama's cast order (as in ``addnorm.rms_norm``'s ``cast_before_weight``)."""

    def __init__(self, dim: int, *, eps: float = 1e-6, weight_offset: float = 0.0, multiply_before_cast: bool = True):
        super().__init__()
        self.eps, self.weight_offset, self.multiply_before_cast = eps, weight_offset, multiply_before_cast
        self.weight = Tensor.zeros([dim]) if weight_offset else Tensor.ones([dim])

    def forward(self, x: Tensor) -> Tensor:
        return F.rms_norm(x, self.weight, self.eps, weight_offset=self.weight_offset,
                          multiply_before_cast=self.multiply_before_cast)


class AddLayerNorm(LayerNorm):
    """Add & Norm: ``(x, residual) -> (LayerNorm(x + residual), x + residual)``."""

    def forward(self, x: Tensor, residual: Tensor | None = None):
        s = x if residual is None else x + residual
        return F.layer_norm(s, gamma=self.weight, beta=self.bias, epsilon=self.eps), s


class AddRMSNorm(RMSNorm):
    """Add & Norm with RMSNorm: ``(x, residual) -> (RMSNorm(x + residual), x + residual)``."""

    def forward(self, x: Tensor, residual: Tensor | None = None):
        s = x if residual is None else x + residual
        return super().forward(s), s


class ResidualBlock(Module):
    """Seed 004's residual block: holds the LayerNorm a transformer sub-layer uses, adds the skip path."""

    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.ln = LayerNorm(dim, eps=eps)

    def forward(self, x: Tensor, sublayer_output: Tensor) -> Tensor:
        # in a full block: x = x + sublayer(self.ln(x))
        return x + sublayer_output


def apply_residual_connection(input_tensor: Tensor, sublayer_output: Tensor) -> Tensor:
    """The residual connection on its own: input + sublayer output."""
    return input_tensor + sublayer_output
