"""LayerNorm and RMSNorm on plain Python lists: no NumPy, no torch (seed 001's language).

Every function works on one vector (a list of floats) or a matrix (a list of rows). Forward
returns the normalized values *and* the statistics a learner wants to see (mean, variance,
std, rstd); backward takes the upstream gradient and those statistics, llm.c style: forward
returns ``(out, cache)``, backward takes ``(dout, cache)`` and recomputes what it needs.

This is the engine behind ``addnorm trace``; it is tested against the float64 oracle.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

Vector = list[float]


@dataclass(frozen=True)
class RowStats:
    """The statistics of one normalized row, as seed 001 prints them."""

    mean: float  # 0.0 for RMSNorm, which does not centre
    variance: float  # biased (1/D) variance for LayerNorm, mean square for RMSNorm
    std: float  # sqrt(variance + eps): the divisor actually used
    rstd: float  # 1 / std


@dataclass(frozen=True)
class NormCache:
    x: tuple[float, ...]  # the normalized input (after the residual add, if any)
    stats: RowStats
    weight: tuple[float, ...] | None
    kind: str  # "layer" or "rms"


def _check_vector(name: str, v, d: int | None = None) -> None:
    if not isinstance(v, (list, tuple)) or not v:
        raise ValueError(f"{name} must be a non-empty list of floats, got {type(v).__name__} of length {len(v) if hasattr(v, '__len__') else '?'}")
    if d is not None and len(v) != d:
        raise ValueError(f"{name} must have length {d} to match x, got {len(v)}")


def layer_norm_forward(x: Vector, weight: Vector | None = None, bias: Vector | None = None, eps: float = 1e-5) -> tuple[Vector, NormCache]:
    """y_i = (x_i - mean) / sqrt(var + eps) * w_i + b_i, with the biased variance (1/D)."""
    _check_vector("x", x)
    d = len(x)
    if weight is not None:
        _check_vector("weight", weight, d)
    if bias is not None:
        _check_vector("bias", bias, d)
    mean = math.fsum(x) / d
    variance = math.fsum((xi - mean) ** 2 for xi in x) / d
    std = math.sqrt(variance + eps)
    rstd = 1.0 / std
    out = []
    for i, xi in enumerate(x):
        y = (xi - mean) * rstd
        if weight is not None:
            y *= weight[i]
        if bias is not None:
            y += bias[i]
        out.append(y)
    cache = NormCache(tuple(x), RowStats(mean, variance, std, rstd), None if weight is None else tuple(weight), "layer")
    return out, cache


def rms_norm_forward(x: Vector, weight: Vector | None = None, eps: float = 1e-6) -> tuple[Vector, NormCache]:
    """y_i = x_i / sqrt(mean(x^2) + eps) * w_i."""
    _check_vector("x", x)
    d = len(x)
    if weight is not None:
        _check_vector("weight", weight, d)
    ms = math.fsum(xi * xi for xi in x) / d
    std = math.sqrt(ms + eps)
    rstd = 1.0 / std
    out = [xi * rstd * (1.0 if weight is None else weight[i]) for i, xi in enumerate(x)]
    cache = NormCache(tuple(x), RowStats(0.0, ms, std, rstd), None if weight is None else tuple(weight), "rms")
    return out, cache


def norm_backward(dout: Vector, cache: NormCache) -> tuple[Vector, Vector | None, Vector | None]:
    """Returns (dx, dweight, dbias) for one row; dbias is None for RMSNorm.

    dx = rstd * (g - mean(g) - xhat * mean(g * xhat)) with g = dout * w (LayerNorm);
    the mean(g) term is absent for RMSNorm, which does not subtract the mean.
    """
    x, s = cache.x, cache.stats
    d = len(x)
    _check_vector("dout", dout, d)
    xhat = [(xi - s.mean) * s.rstd for xi in x]
    g = [dout[i] * (1.0 if cache.weight is None else cache.weight[i]) for i in range(d)]
    mean_g = math.fsum(g) / d if cache.kind == "layer" else 0.0
    mean_gx = math.fsum(gi * xi for gi, xi in zip(g, xhat)) / d
    dx = [s.rstd * (g[i] - mean_g - xhat[i] * mean_gx) for i in range(d)]
    dweight = None if cache.weight is None else [dout[i] * xhat[i] for i in range(d)]
    dbias = list(dout) if cache.kind == "layer" else None
    return dx, dweight, dbias


def add(x: Vector, residual: Vector) -> Vector:
    """The residual "Add": element-wise sum of two equal-length vectors."""
    _check_vector("x", x)
    _check_vector("residual", residual, len(x))
    return [a + b for a, b in zip(x, residual)]


def add_layer_norm_forward(x: Vector, residual: Vector, weight=None, bias=None, eps: float = 1e-5):
    """Add & Norm: s = x + residual; returns (LayerNorm(s), s, cache)."""
    s = add(x, residual)
    out, cache = layer_norm_forward(s, weight, bias, eps)
    return out, s, cache


def add_rms_norm_forward(x: Vector, residual: Vector, weight=None, eps: float = 1e-6):
    """Add & Norm with RMSNorm: s = x + residual; returns (RMSNorm(s), s, cache)."""
    s = add(x, residual)
    out, cache = rms_norm_forward(s, weight, eps)
    return out, s, cache


def add_norm_backward(dout: Vector, cache: NormCache, dresidual_out: Vector | None = None):
    """Backward of Add & Norm for one row: (dx, dresidual, dweight, dbias).

    The gradient of the sum reaches both x and the residual unchanged (d(x+r)/dx = 1: the
    "+1" highway), plus whatever gradient arrived through the new residual stream itself.
    """
    ds, dweight, dbias = norm_backward(dout, cache)
    if dresidual_out is not None:
        ds = add(ds, dresidual_out)
    return ds, list(ds), dweight, dbias


def _rows(fn, rows, *args, **kwargs):
    outs, caches = [], []
    for r in rows:
        o, c = fn(r, *args, **kwargs)
        outs.append(o)
        caches.append(c)
    return outs, caches


def layer_norm_rows(rows: list[Vector], weight=None, bias=None, eps: float = 1e-5):
    """LayerNorm of every row of a matrix: (outputs, caches); each row normalized on its own."""
    return _rows(layer_norm_forward, rows, weight, bias, eps)


def rms_norm_rows(rows: list[Vector], weight=None, eps: float = 1e-6):
    """RMSNorm of every row of a matrix: (outputs, caches)."""
    return _rows(rms_norm_forward, rows, weight, eps)


def row_mean_variance(x: Vector) -> tuple[float, float]:
    """(mean, biased variance) of one row: the seed's verification check."""
    _check_vector("x", x)
    mean = math.fsum(x) / len(x)
    return mean, math.fsum((v - mean) ** 2 for v in x) / len(x)
