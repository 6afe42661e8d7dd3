"""Hyper-connections without a mixing matrix, in float64, transcribed equation by equation from the published
model code (HuggingFace transformers' HY-V4 and Qwen4-exp; neither has a paper that writes them down).

One token's stream X is (n, C), rows are streams; the functions take a leading batch of tokens (..., n, C) and
plain torch in float64. Nothing here is shared with ``addnorm.ops``: the operators are tested against these.

HY-V4's independent hyper-connection (iHC: DeepSeek-V4's hyper-connection without the mixing matrix ``comb``):
    v      = vec(X)                                                  (nC values)
    r      = 1 / sqrt(mean(v^2) + eps)                               the unweighted RMSNorm, as its inverse
    m      = (v W^T) r                                               W (2n, nC): the module's ``fn``
    H_pre  = sigmoid(s_pre m[:n] + b[:n]) + eps_hc                   s = ``scale`` (2,), b = ``base`` (2n,)
    H_post = magnitude sigmoid(s_post m[n:] + b[n:]) + eps_hc        magnitude = ``hc_magnitude`` (DeepSeek: 2)
    h      = sum_i H_pre[i] X_i                                      the sub-layer's input (before its own norm)
    X'     = X + H_post^T y                                          X'_i = X_i + H_post[i] y, y the sub-layer's output
  the head (``HYV4HyperHead``): H_pre alone (W (n, nC), one scale), h = sum_i H_pre[i] X_i before the final norm.

Qwen4-exp's gated residual (``Qwen4ExpTextGatedResidual``; rank r = ``hc_lowrank``):
    N_i    = X_i / sqrt(mean(X_i^2) + eps) * (1 + w_i)               each stream RMS-normed over C, w (n, C)
    G      = sigmoid(W_up silu(W_down vec(N) / n))                   (n, C): a gate per element, W_down (r, nC)
    h      = (1/n) sum_i G_i * N_i                                   the sub-layer's input
    a      = 2 sigmoid(W_inj vec(N) / n)                             (n,): the injection weights, W_inj (n, nC)
    X'     = X + a^T y                                               X'_i = X_i + a[i] y
  the final mixer (``hyper_connection_mixer``): h alone.
"""

from __future__ import annotations

import torch


def _f64(t):
    return t.to(torch.float64)


# ---- HY-V4


def ihc_rms_inverse(x, eps):
    """r = 1 / sqrt(mean(vec(X)^2) + eps): (..., n, C) -> (..., 1)."""
    v = _f64(x).flatten(-2)
    return 1 / torch.sqrt((v * v).mean(-1, keepdim=True) + eps)


def ihc_mixes(x, W, eps):
    """m = (vec(X) W^T) r: (..., n, C), (g n, nC) -> (..., g n)."""
    v = _f64(x).flatten(-2)
    return (v @ _f64(W).T) * ihc_rms_inverse(x, eps)


def ihc_pre(m, n, s_pre, b, eps_hc):
    """H_pre = sigmoid(s_pre m[:n] + b[:n]) + eps_hc."""
    return torch.sigmoid(_f64(s_pre) * m[..., :n] + _f64(b)[:n]) + eps_hc


def ihc_post(m, n, s_post, b, magnitude, eps_hc):
    """H_post = magnitude sigmoid(s_post m[n:2n] + b[n:2n]) + eps_hc."""
    return magnitude * torch.sigmoid(_f64(s_post) * m[..., n:2 * n] + _f64(b)[n:2 * n]) + eps_hc


def collapse(h_pre, x):
    """h = sum_i H_pre[i] X_i: (..., n), (..., n, C) -> (..., C)."""
    return (_f64(h_pre)[..., :, None] * _f64(x)).sum(-2)


def expand(x, y, h_post):
    """X' = X + H_post^T y: X'_i = X_i + H_post[i] y."""
    return _f64(x) + _f64(h_post)[..., :, None] * _f64(y)[..., None, :]


def ihc_read(x, W, scale, base, eps, eps_hc, magnitude):
    """(h, H_pre, H_post) of one iHC read; W (2n, nC), scale (2,), base (2n,)."""
    n = x.shape[-2]
    m = ihc_mixes(x, W, eps)
    h_pre = ihc_pre(m, n, scale[0], base, eps_hc)
    return collapse(h_pre, x), h_pre, ihc_post(m, n, scale[1], base, magnitude, eps_hc)


def ihc_head(x, W, scale, base, eps, eps_hc):
    """The final collapse: h = sum_i H_pre[i] X_i, W (n, nC), scale (1,), base (n,)."""
    h_pre = ihc_pre(ihc_mixes(x, W, eps), x.shape[-2], scale.reshape(-1)[0], base, eps_hc)
    return collapse(h_pre, x)


# ---- Qwen4-exp


def stream_rms_norm(x, w, eps, weight_offset=1.0):
    """N_i = X_i / sqrt(mean(X_i^2) + eps) * (offset + w_i): each stream over C, w (n, C)."""
    x = _f64(x)
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * (weight_offset + _f64(w))


def gates(N, W_down, W_up):
    """G = sigmoid(W_up silu(W_down vec(N) / n)): (..., n, C) -> (..., n, C)."""
    n = N.shape[-2]
    z = torch.nn.functional.silu((_f64(N).flatten(-2) @ _f64(W_down).T) / n)
    return torch.sigmoid(z @ _f64(W_up).T).reshape(N.shape)


def gated_collapse(G, N):
    """h = (1/n) sum_i G_i * N_i."""
    return (_f64(G) * _f64(N)).mean(-2)


def injection_weights(N, W_inj):
    """a = 2 sigmoid(W_inj vec(N) / n): (..., n, C) -> (..., n)."""
    return 2 * torch.sigmoid((_f64(N).flatten(-2) @ _f64(W_inj).T) / N.shape[-2])


def gated_read(x, w, eps, W_down, W_up, W_inj=None):
    """(h, a) of one gated-residual read (a None for the final mixer, which has no W_inj)."""
    N = stream_rms_norm(x, w, eps)
    h = gated_collapse(gates(N, W_down, W_up), N)
    return h, None if W_inj is None else injection_weights(N, W_inj)
