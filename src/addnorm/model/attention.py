"""Causal multi-head self-attention (Vaswani et al. 2017), GPT-2's parameter layout."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from .value_residual import FirstValues, ValueResidual


class MultiHeadAttention(nn.Module):
    r"""softmax(Q Kᵀ / √d_head + mask) V over ``n_head`` heads, then an output projection.

    ``c_attn`` projects to Q, K, V at once and ``c_proj`` mixes the heads (GPT-2's names, so
    checkpoints map one to one). Masks: ``causal`` (each position sees itself and the past) and an
    optional padding ``attention_mask`` of shape (B, T), 1 = real token, 0 = padding.

    ``qkv_norm`` (HybridNorm): a factory of norms of size d_k; Q, K and V are each normalized per head
    after their projection, one norm (one weight vector) each for all heads.
    ``value_residual`` (ResFormer): see ``value_residual_mix``; the first layer's values reach later
    layers through the ``values`` (a ``FirstValues``) that the model passes to every block.
    """

    def __init__(self, n_embd: int, n_head: int, bias: bool = True, dropout: float = 0.0, causal: bool = True,
                 *, qkv_norm: Callable[[], nn.Module] | None = None, value_residual: bool = False,
                 first_layer: bool = True):
        super().__init__()
        if n_embd % n_head:
            raise ValueError(f"n_embd={n_embd} must be divisible by n_head={n_head}")
        self.n_head, self.n_embd, self.causal, self.dropout = n_head, n_embd, causal, dropout
        self.c_attn = nn.Linear(n_embd, 3 * n_embd, bias=bias)
        self.c_proj = nn.Linear(n_embd, n_embd, bias=bias)
        self.resid_dropout = nn.Dropout(dropout)
        if qkv_norm is not None:
            self.q_norm, self.k_norm, self.v_norm = qkv_norm(), qkv_norm(), qkv_norm()
        else:
            self.q_norm = self.k_norm = self.v_norm = None
        self.value_residual = ValueResidual(first_layer) if value_residual else None

    def forward(self, x: torch.Tensor, attention_mask: torch.Tensor | None = None,
                values: FirstValues | None = None) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        if self.q_norm is not None:  # HybridNorm eq. 5: each head's q, k, v normed over d_k (one weight for all heads)
            hs = C // self.n_head
            q, k, v = (n(t.view(B, T, self.n_head, hs))[0].view(B, T, C)
                       for n, t in ((self.q_norm, q), (self.k_norm, k), (self.v_norm, v)))
        if self.value_residual is not None:
            v = self.value_residual(v, values)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        mask = None
        if attention_mask is not None:
            # additive mask with the dtype's minimum (not -inf), as HuggingFace does, so a padded
            # query whose every key is masked gets a uniform row instead of NaN
            keep = attention_mask[:, None, None, :].to(torch.bool)  # (B, 1, 1, T)
            if self.causal:
                keep = keep & torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
            mask = torch.zeros(keep.shape, dtype=q.dtype, device=x.device).masked_fill(~keep, torch.finfo(q.dtype).min)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=self.dropout if self.training else 0.0,
                                           is_causal=self.causal and mask is None)
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # (B, T, C): heads side by side
        return self.resid_dropout(self.c_proj(y))
