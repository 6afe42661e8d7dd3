"""The float64 oracle: the one numerical truth every backend and kernel is tested against.

Deliberately the plainest possible code: NumPy, float64 throughout, two-pass statistics,
formulas written as they appear in the papers. Inputs of any floating dtype (NumPy arrays or
anything ``np.asarray`` accepts, torch CPU tensors included) are promoted to float64; results
are float64 NumPy arrays. The last ``n_norm`` axes are normalized (``normalized_shape``).

    LayerNorm (Ba et al. 2016):  y = (x - mean) / sqrt(var + eps) * w + b,   var biased (1/D)
    RMSNorm  (Zhang & Sennrich 2019):  y = x / sqrt(mean(x^2) + eps) * w
    Add & Norm:  s = x + residual;  return (norm(s), s)

Backward (derivation in docs/backward.md), with xhat the normalized input, g = dy * w and
rstd = 1 / sqrt(var + eps), means taken over the normalized axes:
    LayerNorm:  dx = rstd * (g - mean(g) - xhat * mean(g * xhat));  dw = sum(dy * xhat);  db = sum(dy)
    RMSNorm:    dx = rstd * (g - xhat * mean(g * xhat));              dw = sum(dy * xhat)
    Add & Norm: ds = dx_norm + dresidual_out;  dx = dresidual = ds
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "layer_norm",
    "rms_norm",
    "add_layer_norm",
    "add_rms_norm",
    "layer_norm_backward",
    "rms_norm_backward",
    "add_norm_backward",
]


def _f64(a):
    if a is None:
        return None
    if hasattr(a, "detach"):  # torch tensor: go through float64 torch to keep bf16 exact
        a = a.detach().to("cpu").double().numpy()
    return np.asarray(a, dtype=np.float64)


def _axes(x: np.ndarray, n_norm: int) -> tuple[int, ...]:
    return tuple(range(x.ndim - n_norm, x.ndim))


def _weight(w, weight_offset: float):
    return None if w is None else _f64(w) + weight_offset


def layer_norm(x, weight=None, bias=None, eps: float = 1e-5, n_norm: int = 1, weight_offset: float = 0.0):
    x = _f64(x)
    ax = _axes(x, n_norm)
    mean = x.mean(axis=ax, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=ax, keepdims=True)
    y = (x - mean) / np.sqrt(var + eps)
    w = _weight(weight, weight_offset)
    if w is not None:
        y = y * w
    if bias is not None:
        y = y + _f64(bias)
    return y


def rms_norm(x, weight=None, eps: float = 1e-6, n_norm: int = 1, weight_offset: float = 0.0):
    x = _f64(x)
    ax = _axes(x, n_norm)
    ms = (x * x).mean(axis=ax, keepdims=True)
    y = x / np.sqrt(ms + eps)
    w = _weight(weight, weight_offset)
    return y if w is None else y * w


def add_layer_norm(x, residual, weight=None, bias=None, eps: float = 1e-5, n_norm: int = 1, weight_offset: float = 0.0):
    s = _f64(x) + _f64(residual)
    return layer_norm(s, weight, bias, eps, n_norm, weight_offset), s


def add_rms_norm(x, residual, weight=None, eps: float = 1e-6, n_norm: int = 1, weight_offset: float = 0.0):
    s = _f64(x) + _f64(residual)
    return rms_norm(s, weight, eps, n_norm, weight_offset), s


def _reduce_to_param(t: np.ndarray, n_norm: int) -> np.ndarray:
    return t.reshape((-1,) + t.shape[t.ndim - n_norm:]).sum(axis=0)


def layer_norm_backward(dy, x, weight=None, eps: float = 1e-5, n_norm: int = 1, weight_offset: float = 0.0):
    """Returns (dx, dweight, dbias); dweight is None when weight is None."""
    dy, x = _f64(dy), _f64(x)
    ax = _axes(x, n_norm)
    mean = x.mean(axis=ax, keepdims=True)
    rstd = 1.0 / np.sqrt(((x - mean) ** 2).mean(axis=ax, keepdims=True) + eps)
    xhat = (x - mean) * rstd
    w = _weight(weight, weight_offset)
    g = dy if w is None else dy * w
    dx = rstd * (g - g.mean(axis=ax, keepdims=True) - xhat * (g * xhat).mean(axis=ax, keepdims=True))
    dw = None if w is None else _reduce_to_param(dy * xhat, n_norm)
    db = _reduce_to_param(dy, n_norm)
    return dx, dw, db


def rms_norm_backward(dy, x, weight=None, eps: float = 1e-6, n_norm: int = 1, weight_offset: float = 0.0):
    """Returns (dx, dweight); dweight is None when weight is None."""
    dy, x = _f64(dy), _f64(x)
    ax = _axes(x, n_norm)
    rstd = 1.0 / np.sqrt((x * x).mean(axis=ax, keepdims=True) + eps)
    xhat = x * rstd
    w = _weight(weight, weight_offset)
    g = dy if w is None else dy * w
    dx = rstd * (g - xhat * (g * xhat).mean(axis=ax, keepdims=True))
    dw = None if w is None else _reduce_to_param(dy * xhat, n_norm)
    return dx, dw


def add_norm_backward(dx_norm, dresidual_out=None):
    """Gradient of s = x + residual given the norm's input gradient and the new residual's gradient.

    Both inputs of the sum get the same gradient: ds = dx_norm + dresidual_out.
    """
    ds = _f64(dx_norm)
    if dresidual_out is not None:
        ds = ds + _f64(dresidual_out)
    return ds, ds
