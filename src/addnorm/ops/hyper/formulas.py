"""Hyper-connections without a mixing matrix in torch ops: the operators' exact implementation, written in the
order HF's modules compute them so that float32 results agree to the bit where the operations agree (the sums in
float32, float64 for float64 tensors; each output rounded once to its dtype).

    read      m = (vec(X) W^T) r,  r = 1 / sqrt(mean(vec(X)^2) + eps)         X (..., n, C), W (g n, nC), g = 1 or 2
              H_pre  = sigmoid(s[0] m[:n] + b[:n]) + pre_eps
              H_post = post_scale sigmoid(s[-1] m[n:] + b[n:]) + post_eps      (..., 0) when g = 1 (a head)
              h = sum_i H_pre[i] X_i
    write     X'_i = X_i + H_post[i] y                                       (rounding: see ``convention``)
    norm      N_i = X_i / sqrt(mean(X_i^2) + eps) * (offset + w_i)            w (n, C)
    collapse  h = (1/n) sum_i G_i * N_i                                       G (..., n, C)

These are differentiable (autograd derives their backward), so every transform PyTorch has sees through them.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F


def compute_dtype(*ts) -> torch.dtype:
    return torch.float64 if any(t is not None and t.dtype == torch.float64 for t in ts) else torch.float32


def _autocast_off(t: torch.Tensor):
    """Autocast off on the tensor's device type: the gates in float32 at least, as HF's modules force them."""
    kind = t.device.type
    return torch.autocast(kind, enabled=False) if kind in ("cpu", "cuda", "xpu") else contextlib.nullcontext()


def read(x, weight, scale, base, eps, pre_eps, post_scale, post_eps):
    """(h, H_pre, H_post): h in X's dtype, the gates in the compute dtype."""
    ct = compute_dtype(x, weight, scale, base)
    n = x.size(-2)
    with _autocast_off(x):
        flat = x.flatten(-2).to(ct)
        rstd = torch.rsqrt(flat.square().mean(-1, keepdim=True) + eps)
        mixes = F.linear(flat, weight.to(ct)) * rstd
        s, b = scale.to(ct).reshape(-1), base.to(ct)
        h_pre = torch.sigmoid(mixes[..., :n] * s[0] + b[:n]) + pre_eps
        h_post = post_scale * torch.sigmoid(mixes[..., n:] * s[-1] + b[n:]) + post_eps
        h = (h_pre.unsqueeze(-1) * x.to(ct)).sum(-2).to(x.dtype)
    return h, h_pre, h_post


def _product(a, b, ct, rounding):
    """a * b in the compute dtype; with rounding "products", first rounded to the inputs' dtype as eager's is."""
    if rounding == "products":
        return (a * b).to(ct)
    return a.to(ct) * b.to(ct)


def write(x, y, h_post, rounding="once"):
    """X' = X + H_post^T y in X's dtype."""
    ct = compute_dtype(x, y, h_post)
    return (_product(h_post.unsqueeze(-1), y.unsqueeze(-2), ct, rounding) + x.to(ct)).to(x.dtype)


def stream_norm(x, weight, eps, weight_offset):
    """N_i = X_i / RMS(X_i) * (offset + w_i) in X's dtype."""
    ct = compute_dtype(x, weight)
    xf = x.to(ct)
    out = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (out * (weight_offset + weight.to(ct))).to(x.dtype)


def gated_collapse(x, gates, rounding="once"):
    """h = (1/n) sum_i G_i * X_i in X's dtype."""
    ct = compute_dtype(x, gates)
    return _product(gates, x, ct, rounding).mean(-2).to(x.dtype)
