"""Seed 001's tiny transformer, in pure Python (lists), with the pure-Python LayerNorm backend.

A 5-token sentence (<BOS> I like transformers <EOS>), d_model 16, two causal attention heads, a GELU
feed-forward of width 64, the residual "Add" and LayerNorm -- the same computation, in the same
order and from the same seeded random weights (``random.seed(42)``, N(0, 0.1)) as the seed. Every
number comes from plain Python floats; ``cross_check`` recomputes it all with PyTorch.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

from ..reference import pure_python as pp

TOKEN_NAMES = ["<PAD>", "<BOS>", "<EOS>", "I", "like", "transformers"]


@dataclass(frozen=True)
class Seed001Config:
    vocab_size: int = 6
    d_model: int = 16
    d_ff: int = 64
    max_seq_len: int = 5
    num_heads: int = 2
    epsilon: float = 1e-5
    seed: int = 42
    tokens: tuple[int, ...] = (1, 3, 4, 5, 2)  # <BOS> I like transformers <EOS>


@dataclass
class Seed001Run:
    config: Seed001Config
    weights: dict = field(repr=False)
    X: list  # embeddings + positions
    multi_head_output: list
    ffn_output: list
    residual: list  # attention output + FFN output (the seed's "Add")
    layer_norm_output: list
    stats: list[pp.RowStats]  # per position
    caches: list = field(repr=False)


def _vec(rng, n, scale=0.1):
    return [rng.gauss(0, scale) for _ in range(n)]


def _mat(rng, rows, cols, scale=0.1):
    return [[rng.gauss(0, scale) for _ in range(cols)] for _ in range(rows)]


def matmul(A, B):
    n, p = len(A[0]), len(B[0])
    return [[sum(A[i][k] * B[k][j] for k in range(n)) for j in range(p)] for i in range(len(A))]


def transpose(A):
    return [[A[i][j] for i in range(len(A))] for j in range(len(A[0]))]


def softmax(vec):
    m = max(v for v in vec if v != float("-inf"))
    e = [math.exp(v - m) if v != float("-inf") else 0.0 for v in vec]
    s = sum(e)
    return [v / s for v in e]


def gelu(x):
    return 0.5 * x * (1 + math.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))


def causal_attention(Q, K, V):
    T, dk = len(Q), len(Q[0])
    scores = [[s / math.sqrt(dk) for s in row] for row in matmul(Q, transpose(K))]
    for i in range(T):
        for j in range(i + 1, T):
            scores[i][j] = float("-inf")
    return matmul([softmax(r) for r in scores], V)


def run_seed001(cfg: Seed001Config = Seed001Config()) -> Seed001Run:
    rng = random.Random(cfg.seed)
    d, dk, H = cfg.d_model, cfg.d_model // cfg.num_heads, cfg.num_heads
    # weights drawn in the seed's order
    E_token = [_vec(rng, d) for _ in range(cfg.vocab_size)]
    E_pos = [_vec(rng, d) for _ in range(cfg.max_seq_len)]
    X = [pp.add(E_token[t], E_pos[i]) for i, t in enumerate(cfg.tokens)]
    W_Q = [_mat(rng, d, dk) for _ in range(H)]
    W_K = [_mat(rng, d, dk) for _ in range(H)]
    W_V = [_mat(rng, d, dk) for _ in range(H)]
    heads = [causal_attention(matmul(X, W_Q[h]), matmul(X, W_K[h]), matmul(X, W_V[h])) for h in range(H)]
    concat = [sum((heads[h][i] for h in range(H)), []) for i in range(len(X))]
    W_O = _mat(rng, d, d)
    mho = matmul(concat, transpose(W_O))
    W1, b1, W2, b2 = _mat(rng, cfg.d_ff, d), _vec(rng, cfg.d_ff), _mat(rng, d, cfg.d_ff), _vec(rng, d)
    hidden = [[h + b1[j] for j, h in enumerate(row)] for row in matmul(mho, transpose(W1))]
    act = [[gelu(h) for h in row] for row in hidden]
    ffn = [[v + b2[j] for j, v in enumerate(row)] for row in matmul(act, transpose(W2))]
    residual = [pp.add(mho[i], ffn[i]) for i in range(len(X))]
    gamma, beta = [1.0] * d, [0.0] * d
    outs, caches = pp.layer_norm_rows(residual, gamma, beta, cfg.epsilon)
    weights = dict(E_token=E_token, E_pos=E_pos, W_Q=W_Q, W_K=W_K, W_V=W_V, W_O=W_O, W1=W1, b1=b1, W2=W2, b2=b2,
                   gamma=gamma, beta=beta)
    return Seed001Run(cfg, weights, X, mho, ffn, residual, outs, [c.stats for c in caches], caches)


def cross_check(run: Seed001Run) -> dict[str, float]:
    """Recompute every stage with PyTorch (float64) from the same weights; max |difference| per stage."""
    import torch
    import torch.nn.functional as F

    t = lambda v: torch.tensor(v, dtype=torch.float64)  # noqa: E731
    w, c = run.weights, run.config
    X = t(run.X)
    T = X.shape[0]
    mask = torch.ones(T, T, dtype=torch.bool).triu(1)
    heads = []
    for h in range(c.num_heads):
        q, k, v = X @ t(w["W_Q"][h]), X @ t(w["W_K"][h]), X @ t(w["W_V"][h])
        s = (q @ k.T / math.sqrt(q.shape[1])).masked_fill(mask, float("-inf"))
        heads.append(s.softmax(-1) @ v)
    mho = torch.cat(heads, -1) @ t(w["W_O"]).T
    ffn = F.gelu(mho @ t(w["W1"]).T + t(w["b1"]), approximate="tanh") @ t(w["W2"]).T + t(w["b2"])
    res = mho + ffn
    ln = F.layer_norm(res, (c.d_model,), t(w["gamma"]), t(w["beta"]), c.epsilon)
    diff = lambda a, b: (a - t(b)).abs().max().item()  # noqa: E731
    return {"multi_head_output": diff(mho, run.multi_head_output), "ffn_output": diff(ffn, run.ffn_output),
            "residual": diff(res, run.residual), "layer_norm_output": diff(ln, run.layer_norm_output)}


def trace_position(run: Seed001Run, position: int) -> list[str]:
    """Seed 001's detailed calculation for one position, as lines of text."""
    c = run.config
    if not 0 <= position < len(run.residual):
        raise ValueError(f"position must be in [0, {len(run.residual) - 1}], got {position}")
    fmt = lambda v: "[" + ", ".join(f"{x:7.4f}" for x in v) + "]"  # noqa: E731
    x, s = run.residual[position], run.stats[position]
    name = TOKEN_NAMES[c.tokens[position]]
    lines = [f"Detailed calculation for position {position} ({name})", "=" * 60, "",
             f"Attention output: {fmt(run.multi_head_output[position])}",
             f"FFN output:       {fmt(run.ffn_output[position])}",
             f"Residual (sum):   {fmt(x)}", "",
             f"Mean: {s.mean:.6f}", f"Variance: {s.variance:.6f}", f"Std (with epsilon): {s.std:.6f}", "",
             "Normalization examples:"]
    for i in range(3):
        lines.append(f"  x[{i}] = ({x[i]:.4f} - {s.mean:.4f}) / {s.std:.4f} = {(x[i] - s.mean) / s.std:.4f}")
    lines += ["", f"Layer norm output: {fmt(run.layer_norm_output[position])}"]
    m, v = pp.row_mean_variance(run.layer_norm_output[position])
    lines.append(f"Check: mean = {m:.6f}, variance = {v:.6f}")
    return lines
