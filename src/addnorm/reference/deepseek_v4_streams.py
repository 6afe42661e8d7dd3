"""DeepSeek-V4's hyper-connection (its mHC, as HuggingFace's ``DeepseekV4HyperConnection`` and
``DeepseekV4HyperHead`` compute it) in float64, one function per step, transcribed from the model code.

It is mHC (``reference.streams``) with conventions of its own, each a step below:

    flat   = vec(X) / sqrt(mean(vec(X)^2) + rms_eps)              X (..., n, C), vec(X) (..., nC)
    z      = flat fn^T,  split in the order [pre (n), post (n), comb (n^2)]     fn (m, nC), m = (2 + n) n
    pre    = sigmoid(scale[0] z_pre + base_pre) + hc_eps          eps added to pre
    post   = 2 sigmoid(scale[1] z_post + base_post)
    comb   = softmax(scale[2] mat(z_comb) + base_comb, rows) + hc_eps      Sinkhorn starts from softmax + eps
    comb   = comb / (column sums + hc_eps), then (iters - 1) times:        eps added at each normalisation
             comb / (row sums + hc_eps), comb / (column sums + hc_eps)
    h      = sum_i pre[i] X_i                                     the sub-layer's input (the collapse)
    X'_k   = post[k] y + sum_j comb[j, k] X_j                     comb transposed: X' = comb^T X + post^T y

and the model's last step, before its final norm (the hyper head: the pre map alone, its own projection):

    out    = sum_i (sigmoid(hc_scale z_i + hc_base_i) + hc_eps) X_i,   z = flat hc_fn^T   hc_fn (n, nC)

Nothing here is shared with ``addnorm.ops``: the operators are tested against these functions.
"""

from __future__ import annotations

import torch


def _f64(*ts):
    return tuple(t.to(torch.float64) for t in ts)


def flat_rms_norm(x, rms_eps):
    """vec(X) / RMS(vec(X)): (..., n, C) -> (..., nC), no weight (DeepseekV4UnweightedRMSNorm)."""
    (v,) = _f64(x.flatten(-2))
    return v / torch.sqrt((v * v).mean(-1, keepdim=True) + rms_eps)


def projection(flat, fn, n):
    """(z_pre (..., n), z_post (..., n), z_comb (..., n, n)): the rows of fn in the order [pre, post, comb],
    comb's row-major."""
    (fn,) = _f64(fn)
    z = flat @ fn.transpose(0, 1)
    return z[..., :n], z[..., n:2 * n], z[..., 2 * n:].reshape(*z.shape[:-1], n, n)


def pre_map(z_pre, scale, base_pre, hc_eps):
    return torch.sigmoid(z_pre * scale + base_pre) + hc_eps


def post_map(z_post, scale, base_post):
    return 2 * torch.sigmoid(z_post * scale + base_post)


def comb_sinkhorn(z_comb, scale, base_comb, hc_eps, iters):
    """Softmax over each row, + eps; then columns; then (iters - 1) rounds of rows, columns; every sum + eps."""
    comb = torch.softmax(z_comb * scale + base_comb, dim=-1) + hc_eps
    comb = comb / (comb.sum(-2, keepdim=True) + hc_eps)
    for _ in range(iters - 1):
        comb = comb / (comb.sum(-1, keepdim=True) + hc_eps)
        comb = comb / (comb.sum(-2, keepdim=True) + hc_eps)
    return comb


def collapse(pre, x):
    """h = sum_i pre[i] X_i: (..., n), (..., n, C) -> (..., C)."""
    pre, x = _f64(pre, x)
    return (pre.unsqueeze(-1) * x).sum(-2)


def write(x, y, post, comb):
    """X'_k = post[k] y + sum_j comb[j, k] X_j (comb consumed transposed)."""
    x, y, post, comb = _f64(x, y, post, comb)
    return post.unsqueeze(-1) * y.unsqueeze(-2) + comb.transpose(-1, -2) @ x


def hyper_connection(x, fn, base, scale, rms_eps, hc_eps, iters):
    """DeepseekV4HyperConnection.forward: (post, comb, collapsed) from the stream X (..., n, C)."""
    n = x.shape[-2]
    base, scale = _f64(base, scale)
    z_pre, z_post, z_comb = projection(flat_rms_norm(x, rms_eps), fn, n)
    pre = pre_map(z_pre, scale[0], base[:n], hc_eps)
    post = post_map(z_post, scale[1], base[n:2 * n])
    comb = comb_sinkhorn(z_comb, scale[2], base[2 * n:].reshape(n, n), hc_eps, iters)
    return post, comb, collapse(pre, x)


def hyper_head(x, hc_fn, hc_base, hc_scale, rms_eps, hc_eps):
    """DeepseekV4HyperHead.forward: the streams collapsed once more, by a pre map of the head's own."""
    hc_fn, hc_base, hc_scale = _f64(hc_fn, hc_base, hc_scale)
    z = flat_rms_norm(x, rms_eps) @ hc_fn.transpose(0, 1)
    return collapse(pre_map(z, hc_scale.reshape(()), hc_base, hc_eps), x)
