"""Attention Residuals in float64, transcribed equation by equation from the paper (plain torch).

Kimi Team 2026, Attention Residuals, arXiv:2603.15031. The paper counts every attention and every MLP as a
layer: l = 1 .. L over sub-layers, L = 2 n_layer; h_l is the input of sub-layer l, h_1 the token embedding,
f_l(h_l) its output (the sub-layer keeps its own pre-norm inside f_l).

Full AttnRes (section 3.1):
    h_l = alpha_{0->l} h_1 + sum_{i=1}^{l-1} alpha_{i->l} f_i(h_i)                       (eq. 1)
    alpha_{i->l} = phi(q_l, k_i) / sum_{j=0}^{l-1} phi(q_l, k_j),
    phi(q, k) = exp(q^T RMSNorm(k))                                                      (eq. 2)
    q_l = w_l (a learned d-vector per layer, zero at init: uniform weights);
    k_i = v_i = h_1 (i = 0), f_i(h_i) (1 <= i <= l-1)                                    (eq. 3)
    h_l = sum_{i=0}^{l-1} alpha_{i->l} v_i                                               (eq. 4)

Block AttnRes (section 3.2): the L layers in blocks of S; B_n the layers of block n:
    b_n = sum_{j in B_n} f_j(h_j);  b_n^i the partial sum over its first i layers;  b_0 = h_1   (eq. 5)
    for the i-th layer of block n the values (and keys, eq. 3; weights, eq. 2) are
        V = [b_0, ..., b_{n-1}]               if i = 1
            [b_0, ..., b_{n-1}, b_n^{i-1}]    if i >= 2                                  (eq. 6)
S = 1 is Full AttnRes; one block of every layer is the plain residual sum with the embedding kept apart.
The final output layer aggregates every block representation with a query of its own (section 3.2); the
final norm and the LM head read that. RMSNorm here is the paper's RMSNorm(k) = k / RMS(k), times a weight
where the key norm has one (the official code's per-layer norm module).
"""

from __future__ import annotations

import torch


def rms_norm(k, weight=None, eps=1e-5):
    """RMSNorm(k) over the last axis: k / sqrt(mean(k^2) + eps), times ``weight`` if given."""
    y = k / torch.sqrt((k * k).mean(-1, keepdim=True) + eps)
    return y if weight is None else y * weight


def eq2_weights(q, keys, weight=None, eps=1e-5):
    """alpha_i = exp(q^T RMSNorm(k_i)) / sum_j exp(q^T RMSNorm(k_j)): keys a list of (..., d) -> (..., len(keys))."""
    phi = torch.stack([torch.exp((rms_norm(k, weight, eps) * q).sum(-1)) for k in keys], dim=-1)
    return phi / phi.sum(-1, keepdim=True)


def eq4_input(alpha, values):
    """h = sum_i alpha_i v_i: alpha (..., len(values)), each value (..., d)."""
    return sum(alpha[..., i:i + 1] * v for i, v in enumerate(values))


def attn_res(values, q, weight=None, eps=1e-5):
    """One AttnRes: eqs. 2-4 with keys equal to values (eq. 3)."""
    return eq4_input(eq2_weights(q, values, weight, eps), values)


def eq6_values(blocks, partial):
    """The sources of a layer: the completed block representations b_0 .. b_{n-1}, and the current block's
    partial sum b_n^{i-1} when the layer is not the first of its block (``partial`` None)."""
    return list(blocks) if partial is None else [*blocks, partial]


def eq5_partial(partial, f):
    """b_n^i = b_n^{i-1} + f: the running sum of the block's layer outputs (b_n^1 = f)."""
    return f if partial is None else partial + f
