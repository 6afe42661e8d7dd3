"""DyT and Derf fused with the residual add, in torch ops (what the kernels compute):

    s = x + residual                   rounded to the stream's dtype (the residual's), as eager stores it
    u = alpha * s + shift              shift = 0 for DyT
    y = weight * f(u) + bias           f = tanh (DyT, arXiv 2503.10622) or erf (Derf, arXiv 2512.10938),
                                       in float32, rounded once to x's dtype
backward with g = dy * weight * f'(u):
    ds = alpha * g + dres,  dalpha = sum g s,  dshift = sum g,  dweight = sum_rows dy f(u),  dbias = sum_rows dy
"""

from __future__ import annotations

import math

import torch

F = {"dyt": torch.tanh, "derf": torch.erf}


def compute_dtype(*ts) -> torch.dtype:
    return torch.float64 if any(t is not None and t.dtype == torch.float64 for t in ts) else torch.float32


def stream(x, residual):
    if residual is None:
        return x
    ct = compute_dtype(x, residual)
    return (x.to(ct) + residual.to(ct)).to(residual.dtype)


def _u(s, alpha, shift, ct):
    u = alpha.to(ct) * s.to(ct)
    return u if shift is None else u + shift.to(ct)


def forward(x, residual, alpha, shift, weight, bias, kind):
    """(y, s)."""
    s = stream(x, residual)
    ct = compute_dtype(x, residual, weight)
    y = F[kind](_u(s, alpha, shift, ct))
    if weight is not None:
        y = y * weight.to(ct)
    if bias is not None:
        y = y + bias.to(ct)
    return y.to(x.dtype), s


def derivative(u, kind):
    if kind == "dyt":
        t = torch.tanh(u)
        return t, 1 - t * t
    return torch.erf(u), (2 / math.sqrt(math.pi)) * torch.exp(-u * u)


def backward(dy, dres, s, alpha, shift, weight, bias, kind, mask):
    """(ds, dalpha, dshift, dweight, dbias); None where not asked for (mask: alpha, shift, weight, bias)."""
    ct = compute_dtype(s, dy, weight)
    f, fp = derivative(_u(s, alpha, shift, ct), kind)
    d = dy.to(ct)
    g = d * fp if weight is None else d * weight.to(ct) * fp
    ds = alpha.to(ct) * g
    if dres is not None:
        ds = ds + dres.to(ct)
    rows = tuple(range(s.dim() - (weight.dim() if weight is not None else bias.dim() if bias is not None else 1)))
    da = (g * s.to(ct)).sum().to(alpha.dtype).reshape(alpha.shape) if mask[0] else None
    dsh = g.sum().to(shift.dtype).reshape(shift.shape) if shift is not None and mask[1] else None
    dw = (d * f).sum(rows).to(weight.dtype) if weight is not None and mask[2] else None
    db = d.sum(rows).to(bias.dtype) if bias is not None and mask[3] else None
    return ds.to(s.dtype), da, dsh, dw, db
