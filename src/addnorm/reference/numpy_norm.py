"""LayerNorm and RMSNorm in NumPy with hand-written backward passes (seed 002's language).

The llm.c contract: ``*_forward(...) -> (out, cache)`` and ``*_backward(dout, cache) -> grads``.
The cache holds the normalized input (the residual sum for Add & Norm) and the per-row
mean / rstd; backward recomputes xhat from them instead of storing it. Any number of leading
dimensions; the last ``n_norm`` axes are normalized. float32 and float64 keep their dtype;
float16 is computed in float32 and cast back. The residual "Add" is fused: the ``add_*``
forms take ``(x, residual)`` and return the normed output *and* the new residual stream.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

__all__ = [
    "NormCache",
    "Grads",
    "layer_norm_forward",
    "rms_norm_forward",
    "add_layer_norm_forward",
    "add_rms_norm_forward",
    "layer_norm_backward",
    "rms_norm_backward",
    "add_norm_backward",
]


@dataclass(frozen=True)
class NormCache:
    x: np.ndarray  # the input that was normalized (compute dtype)
    mean: np.ndarray  # (..., 1, ..., 1) per-row mean; zeros for RMSNorm
    rstd: np.ndarray  # per-row 1 / sqrt(var + eps)
    weight: np.ndarray | None
    has_bias: bool
    kind: str  # "layer" | "rms"
    n_norm: int
    dtype: np.dtype  # the caller's dtype, that gradients are returned in


class Grads(NamedTuple):
    dx: np.ndarray
    dresidual: np.ndarray | None
    dweight: np.ndarray | None
    dbias: np.ndarray | None


def _compute_dtype(name: str, a: np.ndarray) -> np.dtype:
    if a.dtype == np.float64:
        return np.dtype(np.float64)
    if a.dtype in (np.float32, np.float16):
        return np.dtype(np.float32)
    raise TypeError(f"{name} must be a float16/float32/float64 array, got dtype {a.dtype}")


def _check(x: np.ndarray, weight, bias, eps: float, n_norm: int):
    if not isinstance(x, np.ndarray):
        raise TypeError(f"x must be a numpy.ndarray, got {type(x).__name__}")
    if n_norm < 1 or n_norm > x.ndim:
        raise ValueError(f"n_norm must be in [1, x.ndim={x.ndim}], got {n_norm}")
    if eps < 0:
        raise ValueError(f"eps must be >= 0, got {eps}")
    shape = x.shape[x.ndim - n_norm:]
    for name, p in (("weight", weight), ("bias", bias)):
        if p is not None and tuple(np.shape(p)) != shape:
            raise ValueError(f"{name} must have shape {shape} (the normalized shape of x), got {tuple(np.shape(p))}")
    return tuple(range(x.ndim - n_norm, x.ndim))


def _norm_forward(kind, x, weight, bias, eps, n_norm):
    ax = _check(x, weight, bias, eps, n_norm)
    dtype = x.dtype
    ct = _compute_dtype("x", x)
    xc = x.astype(ct, copy=False)
    if kind == "layer":
        mean = xc.mean(axis=ax, keepdims=True)
        var = np.square(xc - mean).mean(axis=ax, keepdims=True)  # two-pass: no E[x²]−E[x]² cancellation
    else:
        mean = np.zeros_like(xc, shape=xc.shape[: xc.ndim - n_norm] + (1,) * n_norm)
        var = np.square(xc).mean(axis=ax, keepdims=True)
    rstd = 1.0 / np.sqrt(var + ct.type(eps))
    y = (xc - mean) * rstd
    w = None if weight is None else np.asarray(weight).astype(ct, copy=False)
    if w is not None:
        y = y * w
    if bias is not None:
        y = y + np.asarray(bias).astype(ct, copy=False)
    cache = NormCache(xc, mean, rstd, w, bias is not None, kind, n_norm, dtype)
    return y.astype(dtype, copy=False), cache


def layer_norm_forward(x, weight=None, bias=None, eps: float = 1e-5, n_norm: int = 1):
    """y = (x - mean) / sqrt(var + eps) * weight + bias  ->  (y, cache)."""
    return _norm_forward("layer", x, weight, bias, eps, n_norm)


def rms_norm_forward(x, weight=None, eps: float = 1e-6, n_norm: int = 1):
    """y = x / sqrt(mean(x²) + eps) * weight  ->  (y, cache)."""
    return _norm_forward("rms", x, weight, None, eps, n_norm)


def _add(x, residual):
    if not isinstance(residual, np.ndarray) or residual.shape != x.shape:
        raise ValueError(f"residual must be an array of x's shape {x.shape}, got {getattr(residual, 'shape', type(residual).__name__)}")
    if residual.dtype != x.dtype:
        raise TypeError(f"residual dtype {residual.dtype} must equal x dtype {x.dtype}")
    return x + residual  # rounded to the input dtype, as the stored residual stream is


def add_layer_norm_forward(x, residual, weight=None, bias=None, eps: float = 1e-5, n_norm: int = 1):
    """s = x + residual;  ((LayerNorm(s), s), cache)."""
    s = _add(x, residual)
    y, cache = layer_norm_forward(s, weight, bias, eps, n_norm)
    return (y, s), cache


def add_rms_norm_forward(x, residual, weight=None, eps: float = 1e-6, n_norm: int = 1):
    """s = x + residual;  ((RMSNorm(s), s), cache)."""
    s = _add(x, residual)
    y, cache = rms_norm_forward(s, weight, eps, n_norm)
    return (y, s), cache


def _norm_backward(dout, cache: NormCache) -> Grads:
    c = cache
    ax = tuple(range(c.x.ndim - c.n_norm, c.x.ndim))
    dy = np.asarray(dout).astype(c.x.dtype, copy=False)
    if dy.shape != c.x.shape:
        raise ValueError(f"dout must have shape {c.x.shape}, got {dy.shape}")
    xhat = (c.x - c.mean) * c.rstd  # recomputed, not stored
    g = dy if c.weight is None else dy * c.weight
    proj = (g * xhat).mean(axis=ax, keepdims=True)
    if c.kind == "layer":
        dx = c.rstd * (g - g.mean(axis=ax, keepdims=True) - xhat * proj)
    else:
        dx = c.rstd * (g - xhat * proj)
    lead = dy.shape[: dy.ndim - c.n_norm]
    red = tuple(range(len(lead)))
    dweight = None if c.weight is None else (dy * xhat).sum(axis=red)
    dbias = dy.sum(axis=red) if c.has_bias else None
    return Grads(dx.astype(c.dtype, copy=False), None, dweight, dbias)


def layer_norm_backward(dout, cache: NormCache) -> Grads:
    return _norm_backward(dout, cache)


def rms_norm_backward(dout, cache: NormCache) -> Grads:
    return _norm_backward(dout, cache)


def add_norm_backward(dout, cache: NormCache, dresidual_out=None) -> Grads:
    """Backward of Add & Norm: the sum's gradient reaches x and the residual alike.

    ``dresidual_out`` is the gradient arriving through the new residual stream (the next
    block's use of s); it is accumulated into dx, as the fused kernels do.
    """
    g = _norm_backward(dout, cache)
    ds = g.dx.astype(cache.x.dtype)
    if dresidual_out is not None:
        ds = ds + np.asarray(dresidual_out).astype(cache.x.dtype, copy=False)
    ds = ds.astype(cache.dtype, copy=False)
    return Grads(ds, ds.copy(), g.dweight, g.dbias)
