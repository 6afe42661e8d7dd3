"""The Add & Norm math in torch ops: forward, backward and the jvp, differentiable to any order.

These define what the operators compute on devices without a kernel (and on meta/fake tensors by
shape), what a gradient-of-a-gradient differentiates (``create_graph=True``: the kernels' backward is
not differentiable again, this is), and the tangent of forward-mode AD. Statistics are in float32
(float64 for float64 tensors), as in the kernels.

    s = x + residual                (in the stream's dtype: the residual's, or float32 with residual_in_fp32)
    xhat = (s - mean) * rstd        LayerNorm;  xhat = s * rstd  RMSNorm
    y = xhat * (weight + offset) + bias

Backward with g = dy * (weight + offset), means over the normalized dims:
    ds = rstd * (g - mean(g) - xhat * mean(g * xhat)) + dres      (RMSNorm: no mean(g) term)
    dweight = sum_rows(dy * xhat),  dbias = sum_rows(dy)
"""

from __future__ import annotations

import torch


def compute_dtype(*ts) -> torch.dtype:
    return torch.float64 if any(t is not None and t.dtype == torch.float64 for t in ts) else torch.float32


def sum_dtype(x: torch.Tensor, residual: torch.Tensor | None, residual_in_fp32: bool) -> torch.dtype:
    """The residual stream's dtype: the residual's; with none yet, float32 if asked, else x's."""
    if residual is not None:
        return residual.dtype
    if residual_in_fp32 and x.dtype in (torch.float16, torch.bfloat16):
        return torch.float32
    return x.dtype


def returns_sum(x, residual, residual_in_fp32) -> bool:
    """Whether the operator returns the stream as a new tensor (otherwise the stream is x itself)."""
    return residual is not None or sum_dtype(x, residual, residual_in_fp32) != x.dtype


def _dims(ndim: int) -> tuple[int, ...]:
    return tuple(range(-ndim, 0))


# Finite values above 2^HUGE_EXP may overflow float32 statistics: a sum of squares overflows from ~1.8e19, and near
# float32's largest the sum and x - mean themselves (NaN, or rows of 0, where the true outputs are finite).
HUGE_EXP = 48


def has_huge(t: torch.Tensor) -> bool:
    """Whether t holds a finite value beyond 2^HUGE_EXP. Eager code on real data only: on meta and fake tensors,
    under torch.compile, jit tracing and functorch's transforms (vmap, grad: a data-dependent branch) False, and
    such rows there keep float32's statistics."""
    if (t.dtype == torch.float64 or t.device.type == "meta" or torch.compiler.is_compiling()
            or torch.jit.is_tracing() or torch._C._are_functorch_transforms_active()
            or torch._subclasses.fake_tensor.is_fake(t)):
        return False  # no data to look at (meta, fake), or a trace that must not branch on it
    a = t.detach().abs()
    return bool(((a > 2.0**HUGE_EXP) & (a < torch.inf)).any())


def statistics(s: torch.Tensor, kind: str, ndim: int, eps: float, ct: torch.dtype):
    """(s in ct, mean or None, rstd, xhat), kept-dim statistics over the last ndim dims. A tensor with huge values
    (has_huge) takes them in float64, rounded to ct once: mean, rstd (maybe subnormal) and xhat are finite there."""
    sf = s.to(ct)
    if ct != torch.float64 and has_huge(sf):
        _, mean, rstd, xhat = statistics(s, kind, ndim, eps, torch.float64)
        return sf, None if mean is None else mean.to(ct), rstd.to(ct), xhat.to(ct)
    dims = _dims(ndim)
    if kind == "layer":
        mean = sf.mean(dims, keepdim=True)
        # corrected by the mean deviation (0 in exact arithmetic, and in its gradient): a constant row's mean is
        # then its value exactly, as torch's Welford moments and the kernels give it, so xhat = 0 there
        mean = mean + (sf - mean).mean(dims, keepdim=True)
        xc = sf - mean
        rstd = torch.rsqrt((xc * xc).mean(dims, keepdim=True) + eps)
        return sf, mean, rstd, xc * rstd
    rstd = torch.rsqrt((sf * sf).mean(dims, keepdim=True) + eps)
    return sf, None, rstd, sf * rstd


