"""The widened stream's read and write in torch ops: what the kernels compute, each output rounded once.

    read    h = sum_i H_pre[i] X_i                                 X (..., n, C), H_pre (..., n)
    write   X'_i = sum_j H_res[i, j] X_j + H_post[i] y,  q = sum |X'|^2 (of X' as stored)
backward (g = dX' + 2 dq X'):
    read    dX_i = H_pre[i] dh,  dH_pre[i] = <dh, X_i>
    write   dX = H_res^T g,  dy = sum_i H_post[i] g_i,  dH_post[i] = <g_i, y>,  dH_res[i, j] = <g_i, X_j>
Sums in float32 (float64 for float64 tensors); these formulas are differentiable again (double backward).
"""

from __future__ import annotations

import torch


def compute_dtype(*ts) -> torch.dtype:
    return torch.float64 if any(t is not None and t.dtype == torch.float64 for t in ts) else torch.float32


def read(x, h_pre):
    ct = compute_dtype(x, h_pre)
    return (h_pre.to(ct).unsqueeze(-1) * x.to(ct)).sum(-2).to(x.dtype)


def read_backward(dh, x, h_pre):
    ct = compute_dtype(x, h_pre, dh)
    d = dh.to(ct).unsqueeze(-2)
    dx = (h_pre.to(ct).unsqueeze(-1) * d).to(x.dtype)
    d_pre = (d * x.to(ct)).sum(-1).to(h_pre.dtype)
    return dx, d_pre


def write(x, y, h_post, h_res):
    """(X', q): q in the compute dtype, from X' as stored."""
    ct = compute_dtype(x, y, h_post, h_res)
    x2 = (torch.matmul(h_res.to(ct), x.to(ct)) + h_post.to(ct).unsqueeze(-1) * y.to(ct).unsqueeze(-2)).to(x.dtype)
    xf = x2.to(ct)
    return x2, (xf * xf).sum((-2, -1))


def write_backward(dx2, dq, x, y, x2, h_post, h_res):
    ct = compute_dtype(x, y, h_post, h_res)
    g = dx2.to(ct) if dx2 is not None else torch.zeros(x.shape, dtype=ct, device=x.device)
    if dq is not None:
        g = g + 2 * dq.to(ct)[..., None, None] * x2.to(ct)
    dx = torch.matmul(h_res.to(ct).transpose(-1, -2), g).to(x.dtype)
    dy = (h_post.to(ct).unsqueeze(-1) * g).sum(-2).to(y.dtype)
    d_post = (g * y.to(ct).unsqueeze(-2)).sum(-1).to(h_post.dtype)
    d_res = torch.matmul(g, x.to(ct).transpose(-1, -2)).to(h_res.dtype)
    return dx, dy, d_post, d_res
