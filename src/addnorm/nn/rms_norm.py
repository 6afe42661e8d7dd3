"""RMSNorm: a drop-in for ``torch.nn.RMSNorm``, plus the HuggingFace conventions as named options."""

from __future__ import annotations

import torch
from torch import nn

from .. import functional as AF
from ..functional.core import check_eps
from ._shape import as_normalized_shape


class RMSNorm(nn.Module):
    r"""y = x / sqrt(mean(x²) + eps) * (weight + offset)   (Zhang & Sennrich 2019, arXiv:1910.07467)

    Same constructor and ``state_dict`` as ``torch.nn.RMSNorm``; ``eps=None`` means
    ``torch.finfo(float32).eps`` for half/float inputs, as there. Keyword-only extras:

    * ``zero_centered=True``: Gemma's weight, stored as ``w`` and applied as ``1 + w``; it starts
      at zeros (so the layer starts as the identity scale, like the default).
    * ``cast_before_weight=True``: Llama's order (normalize in float32, cast to the input dtype,
      then multiply by the weight); the default multiplies in float32 and casts once.
    """

    __constants__ = ["normalized_shape", "eps", "elementwise_affine"]

    def __init__(self, normalized_shape, eps: float | None = None, elementwise_affine: bool = True, device=None,
                 dtype=None, *, zero_centered: bool = False, cast_before_weight: bool = False,
                 backend: str | None = None) -> None:
        super().__init__()
        self.normalized_shape = as_normalized_shape(normalized_shape)
        self.eps = None if eps is None else check_eps(eps)
        self.elementwise_affine = elementwise_affine
        self.zero_centered = zero_centered
        self.cast_before_weight = cast_before_weight
        self.backend = backend
        if elementwise_affine:
            self.weight = nn.Parameter(torch.empty(self.normalized_shape, device=device, dtype=dtype))
        else:
            self.register_parameter("weight", None)
        self.reset_parameters()

    @property
    def weight_offset(self) -> float:
        return 1.0 if self.zero_centered else 0.0

    def reset_parameters(self) -> None:
        if self.weight is not None:
            (nn.init.zeros_ if self.zero_centered else nn.init.ones_)(self.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return AF.rms_norm(x, self.normalized_shape, self.weight, self.eps, weight_offset=self.weight_offset,
                           cast_before_weight=self.cast_before_weight, backend=self.backend)

    def extra_repr(self) -> str:
        extra = ", zero_centered=True" if self.zero_centered else ""
        extra += ", cast_before_weight=True" if self.cast_before_weight else ""
        return f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}{extra}"
