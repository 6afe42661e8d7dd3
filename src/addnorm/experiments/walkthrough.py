"""The Add & Norm pipeline on one real tensor (seed 000 Part 3, seed 001 step by step).

A short sentence is embedded (seeded byte embeddings + positions), passed through a real causal
self-attention sub-layer F, then the residual "Add" (x + F(x)) and the "Norm" (LayerNorm). The
result records, for every stage and every position, the mean and std over the features -- the
numbers the seeds print -- computed, not simulated.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from .. import functional as AF


@dataclass(frozen=True)
class WalkthroughConfig:
    text: str = "I like transformers"  # the sentence, read as bytes (one token per word here)
    d_model: int = 16  # seed 001's width
    n_head: int = 2
    eps: float = 1e-5
    seed: int = 42


@dataclass
class StageStats:
    name: str
    mean: list[float]  # per position, over the d_model features
    std: list[float]  # per position, biased (what LayerNorm normalizes to 1)
    values: list[list[float]] = field(repr=False)


@dataclass
class Walkthrough:
    config: WalkthroughConfig
    tokens: list[str]
    stages: list[StageStats]
    backend: str


def _stats(name: str, t: torch.Tensor) -> StageStats:
    t = t.detach().double()
    return StageStats(name, t.mean(-1).tolist(), t.std(-1, unbiased=False).tolist(), t.tolist())


def run_walkthrough(config: WalkthroughConfig = WalkthroughConfig()) -> Walkthrough:
    g = torch.Generator().manual_seed(config.seed)
    words = config.text.split()
    T, d = len(words), config.d_model
    # token ids: a stable hash of each word's bytes into a small vocabulary
    vocab = 256
    ids = torch.tensor([sum(w.encode()) % vocab for w in words])
    tok = torch.randn(vocab, d, generator=g) * 0.1  # seed 001: random_vector(scale=0.1)
    pos = torch.randn(T, d, generator=g) * 0.1
    x = (tok[ids] + pos).unsqueeze(0)  # (1, T, d)

    attn = nn.MultiheadAttention(d, config.n_head, bias=True, batch_first=True)
    with torch.no_grad():
        for p in attn.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.1 if p.dim() > 1 else torch.zeros(p.shape))
    causal = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)
    with torch.no_grad():
        fx, _ = attn(x, x, x, attn_mask=causal, need_weights=False)  # F(x): real attention
        normed, added = AF.add_layer_norm(fx, x, d, eps=config.eps)  # Add & Norm in one call
    stages = [_stats("input x", x[0]), _stats("sub-layer F(x)", fx[0]), _stats("add x + F(x)", added[0]),
              _stats("norm LayerNorm(x + F(x))", normed[0])]
    return Walkthrough(config, words, stages, AF.last_backend())
