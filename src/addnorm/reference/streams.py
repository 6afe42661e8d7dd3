"""Widened residual streams in float64, transcribed equation by equation from the papers.

Plain torch in float64, one function per equation, named as the papers name them, so that each line
can be read beside the paper. Shapes follow the papers: one token's stream x is (n, C), rows are
streams; the functions take a leading batch of tokens (..., n, C). Nothing here is shared with
``addnorm.model``: the model is tested against these, never against itself.

Hyper-Connections (Zhu et al., ICLR 2025, arXiv:2409.19606), dynamic (DHC):
    H_bar   = norm(H)
    B(H)    = s_beta  * tanh(H_bar W_beta)^T + B            (1 x n)
    A_m(H)  = s_alpha * tanh(H_bar W_m)      + A_m          (n x 1)
    A_r(H)  = s_alpha * tanh(H_bar W_r)      + A_r          (n x n)
    h_0     = A_m(H)^T H                                    the layer's input
    H'      = B(H)^T T(h_0) + A_r(H)^T H                    (T: the layer, its own pre-norm inside)

mHC (DeepSeek, arXiv:2512.24880):
    x_{l+1} = H_res x_l + H_post^T F(H_pre x_l)                                  (eq. 3)
    x~' = RMSNorm(vec(x_l))                                                      (eq. 7)
    H~_pre = a_pre (x~' phi_pre) + b_pre;  H~_post = a_post (x~' phi_post) + b_post;
    H~_res = a_res mat(x~' phi_res) + b_res
    H_pre = sigmoid(H~_pre);  H_post = 2 sigmoid(H~_post);  H_res = SK(H~_res)  (eq. 8)
    SK: M0 = exp(H~_res);  M_t = T_r(T_c(M_{t-1}));  H_res = M_{t_max}          (eq. 9)

mHC-lite (arXiv:2601.05732):  H_res = sum_k softmax(a_res (x~' W_res) + b_res)_k P_k over the n! P_k.

Amax gain magnitude (mHC section 3.1): of a mapping A, forward max_i |sum_j A_ij| (row sums),
backward max_j |sum_i A_ij| (column sums).
"""

from __future__ import annotations

import itertools

import torch


def _f64(t):
    return t.to(torch.float64)


# ---- Hyper-Connections


def hc_dynamic(H, A_m, A_r, B, W_m, W_r, W_beta, s_alpha, s_beta, norm):
    """DHC: returns (A_m(H) (..., n), A_r(H) (..., n, n), B(H) (..., n)); ``norm`` maps H -> H_bar."""
    H_bar = norm(H)  # (..., n, C)
    Bd = s_beta * torch.tanh(H_bar @ W_beta) + B  # (..., n): B(H) as a vector over streams
    Amd = s_alpha * torch.tanh(H_bar @ W_m) + A_m  # (..., n)
    Ard = s_alpha * torch.tanh(H_bar @ W_r) + A_r  # (..., n, n): row j = stream j's weights
    return Amd, Ard, Bd


def hc_layer_input(A_m, H):
    """h_0 = A_m^T H: (..., n), (..., n, C) -> (..., C)."""
    return torch.einsum("...j,...jc->...c", A_m, H)


def hc_layer_output(H, y, A_r, B):
    """H' = B^T y + A_r^T H: stream i gets B_i y + sum_j A_r[j, i] H_j."""
    return B[..., :, None] * y[..., None, :] + torch.einsum("...ji,...jc->...ic", A_r, H)


# ---- mHC


def mhc_eq7_rmsnorm(x, eps):
    """x~' = RMSNorm(vec(x)): (..., n, C) -> (..., nC), no weight (the paper folds it into phi)."""
    v = x.flatten(-2)
    return v / torch.sqrt((v * v).mean(-1, keepdim=True) + eps)


def mhc_eq8_pre(xp, phi_pre, a_pre, b_pre):
    return torch.sigmoid(a_pre * (xp @ phi_pre) + b_pre)


def mhc_eq8_post(xp, phi_post, a_post, b_post):
    return 2 * torch.sigmoid(a_post * (xp @ phi_post) + b_post)


def mhc_eq8_res_logits(xp, phi_res, a_res, b_res, n):
    """H~_res = a_res mat(x~' phi_res) + b_res, mat row-major: H~[i, j] = (x~' phi_res)[i n + j]."""
    return a_res * (xp @ phi_res).reshape(*xp.shape[:-1], n, n) + b_res


def mhc_eq9_sinkhorn(logits, t_max):
    """M0 = exp(H~_res); M_t = T_r(T_c(M_{t-1})); returns M_{t_max}."""
    M = torch.exp(logits)
    for _ in range(t_max):
        M = M / M.sum(dim=-2, keepdim=True)  # T_c
        M = M / M.sum(dim=-1, keepdim=True)  # T_r
    return M


def mhc_eq3(x, y, H_post, H_res):
    """x_{l+1} = H_res x_l + H_post^T y, with y = F(H_pre x_l)."""
    return H_res @ x + H_post[..., :, None] * y[..., None, :]


def mhc_layer_input(H_pre, x):
    """H_pre x_l: (..., n) (..., n, C) -> (..., C)."""
    return (H_pre[..., :, None] * x).sum(-2)


def permutations(n):
    """The n! permutation matrices P_k, P_k[i, perm_k(i)] = 1, identity first."""
    eye = torch.eye(n, dtype=torch.float64)
    return torch.stack([eye[list(p)] for p in itertools.permutations(range(n))])


def mhc_lite_res(xp, W_res, a_res, b_res, n):
    """H_res = sum_k softmax(a_res (x~' W_res) + b_res)_k P_k."""
    a = torch.softmax(a_res * (xp @ W_res) + b_res, dim=-1)
    P = permutations(n)
    return (a[..., :, None, None] * P).sum(-3)


# ---- the mHC paper's measure


def amax_gain(A):
    """(forward, backward) Amax gain magnitude of A (..., n, n) (mHC section 3.1, Figure 3's caption): the maximum
    absolute row sum max_i sum_j |A_ij| and the maximum absolute column sum max_j sum_i |A_ij|."""
    A = _f64(A).abs()
    return A.sum(-1).amax(-1), A.sum(-2).amax(-1)


def composite_mapping(Hs, l):
    """mHC eq. 4's composite mapping of sub-layer l of L = len(Hs): prod_{i=1}^{L-l} H_res_{L-i} = H_{L-1} ... H_l."""
    out = _f64(Hs[len(Hs) - 1])
    for i in range(2, len(Hs) - l + 1):
        out = out @ _f64(Hs[len(Hs) - i])
    return out
