"""LayerNorm: a drop-in for ``torch.nn.LayerNorm`` (same constructor, parameters, state_dict keys)."""

from __future__ import annotations

import torch
from torch import nn

from .. import functional as AF
from ..functional.core import check_eps
from ._shape import as_normalized_shape


class LayerNorm(nn.Module):
    r"""y = (x - E[x]) / sqrt(Var[x] + eps) * weight + bias   (Ba, Kiros & Hinton 2016, arXiv:1607.06450)

    Statistics over the last ``len(normalized_shape)`` dims with the biased variance; ``weight``
    starts at ones and ``bias`` at zeros. ``bias=False`` creates no bias at all. ``backend`` pins
    a backend ("cpu", "torch"); ``None`` follows ``addnorm.use_backend`` (default "auto").
    """

    __constants__ = ["normalized_shape", "eps", "elementwise_affine"]

    def __init__(self, normalized_shape, eps: float = 1e-5, elementwise_affine: bool = True, bias: bool = True,
                 device=None, dtype=None, *, backend: str | None = None) -> None:
        super().__init__()
        self.normalized_shape = as_normalized_shape(normalized_shape)
        self.eps = check_eps(eps)
        self.elementwise_affine = elementwise_affine
        self.backend = backend
        kw = {"device": device, "dtype": dtype}
        self.register_parameter("weight", nn.Parameter(torch.empty(self.normalized_shape, **kw)) if elementwise_affine else None)
        self.register_parameter("bias", nn.Parameter(torch.empty(self.normalized_shape, **kw)) if elementwise_affine and bias else None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        if self.weight is not None:
            nn.init.ones_(self.weight)
        if self.bias is not None:
            nn.init.zeros_(self.bias)

    def forward(self, input: torch.Tensor) -> torch.Tensor:  # torch.nn.LayerNorm's name: module(input=x) works
        return AF.layer_norm(input, self.normalized_shape, self.weight, self.bias, self.eps, backend=self.backend)

    def extra_repr(self) -> str:
        return (f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}, "
                f"bias={self.bias is not None}")
