"""GPT: token + position embeddings, a stack of blocks, a final norm, a tied LM head.

What flows between the blocks is the residual stream's regime (``model/regimes/``), chosen by the placement:
one (B, T, C) stream with a pending branch output fused into the next norm; a widened (B, T, n, C) stream
(hc, mhc, mhc_lite); DenseFormer's depth-weighted averages over the block outputs; nGPT's stream on the
unit sphere; or Attention Residuals' earlier outputs, which each sub-layer reads through a softmax over depth.
The forward pass is the same loop for all of them.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..nn.factory import POINTWISE_KINDS, make_norm
from ..nn.scalars import ScalarParameters, as_scalar, scalar_parameter
from .config import GPTConfig
from .gpt2_init import gpt2_init_
from .placement import final_norm_needed
from .regimes import regime_for
from .value_residual import FirstValues


class GPT(ScalarParameters):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.config = c = config
        self.regime = r = regime_for(c)  # a strategy, no module: its parts are registered below by their names
        placements = r.placements
        # the modules in the order checkpoints (state_dict keys, parameter order) have always had them
        self.wte = nn.Embedding(c.vocab_size, c.n_embd)
        self.embed_scale = None if c.embed_scale is None else scalar_parameter(c.embed_scale)
        self.wpe = r.position_embedding()  # None where attention rotates q and k itself (nGPT's RoPE)
        self.drop = nn.Dropout(c.dropout)
        self.h = nn.ModuleList(r.block(i, p) for i, p in enumerate(placements))
        self.dwa = r.between_blocks()  # DenseFormer's depth-weighted averages; None for every other regime
        self.attn_res = r.after_blocks()  # Attention Residuals' final aggregation; None for every other regime
        final_alpha = c.slot_alpha("final") if c.norm in POINTWISE_KINDS else None
        self.ln_f = (make_norm(c.norm, c.n_embd, c.eps, bias=c.bias, backend=c.backend, alpha=final_alpha)
                     if final_norm_needed(placements) else None)
        self.lm_head = nn.Linear(c.n_embd, c.vocab_size, bias=False)
        self.s_z = r.logit_scale()  # nGPT's logit scale; None for every other regime
        if r.ties_output_embedding():
            self.lm_head.weight = self.wte.weight
        self._init_weights()  # the sub-modules initialized themselves as they were built

    def reset_parameters(self) -> None:
        """Every parameter and buffer initialized afresh: each sub-module's own ``reset_parameters`` (norms,
        stream connections, gates, DenseFormer's weights, mHC-lite's permutations), then GPT-2's init over
        them. What a model built on the meta device needs after ``to_empty()``, when no checkpoint follows."""
        for m in self.modules():
            if m is not self and callable(getattr(m, "reset_parameters", None)):
                m.reset_parameters()
        self._init_weights()

    def _init_weights(self) -> None:
        """GPT-2's N(0, 0.02) everywhere, then the regime's own init over it (GPT-2's residual-scaled
        projections, DeepNorm's and LNS's variants of them, or nGPT's sphere); the embedding scale at its
        option's value."""
        gpt2_init_(self)
        self.regime.init_weights_(self)
        if self.embed_scale is not None:
            with torch.no_grad():
                self.embed_scale.fill_(float(self.config.embed_scale))

    def embed(self, idx: torch.Tensor) -> torch.Tensor:
        """(B, T) token ids -> (B, T, C): the token embedding (times the learned ``embed_scale``, where the
        config has one), plus the learned positions (where the regime has them), dropout applied."""
        x = self.wte(idx)
        if self.embed_scale is not None:
            x = as_scalar(self.embed_scale) * x  # 0-d: x's dtype kept, as with a number
        if self.wpe is not None:
            x = x + self.wpe(torch.arange(idx.size(1), device=idx.device))
        return self.drop(x)

    def hidden_states(self, idx: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """(B, T) token ids -> (B, T, n_embd), after the final norm (if the placement has one)."""
        self._check_ids(idx)
        x, memory = self.regime.enter(self.embed(idx))  # the stream the first block reads
        pending = None  # a branch output the next norm adds in its fused pass
        values = FirstValues() if self.config.value_residual else None  # the first layer's attention values
        for i, block in enumerate(self.h):
            x, pending = block(x, attention_mask, pending=pending, stream=True, values=values)
            x, pending = self.regime.after_block(i, x, pending, memory)
        x, pending = self.regime.leave(x, pending)  # (B, T, C)
        if self.ln_f is not None:
            x, _ = self.ln_f(pending, x) if pending is not None else self.ln_f(x)
        elif pending is not None:
            x = x + pending
        return x

    def forward(self, idx, targets=None, attention_mask=None):
        """Returns logits (B, T, vocab), or (logits, loss) when targets are given."""
        logits = self.regime.logits(self.lm_head(self.hidden_states(idx, attention_mask)))
        if targets is None:
            return logits
        loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1), ignore_index=-100)
        return logits, loss

    def _check_ids(self, idx) -> None:
        """A clear error for what would otherwise fail deep inside (a 1-D input: 'not enough values to
        unpack'; an id out of range: 'index out of range in self' on CPU, a device-side assert on CUDA)."""
        c = self.config
        if not isinstance(idx, torch.Tensor) or idx.dim() != 2:
            shape = tuple(idx.shape) if isinstance(idx, torch.Tensor) else type(idx).__name__
            raise ValueError(f"idx must be a (B, T) tensor of token ids, got {shape}; "
                             f"one sequence of length T is idx[None]")
        if idx.dtype.is_floating_point or idx.dtype.is_complex or idx.dtype == torch.bool:
            raise TypeError(f"idx must hold integer token ids, got dtype {idx.dtype}")
        if idx.size(1) > c.block_size:
            raise ValueError(f"sequence length {idx.size(1)} exceeds block_size={c.block_size}")
        if idx.numel() and not (torch.compiler.is_compiling() or torch.jit.is_tracing()):  # a value check syncs:
            lo, hi = idx.min().item(), idx.max().item()                                 # eager calls only
            if lo < 0 or hi >= c.vocab_size:
                raise ValueError(f"idx holds token ids in [{lo}, {hi}], outside [0, vocab_size={c.vocab_size})")

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
        self.regime.normalize_(self)
        return self
