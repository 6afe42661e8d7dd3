"""The model configuration: one frozen dataclass, validated on construction."""

from __future__ import annotations

from dataclasses import dataclass

from ..placement import Placement, PlacementSpec, resolve_placements

ACTIVATIONS = ("gelu_tanh", "gelu", "relu")


@dataclass(frozen=True)
class GPTConfig:
    vocab_size: int = 50257  # GPT-2's BPE vocabulary
    block_size: int = 1024  # maximum sequence length (learned position embeddings)
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    d_ff: int | None = None  # feed-forward width; None = 4 * n_embd
    dropout: float = 0.0
    bias: bool = True  # biases in Linear layers and norms, like GPT-2
    activation: str = "gelu_tanh"  # GPT-2's tanh-approximated GELU ("gelu_new" in HuggingFace)
    norm: str = "layer"  # the kind in every 'default' norm slot: layer | rms | dyt
    eps: float = 1e-5
    placement: PlacementSpec = "pre"  # a name, a Placement, or one per layer
    mix_post_layers: int | None = None  # for placement="mix": how many leading layers are post-norm
    tie_weights: bool = True  # LM head shares the token embedding (GPT-2)
    backend: str | None = None  # addnorm backend for the norms (None: addnorm.use_backend / auto)

    def __post_init__(self):
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd={self.n_embd} must be divisible by n_head={self.n_head}")
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {ACTIVATIONS}, got {self.activation!r}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")
        if isinstance(self.placement, list):  # keep the config hashable and frozen
            object.__setattr__(self, "placement", tuple(self.placement))
        self.placements()  # validates names and the norm kind

    @property
    def ff_dim(self) -> int:
        return 4 * self.n_embd if self.d_ff is None else self.d_ff

    def placements(self) -> list[Placement]:
        return resolve_placements(self.placement, self.n_layer, self.norm, self.mix_post_layers)
