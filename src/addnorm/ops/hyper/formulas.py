"""Hyper-connections without a mixing matrix in torch ops: the operators' exact implementation, written in the
order HF's modules compute them so that float32 results agree to the bit where the operations agree (the sums in
float32, float64 for float64 tensors; each output rounded once to its dtype).

    write     X'_i = X_i + H_post[i] y                                       (rounding: see ``convention``)
    norm      N_i = X_i / sqrt(mean(X_i^2) + eps) * (offset + w_i)            w (n, C)
    collapse  h = (1/n) sum_i G_i * N_i                                       G (..., n, C)

(The read -- the gates from the RMS of vec(X) and the collapse -- is mHC's pre step without the comb matrix: its
formulas are ``ops.mhc.formulas.pre`` with groups 2, see ``schema``.) These are differentiable (autograd derives
their backward), so every transform PyTorch has sees through them.
"""

from __future__ import annotations

import torch


def compute_dtype(*ts) -> torch.dtype:
    return torch.float64 if any(t is not None and t.dtype == torch.float64 for t in ts) else torch.float32


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
