"""Fused Add & Norm modules: ``forward(x, residual) -> (normed, new_residual)``.

They hold exactly the parameters of the norm they wrap (``weight``/``bias``, same state_dict
keys as ``LayerNorm``/``RMSNorm``), so a checkpoint of a plain norm loads into them.
"""

from __future__ import annotations

import torch

from .. import functional as AF
from ..functional import fused as FF
from ._scale import fold
from .layer_norm import LayerNorm
from .rms_norm import RMSNorm


class AddLayerNorm(LayerNorm):
    r"""s = x + residual;  returns (LayerNorm(s), s) -- one pass over memory each way on the CPU.

    ``residual=None`` (the first block) returns ``(LayerNorm(x), x)``. ``out_scale=c`` returns
    ``c * LayerNorm(s)`` in the same pass (LayerNorm Scaling's 1/sqrt(l), folded into the parameters).
    ``add_to(x, residual)`` is the other order, norm-then-add: ``residual + LayerNorm(x)``.
    """

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None, *, out_scale: float = 1.0):
        w, b = self.weight, self.bias
        if out_scale != 1.0:
            w, b = fold(w, b, 0.0, out_scale, self.normalized_shape, x)
        return AF.add_layer_norm(x, residual, self.normalized_shape, w, b, self.eps, backend=self.backend)

    def add_to(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return FF.layer_norm_add(x, residual, self.normalized_shape, self.weight, self.bias, self.eps,
                                 backend=self.backend)


class AddRMSNorm(RMSNorm):
    r"""s = x + residual;  returns (RMSNorm(s), s) (``out_scale`` and ``add_to`` as ``AddLayerNorm``'s)."""

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None, *, out_scale: float = 1.0):
        w, off = self.weight, self.weight_offset
        if out_scale != 1.0:
            (w, _), off = fold(w, None, off, out_scale, self.normalized_shape, x), 0.0
        return AF.add_rms_norm(x, residual, self.normalized_shape, w, self.eps, weight_offset=off,
                               cast_before_weight=self.cast_before_weight, backend=self.backend)

    def add_to(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return FF.rms_norm_add(x, residual, self.normalized_shape, self.weight, self.eps,
                               weight_offset=self.weight_offset, cast_before_weight=self.cast_before_weight,
                               backend=self.backend)
