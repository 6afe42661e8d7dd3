"""Dynamic erf (Derf; arXiv:2512.10938, "Stronger Normalization-Free Transformers")."""

from __future__ import annotations

import torch
from torch import nn

from ..functional import pointwise as PF
from ._shape import as_normalized_shape
from .scalars import ScalarParameters, scalar_parameter


class Derf(ScalarParameters):
    r"""y = weight * erf(alpha * x + shift) + bias -- an element-wise stand-in for a norm layer.

    ``alpha`` and ``shift`` are learnable scalars of shape (1,) (init ``alpha_init``, ``shift_init``); ``weight``
    and ``bias`` are per-channel like LayerNorm's, so it drops into any norm slot. Like DyT it
    computes no statistics: it bounds each element, it does not centre or rescale a row.
    """

    def __init__(self, normalized_shape, alpha_init: float = 0.5, shift_init: float = 0.0, bias: bool = True,
                 device=None, dtype=None) -> None:
        super().__init__()
        self.normalized_shape = as_normalized_shape(normalized_shape)
        self.alpha_init, self.shift_init = float(alpha_init), float(shift_init)
        kw = {"device": device, "dtype": dtype}
        self.alpha = scalar_parameter(**kw)
        self.shift = scalar_parameter(**kw)
        self.weight = nn.Parameter(torch.empty(self.normalized_shape, **kw))
        self.bias = nn.Parameter(torch.empty(self.normalized_shape, **kw)) if bias else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.constant_(self.alpha, self.alpha_init)
        nn.init.constant_(self.shift, self.shift_init)
        nn.init.ones_(self.weight)
        if self.bias is not None:
            nn.init.zeros_(self.bias)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None, *, out_scale: float = 1.0):
        """Same calling convention as the fused Add & Norm modules: returns (y, x + residual); ``out_scale``
        multiplies y (folded into weight and bias)."""
        w, b = self.weight, self.bias
        if out_scale != 1.0:
            w, b = w * out_scale, (None if b is None else b * out_scale)
        return PF.add_derf(x, residual, self.alpha, self.shift, w, b)  # fused with the add: one pass

    def add_to(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """Norm-then-add: residual + self(x)."""
        return residual + self(x)[0]

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, alpha_init={self.alpha_init}, shift_init={self.shift_init}"
