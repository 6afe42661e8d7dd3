"""The pure-torch backend: exact, differentiable to any order, runs anywhere torch runs.

Used for float64, for devices other than the CPU, under ``torch.compile`` tracing, for
double backward, and whenever the compiled kernels are unavailable. LayerNorm goes through
``torch.nn.functional.layer_norm`` itself, so it *is* PyTorch's result; RMSNorm is written out
with statistics in at least float32, the way ``torch.nn.functional.rms_norm`` and HuggingFace's
``LlamaRMSNorm`` compute it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _stat_dtype(x: torch.Tensor) -> torch.dtype:
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def layer_norm(x, normalized_shape, weight, bias, eps: float, weight_offset: float = 0.0):
    ct = _stat_dtype(x)
    if weight is not None and weight_offset:
        weight = weight.to(ct) + weight_offset  # Gemma-style zero-centred weight: scale is 1 + w
    if x.dtype == ct and (weight is None or weight.dtype == ct) and (bias is None or bias.dtype == ct):
        return F.layer_norm(x, normalized_shape, weight, bias, eps)
    w = None if weight is None else weight.to(ct)
    b = None if bias is None else bias.to(ct)
    return F.layer_norm(x.to(ct), normalized_shape, w, b, eps).to(x.dtype)


def rms_norm(x, normalized_shape, weight, eps: float, weight_offset: float = 0.0, cast_before_weight: bool = False):
    ct = _stat_dtype(x)
    dims = tuple(range(-len(normalized_shape), 0))
    xf = x.to(ct)
    y = xf * torch.rsqrt(xf.pow(2).mean(dims, keepdim=True) + eps)
    if weight is None:
        return y.to(x.dtype)
    w = weight.to(ct) + weight_offset if weight_offset else weight.to(ct)
    if cast_before_weight:
        # Llama order: normalize in float32, cast to the input dtype, then multiply by the weight -- the weight as
        # it is (a float32 weight is not rounded to the input dtype first: one rounding, of the product, as the
        # kernels and the fused formulas round it and as HF's weight * h.to(dtype) then cast to dtype gives)
        y = y.to(x.dtype).to(ct)
    return (y * w).to(x.dtype)


def add(x, residual):
    """The residual sum, rounded to the stream's dtype like eager ``x + residual``."""
    return x if residual is None else x + residual
