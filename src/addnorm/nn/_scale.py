"""A constant scale on a norm's output, folded into its parameters: ``c * (xhat * (w + offset) + b)`` is
``xhat * ((w + offset) * c) + b * c`` -- the same kernel call, no extra pass over the activations.

LayerNorm Scaling's 1/sqrt(l) (arXiv 2502.05795) is such a scale. The folded weight is formed in float32
beside 16-bit weights (the kernels take float32 parameters with any activation dtype), so the scale costs
no 16-bit rounding; autograd carries the gradients back through the fold, on D elements.
"""

from __future__ import annotations

import torch


def fold(weight: torch.Tensor | None, bias: torch.Tensor | None, weight_offset: float, c: float,
         shape: tuple[int, ...], like: torch.Tensor):
    """(weight', bias') with offset 0: the parameters of ``c`` times the norm."""
    if weight is None:
        w = torch.full(shape, c, dtype=torch.float32 if like.dtype != torch.float64 else torch.float64,
                       device=like.device)
    else:
        w = weight if weight.dtype in (torch.float32, torch.float64) else weight.float()
        w = (w + weight_offset) * c if weight_offset else w * c
    b = None
    if bias is not None:
        b = (bias if bias.dtype in (torch.float32, torch.float64) else bias.float()) * c
    return w, b
