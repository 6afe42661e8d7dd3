"""GPT: token + position embeddings, a stack of TransformerBlocks, a final norm, a tied LM head.

The placement decides what flows between the blocks: one (B, T, C) stream (with a pending branch
output fused into the next norm), a widened (B, T, n, C) stream (hc, mhc, mhc_lite: n copies of the
embedding in, reduced to one before the final norm), or, for DenseFormer, every block output so far
with a depth-weighted average after each block. nGPT has its own blocks (``model/ngpt.py``).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ..nn.factory import make_norm
from .placement import deepnorm_constants, final_norm_needed
from .block import TransformerBlock
from .config import GPTConfig
from .denseformer import DepthWeightedAverage
from .ngpt import NormalizedBlock, Scale, normalize_ngpt_
from .streams import reduce_streams


class GPT(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.config = c = config
        placements = c.placements()
        self.ngpt = placements[0].residual == "normalized"
        self.wte = nn.Embedding(c.vocab_size, c.n_embd)
        self.wpe = None if self.ngpt else nn.Embedding(c.block_size, c.n_embd)  # nGPT: RoPE instead
        self.drop = nn.Dropout(c.dropout)
        Block = NormalizedBlock if self.ngpt else TransformerBlock
        self.h = nn.ModuleList(Block(c, i, p) for i, p in enumerate(placements))
        self.stream = placements[0].stream
        self.n_streams = c.streams
        self.dwa = None
        if placements[0].dense:  # a DWA after every dense_period-th block (None elsewhere)
            self.dwa = nn.ModuleList(DepthWeightedAverage(i + 1, c.dense_dilation) if (i + 1) % c.dense_period == 0
                                     else nn.Identity() for i in range(c.n_layer))
        final_alpha = c.slot_alpha("final") if c.norm in ("dyt", "derf") else None
        self.ln_f = (make_norm(c.norm, c.n_embd, c.eps, bias=c.bias, backend=c.backend, alpha=final_alpha)
                     if final_norm_needed(placements) else None)
        self.lm_head = nn.Linear(c.n_embd, c.vocab_size, bias=False)
        # nGPT: a separate output embedding E_out (on the sphere) and the logit scale s_z
        self.s_z = Scale(c.vocab_size, 1.0, 1.0 / math.sqrt(c.n_embd)) if self.ngpt else None
        if c.tie_weights and not self.ngpt:
            self.lm_head.weight = self.wte.weight
        self._init_gpt2()  # the sub-modules initialized themselves as they were built

    def reset_parameters(self) -> None:
        """Every parameter and buffer initialized afresh: each sub-module's own ``reset_parameters`` (norms,
        stream connections, gates, DenseFormer's weights, mHC-lite's permutations), then GPT-2's init over
        them. What a model built on the meta device needs after ``to_empty()``, when no checkpoint follows."""
        for m in self.modules():
            if m is not self and callable(getattr(m, "reset_parameters", None)):
                m.reset_parameters()
        self._init_gpt2()

    def _init_gpt2(self) -> None:
        """GPT-2's init: N(0, 0.02) everywhere, N(0, 0.02/√(2·n_layer)) for the projections that write
        into the residual stream; DeepNorm layers get DeepNet's Xavier init with gain β instead, and LNS
        layers plain N(0, 0.02) (LNS's 1/√l takes the scaled init's place, as its paper says)."""
        c = self.config
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, 0.0, 0.02)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, nn.Embedding):
                nn.init.normal_(m.weight, 0.0, 0.02)
        if self.ngpt:  # nGPT: N(0, 1/sqrt(d)), then every embedding-dimension vector put on the sphere
            for m in self.modules():
                if isinstance(m, nn.Linear | nn.Embedding):
                    nn.init.normal_(m.weight, 0.0, 1.0 / math.sqrt(c.n_embd))
            self.normalize_()
            return
        _, beta = deepnorm_constants(c.n_layer)
        for block in self.h:
            if block.placement.residual == "scaled":
                a, f = block.attn.fn, block.mlp.fn
                q, k, v = a.c_attn.weight.data.chunk(3, dim=0)
                nn.init.xavier_normal_(q, gain=1.0)
                nn.init.xavier_normal_(k, gain=1.0)
                nn.init.xavier_normal_(v, gain=beta)
                for w in (a.c_proj.weight, f.c_fc.weight, f.c_proj.weight):
                    nn.init.xavier_normal_(w, gain=beta)
            elif not block.placement.depth_scaled:  # LNS's authors: its 1/sqrt(l) replaces this scaled init
                for w in (block.attn.fn.c_proj.weight, block.mlp.fn.c_proj.weight):
                    nn.init.normal_(w, 0.0, 0.02 / math.sqrt(2 * c.n_layer))

    def hidden_states(self, idx: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """(B, T) token ids -> (B, T, n_embd), after the final norm (if the placement has one)."""
        B, T = idx.shape
        if T > self.config.block_size:
            raise ValueError(f"sequence length {T} exceeds block_size={self.config.block_size}")
        if self.ngpt:
            x = self.drop(self.wte(idx))  # on the sphere: wte's rows are unit vectors
        else:
            x = self.drop(self.wte(idx) + self.wpe(torch.arange(T, device=idx.device)))  # (B, T, C)
        values = {} if self.config.value_residual else None  # the first layer's attention values
        if self.stream != "single":
            x = x.unsqueeze(-2).expand(B, T, self.n_streams, x.size(-1))  # (B, T, n, C): n copies
        outputs = [x] if self.dwa is not None else None  # DenseFormer: X_0 (the embedding), X_1, ...
        pending = None
        for i, block in enumerate(self.h):
            x, pending = block(x, attention_mask, pending=pending, stream=True, values=values)
            if outputs is not None:
                x, pending = (x if pending is None else x + pending), None
                outputs.append(x)
                if isinstance(self.dwa[i], DepthWeightedAverage):
                    x = self.dwa[i](outputs)
        if self.stream != "single":
            x = reduce_streams(x if pending is None else x + pending, self.stream)  # (B, T, C)
            pending = None
        if self.ln_f is not None:
            x, _ = self.ln_f(pending, x) if pending is not None else self.ln_f(x)
        elif pending is not None:
            x = x + pending
        return x

    def forward(self, idx, targets=None, attention_mask=None):
        """Returns logits (B, T, vocab), or (logits, loss) when targets are given."""
        logits = self.lm_head(self.hidden_states(idx, attention_mask))
        if self.s_z is not None:
            logits = logits * self.s_z()
        if targets is None:
            return logits
        loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1), ignore_index=-100)
        return logits, loss

    @torch.no_grad()
    def generate(self, idx: torch.Tensor, max_new_tokens: int, greedy: bool = True, temperature: float = 1.0,
                 generator: torch.Generator | None = None) -> torch.Tensor:
        """Append max_new_tokens tokens (greedy argmax, or sampling at ``temperature``)."""
        for _ in range(max_new_tokens):
            ctx = idx[:, -self.config.block_size:]
            logits = self(ctx)[:, -1, :]
            if greedy:
                nxt = logits.argmax(-1, keepdim=True)
            else:
                nxt = torch.multinomial(F.softmax(logits / temperature, -1), 1, generator=generator)
            idx = torch.cat([idx, nxt], dim=1)
        return idx

    def num_parameters(self, exclude_embeddings: bool = False) -> int:
        n = sum(p.numel() for p in self.parameters())
        if exclude_embeddings and self.wpe is not None:
            n -= self.wpe.weight.numel()
        return n

    @torch.no_grad()
    def normalize_(self) -> GPT:
        """nGPT: put the weights back on the unit sphere. Call it after every ``optimizer.step()``; without
        it an nGPT model drifts off the sphere and is no longer the model of the paper. Nothing happens for
        any other placement, so a training loop may call it for every model."""
        if self.ngpt:
            normalize_ngpt_(self)
        return self
