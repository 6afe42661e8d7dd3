"""Hyper-connections without a mixing matrix in torch ops: the operators' exact implementation, written in the
order HF's modules compute them so that float32 results agree to the bit where the operations agree (the sums in
float32, float64 for float64 tensors; each output rounded once to its dtype).

    write     X'_i = X_i + H_post[i] y                                       (rounding: see ``convention``)
    norm      N_i = X_i / sqrt(mean(X_i^2) + eps) * (offset + w_i)            w (n, C)
    collapse  h = (1/n) sum_i G_i * N_i                                       G (..., n, C)
    sigmoid-gated collapse  h = (1/n) sum_i sigmoid(U_i) * N_i                U (..., n, C): the gates' logits

(The read -- the gates from the RMS of vec(X) and the collapse -- is mHC's pre step without the comb matrix: its
formulas are ``ops.mhc.formulas.pre`` with groups 2, see ``schema``.) These are differentiable (autograd derives
their backward), so every transform PyTorch has sees through them. The operators with a C kernel (the norm, the
write with the norm after it, the sigmoid-gated collapse: ``autograd``) also take their backward and forward-mode
tangents from here (``*_backward``, ``*_jvp``): written out, in torch ops, differentiable again.
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


def sigmoid_gated_collapse(x, logits, rounding="once"):
    """h = (1/n) sum_i sigmoid(U_i) * X_i in X's dtype: the gates in the compute dtype, or with rounding "products"
    in U's own dtype first, as eager's ``torch.sigmoid`` of a 16-bit U rounds them."""
    ct = compute_dtype(x, logits)
    gates = torch.sigmoid(logits) if rounding == "products" else torch.sigmoid(logits.to(ct))
    return gated_collapse(x, gates, rounding)


def sigmoid_gated_collapse_backward(dh, x, logits, rounding="once"):
    """(dX, dU) of ``sigmoid_gated_collapse``: with c = dh / n and G = sigmoid(U) (the gates the forward multiplied
    by), dX_i = c G_i and dU_i = c X_i G_i (1 - G_i); each from the compute dtype, rounded once."""
    ct = compute_dtype(x, logits, dh)
    c = dh.to(ct).unsqueeze(-2) / x.shape[-2]
    g = torch.sigmoid(logits).to(ct) if rounding == "products" else torch.sigmoid(logits.to(ct))
    return (c * g).to(x.dtype), (c * x.to(ct) * (g * (1 - g))).to(logits.dtype)


def sigmoid_gated_collapse_jvp(x, logits, tx, tu, rounding="once"):
    """The tangent of h along tx and tu (None: zero), in X's dtype."""
    ct = compute_dtype(x, logits)
    g = torch.sigmoid(logits).to(ct) if rounding == "products" else torch.sigmoid(logits.to(ct))
    t = torch.zeros(x.shape, dtype=ct, device=x.device)
    if tx is not None:
        t = t + g * tx.to(ct)
    if tu is not None:
        t = t + x.to(ct) * (g * (1 - g)) * tu.to(ct)
    return t.mean(-2).to(x.dtype)


def _norm_parts(x, eps, ct):
    xf = x.to(ct)
    rstd = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return xf * rstd, rstd


def stream_norm_grads(dn, x, weight, eps, weight_offset, ct):
    """(dX, dw) of ``stream_norm`` in ``ct``, not rounded: xh = X rstd, g = dN (offset + w),
    dX_i = rstd_i (g_i - xh_i mean(g_i xh_i)), dw = the sum over tokens of dN * xh (n, C)."""
    xh, rstd = _norm_parts(x, eps, ct)
    dnf = dn.to(ct)
    g = dnf * (weight_offset + weight.to(ct))
    dx = rstd * (g - xh * (g * xh).mean(-1, keepdim=True))
    return dx, (dnf * xh).reshape(-1, *x.shape[-2:]).sum(0)


def stream_norm_backward(dn, x, weight, eps, weight_offset):
    """(dX, dw) of ``stream_norm``, in X's and w's dtypes."""
    dx, dw = stream_norm_grads(dn, x, weight, eps, weight_offset, compute_dtype(x, weight, dn))
    return dx.to(x.dtype), dw.to(weight.dtype)


def stream_norm_jvp(x, weight, tx, tw, eps, weight_offset):
    """The tangent of N along tx and tw (None: zero), in X's dtype."""
    ct = compute_dtype(x, weight)
    xh, rstd = _norm_parts(x, eps, ct)
    t = torch.zeros(x.shape, dtype=ct, device=x.device)
    if tx is not None:
        txf = tx.to(ct)
        t = t + rstd * (weight_offset + weight.to(ct)) * (txf - xh * (xh * txf).mean(-1, keepdim=True))
    if tw is not None:
        t = t + xh * tw.to(ct)
    return t.to(x.dtype)


def write_norm(x, y, h_post, weight, eps, weight_offset, rounding="once"):
    """(X', N'): ``write`` then ``stream_norm`` of X' as stored."""
    x2 = write(x, y, h_post, rounding)
    return x2, stream_norm(x2, weight, eps, weight_offset)


def write_norm_backward(dx2, dn, x2, y, h_post, weight, eps, weight_offset):
    """(dX, dy, dH_post, dw) of ``write_norm`` from the gradients of X' and N' (None: zero): g = dX' + the norm's
    dX' in the compute dtype (not rounded between), dX = g, dy = sum_i H_post[i] g_i, dH_post[i] = <g_i, y>.
    Rounding each product first has no gradient of its own: the same as rounding once."""
    ct = compute_dtype(x2, y, h_post, weight)
    # (a copy: dX is an output of its own, never the incoming gradient's storage)
    g = torch.zeros(x2.shape, dtype=ct, device=x2.device) if dx2 is None else dx2.to(ct, copy=True)
    dw = torch.zeros(weight.shape, dtype=ct, device=weight.device)
    if dn is not None:
        dxn, dw = stream_norm_grads(dn, x2, weight, eps, weight_offset, ct)
        g = g + dxn
    dy = (h_post.to(ct).unsqueeze(-1) * g).sum(-2)
    dpost = (g * y.to(ct).unsqueeze(-2)).sum(-1)
    return g.to(x2.dtype), dy.to(y.dtype), dpost.to(h_post.dtype), dw.to(weight.dtype)


def write_jvp(x, y, h_post, tx, ty, tpost):
    """The tangent of X' = X + H_post^T y along tx, ty, tpost (None: zero), in X's dtype."""
    ct = compute_dtype(x, y, h_post)
    t = torch.zeros(x.shape, dtype=ct, device=x.device)
    if tx is not None:
        t = t + tx.to(ct)
    if tpost is not None:
        t = t + tpost.to(ct).unsqueeze(-1) * y.to(ct).unsqueeze(-2)
    if ty is not None:
        t = t + h_post.to(ct).unsqueeze(-1) * ty.to(ct).unsqueeze(-2)
    return t.to(x.dtype)
