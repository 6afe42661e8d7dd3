"""nGPT, the normalized Transformer (Loshchilov, Hsieh, Sun & Ginsburg, ICLR 2025, arXiv:2410.01131).

Every hidden state and every weight row that touches the embedding dimension lives on the unit
sphere; a block moves the state along the sphere instead of adding to it:

    h_A = Norm(ATTN(h));   h <- Norm(h + alpha_A (h_A - h))          (eq. 10)
    h_M = Norm(MLP(h));    h <- Norm(h + alpha_M (h_M - h))          (eq. 11)   Norm(x) = x / ||x||_2

alpha_A, alpha_M are per-channel "eigen learning rates", used as |alpha|. Attention normalizes q and k
per head after RoPE (RoPE here rotates the pairs (i, i + d_k/2); the paper's code rotates adjacent
pairs, an equivalent choice of basis), scales them by s_qk (a d_k vector per head) and uses softmax
scale sqrt(d_k) (eqs. 15-16); the MLP is SwiGLU with u * s_u and v * s_v * sqrt(d_model) (eqs. 20-21),
d_MLP = 4 d_model; the logits are s_z * (h E_out^T) (eq. 3). Each learned scale s is stored as s_param and used as
s_param * (s_init / s_scale), s_param starting at s_scale (the paper's trick to give it the learning
rate of the weights). There are no biases, no norm layers, no position embeddings and no final norm.

The weights stay on the sphere only if they are put back after every optimizer step:
``GPT.normalize_()`` (``normalize_ngpt_`` here) does that; call it after ``optimizer.step()``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from .value_residual import FirstValues, ValueResidual

ALPHA_INIT = 0.05  # alpha_A, alpha_M (the paper's 0.05 for its 0.5B/1B models)
ROPE_BASE = 10000.0


def l2_normalize(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """x / ||x||_2 along dim (computed in float32 at least)."""
    xf = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
    return (xf / xf.norm(dim=dim, keepdim=True).clamp_min(1e-12)).to(x.dtype)


def rope(x: torch.Tensor, base: float = ROPE_BASE) -> torch.Tensor:
    """Rotary position embedding of (B, nh, T, hs): pairs (x_i, x_{i + hs/2}) rotated by t * base^(-2i/hs)."""
    T, hs = x.shape[-2], x.shape[-1]
    inv = base ** (-torch.arange(0, hs // 2, device=x.device, dtype=torch.float64) * 2 / hs)
    ang = torch.arange(T, device=x.device, dtype=torch.float64)[:, None] * inv[None, :]  # (T, hs/2)
    cos, sin = ang.cos().to(x.dtype), ang.sin().to(x.dtype)
    x1, x2 = x[..., : hs // 2], x[..., hs // 2:]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


class Scale(nn.Module):
    """A learned per-channel scale s = s_param * (init / scale), s_param initialised to ``scale``."""

    def __init__(self, dim: int, init: float, scale: float):
        super().__init__()
        self.init, self.scale = float(init), float(scale)
        self.weight = nn.Parameter(torch.full((dim,), self.scale))

    def reset_parameters(self) -> None:
        nn.init.constant_(self.weight, self.scale)

    def forward(self) -> torch.Tensor:
        return self.weight * (self.init / self.scale)

    def extra_repr(self) -> str:
        return f"{self.weight.numel()}, init={self.init:g}, scale={self.scale:g}"


class NormalizedAttention(nn.Module):
    def __init__(self, n_embd: int, n_head: int, *, value_residual: bool = False, first_layer: bool = True):
        super().__init__()
        self.n_head, self.n_embd = n_head, n_embd
        hs = n_embd // n_head
        self.c_attn = nn.Linear(n_embd, 3 * n_embd, bias=False)
        self.c_proj = nn.Linear(n_embd, n_embd, bias=False)
        self.s_qk = Scale(n_embd, 1.0, 1.0 / math.sqrt(n_embd))  # a d_k vector per head (eqs. 15-16)
        self.value_residual = ValueResidual(first_layer) if value_residual else None

    def forward(self, x: torch.Tensor, attention_mask: torch.Tensor | None = None, values: FirstValues | None = None):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        if self.value_residual is not None:
            v = self.value_residual(v, values)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))  # (B, nh, T, hs)
        s = self.s_qk().view(1, self.n_head, 1, C // self.n_head)
        q, k = l2_normalize(rope(q)) * s, l2_normalize(rope(k)) * s  # RoPE, then Norm, then s_qk
        mask = None
        if attention_mask is not None:
            keep = attention_mask[:, None, None, :].to(torch.bool) & torch.ones(T, T, dtype=torch.bool,
                                                                                   device=x.device).tril()
            mask = torch.zeros(keep.shape, dtype=q.dtype, device=x.device).masked_fill(~keep, torch.finfo(q.dtype).min)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None,
                                           scale=math.sqrt(C // self.n_head))  # sqrt(d_k), not 1/sqrt(d_k)
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


class NormalizedMLP(nn.Module):
    """SwiGLU: (u * s_u) * silu(v * s_v * sqrt(d_model)), then the output projection."""

    def __init__(self, n_embd: int, d_ff: int):
        super().__init__()
        self.n_embd = n_embd
        self.c_fc = nn.Linear(n_embd, 2 * d_ff, bias=False)
        self.c_proj = nn.Linear(d_ff, n_embd, bias=False)
        self.s_u = Scale(d_ff, 1.0, 1.0)
        self.s_v = Scale(d_ff, 1.0, 1.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        u, v = self.c_fc(x).chunk(2, dim=-1)
        return self.c_proj(u * self.s_u() * F.silu(v * self.s_v() * math.sqrt(self.n_embd)))


def normalized_update(h: torch.Tensor, f: torch.Tensor, alpha: torch.Tensor) -> torch.Tensor:
    """h <- Norm(h + |alpha| (Norm(f) - h)) (eqs. 10-11; the paper's appendix A.2 uses |alpha|)."""
    return l2_normalize(h + alpha.abs() * (l2_normalize(f) - h))


class NormalizedBlock(nn.Module):
    """One nGPT layer: attention then MLP, each a step along the sphere with its eigen learning rate."""

    def __init__(self, config, layer_idx: int = 0, placement=None):
        super().__init__()
        c = config
        self.layer_idx, self.placement = layer_idx, placement
        scale = 1.0 / math.sqrt(c.n_embd)
        self.attn = NormalizedAttention(c.n_embd, c.n_head, value_residual=c.value_residual, first_layer=layer_idx == 0)
        self.mlp = NormalizedMLP(c.n_embd, c.ff_dim)
        self.alpha_attn = Scale(c.n_embd, ALPHA_INIT, scale)
        self.alpha_mlp = Scale(c.n_embd, ALPHA_INIT, scale)

    def forward(self, h: torch.Tensor, attention_mask: torch.Tensor | None = None, *, pending=None,
                stream: bool = False, values: FirstValues | None = None):
        if pending is not None:
            raise ValueError("nGPT blocks leave nothing pending: pending must be None")
        h = normalized_update(h, self.attn(h, attention_mask, values), self.alpha_attn())
        h = normalized_update(h, self.mlp(h), self.alpha_mlp())
        return (h, None) if stream else h


# (module path suffix, dim along which the rows that touch the embedding are normalized)
_SPHERE = (("attn.c_attn", 1), ("attn.c_proj", 0), ("mlp.c_fc", 1), ("mlp.c_proj", 0))


@torch.no_grad()
def normalize_ngpt_(model: nn.Module) -> None:
    """Put every embedding-dimension vector of an nGPT model back on the unit sphere: the token
    embedding and output embedding rows, and the rows or columns of each block's matrices that lie
    along the embedding dimension (q, k, v and the MLP input: rows of length d_model; the attention and
    MLP output projections: columns of length d_model)."""
    for w in (model.wte.weight, model.lm_head.weight):
        w.copy_(l2_normalize(w, dim=1))
    for block in model.h:
        for path, dim in _SPHERE:
            mod = block.get_submodule(path)
            mod.weight.copy_(l2_normalize(mod.weight, dim=dim))
