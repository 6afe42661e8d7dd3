"""Fused Add & Norm modules: ``forward(x, residual) -> (normed, new_residual)``.

They hold exactly the parameters of the norm they wrap (``weight``/``bias``, same state_dict
keys as ``LayerNorm``/``RMSNorm``), so a checkpoint of a plain norm loads into them.
"""

from __future__ import annotations

import torch

from .. import functional as AF
from .layer_norm import LayerNorm
from .rms_norm import RMSNorm


class AddLayerNorm(LayerNorm):
    r"""s = x + residual;  returns (LayerNorm(s), s) -- one pass over memory each way on the CPU.

    ``residual=None`` (the first block) returns ``(LayerNorm(x), x)``.
    """

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        return AF.add_layer_norm(x, residual, self.normalized_shape, self.weight, self.bias, self.eps,
                                 backend=self.backend)


class AddRMSNorm(RMSNorm):
    r"""s = x + residual;  returns (RMSNorm(s), s)."""

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        return AF.add_rms_norm(x, residual, self.normalized_shape, self.weight, self.eps,
                               weight_offset=self.weight_offset, cast_before_weight=self.cast_before_weight,
                               backend=self.backend)