def scale(weight, weight_offset, ct):
    if weight is None:
        return None
    w = weight.to(ct)
    return w + weight_offset if weight_offset else w


def residual_sum(x, residual, residual_in_fp32):
    sdt = sum_dtype(x, residual, residual_in_fp32)
    if residual is None:
        return x.to(sdt)
    ct = compute_dtype(x, residual)
    return (x.to(ct) + residual.to(ct)).to(sdt)  # one rounding, as eager `x + residual` stores it


def forward(x, residual, weight, bias, kind, ndim, eps, weight_offset, cast_before_weight, out_dtype,
            residual_in_fp32):
    """(y, s, stats) as the operator returns them: stats is (2, N) (mean, rstd) or (1, N) (rstd,)."""
    odt = out_dtype or x.dtype
    s = residual_sum(x, residual, residual_in_fp32)
    ct = compute_dtype(x, s)
    _, mean, rstd, xhat = statistics(s, kind, ndim, eps, ct)
    w = scale(weight, weight_offset, ct)
    if cast_before_weight:  # Llama order: xhat rounded to the dtype of what the norm reads (HF's
        xhat = xhat.to(s.dtype).to(ct)  # weight * h.to(input_dtype)), then the weight
    y = xhat if w is None else xhat * w
    if bias is not None:
        y = y + bias.to(ct)
    rows = [rstd.reshape(-1)] if mean is None else [mean.reshape(-1), rstd.reshape(-1)]
    return y.to(odt), s, torch.stack(rows)


def backward(dy, dres, s, weight, bias, kind, ndim, eps, weight_offset, x_dtype, output_mask):
    """(ds, dx, dweight, dbias): ds in the stream's dtype; dx in x_dtype when that differs (else None)."""
    ct = compute_dtype(s, dy)
    _, mean, rstd, xhat = statistics(s, kind, ndim, eps, ct)
    dims = _dims(ndim)
    d = dy.to(ct)
    w = scale(weight, weight_offset, ct)
    g = d if w is None else d * w
    part = g - xhat * (g * xhat).mean(dims, keepdim=True)
    if kind == "layer":
        part = part - g.mean(dims, keepdim=True)
    ds = rstd * part
    if dres is not None:
        ds = ds + dres.to(ct)
    rows = tuple(range(s.dim() - ndim))
    total = (lambda t: t.sum(rows)) if rows else (lambda t: t)  # sum(()) would sum over every dim
    dw = total(d * xhat).to(weight.dtype).reshape(weight.shape) if weight is not None and output_mask[1] else None
    db = total(d).to(bias.dtype).reshape(bias.shape) if bias is not None and output_mask[2] else None
    dx = ds.to(x_dtype) if x_dtype != s.dtype else None
    return ds.to(s.dtype), dx, dw, db


def jvp(s, weight, kind, ndim, eps, weight_offset, cast_before_weight, out_dtype, tx, tr, tw, tb):
    """Tangents (ty, ts) of (y, s) given those of x, residual, weight, bias (any may be None)."""
    ct = compute_dtype(s, weight)
    ts = None
    for t in (tx, tr):
        if t is not None:
            ts = t.to(ct) if ts is None else ts + t.to(ct)
    _, mean, rstd, xhat = statistics(s, kind, ndim, eps, ct)
    dims = _dims(ndim)
    ty = None
    if ts is not None:
        part = ts - xhat * (ts * xhat).mean(dims, keepdim=True)
        if kind == "layer":
            part = part - ts.mean(dims, keepdim=True)
        ty = rstd * part
        w = scale(weight, weight_offset, ct)
        if w is not None:
            ty = ty * w
    if tw is not None:
        xh = xhat.to(s.dtype).to(ct) if cast_before_weight else xhat
        ty = xh * tw.to(ct) if ty is None else ty + xh * tw.to(ct)
    if tb is not None:
        ty = tb.to(ct).expand_as(xhat) if ty is None else ty + tb.to(ct)
    return (None if ty is None else ty.to(out_dtype)), (None if ts is None else ts.to(s.dtype))
