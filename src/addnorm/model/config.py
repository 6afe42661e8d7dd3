"""The model configuration: one frozen dataclass, validated on construction."""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

from ..nn.factory import NORM_KINDS, POINTWISE_KINDS
from . import regimes
from .errors import ConfigError, spec_name
from .placement import Placement, PlacementSpec, final_norm_needed, parse_placement, resolve_placements

ACTIVATIONS = ("gelu_tanh", "gelu", "relu")
DEFAULT_STREAMS = 4  # n_streams of a widened placement when not given (HC, mHC and DeepSeek V4 use 4)
DYT_ALPHA = 0.5  # DyT's default alpha0 (Zhu et al. 2025); their LLaMA 7B uses (0.8, 0.2, 0.2)
ALPHA_SLOTS = ("attn", "mlp", "final")  # the entries of a dyt_alpha tuple


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
    norm: str | None = None  # the kind in every 'default' norm slot: layer | rms | dyt | derf | batch (None: layer;
    #                          nGPT takes none: it normalizes by the L2 norm)
    eps: float = 1e-5
    placement: PlacementSpec = "pre"  # a name, a Placement, or one per layer
    mix_post_layers: int | None = None  # for placement="mix": how many leading layers are post-norm
    tie_weights: bool = True  # LM head shares the token embedding (GPT-2)
    backend: str | None = None  # addnorm backend for the norms (None: addnorm.use_backend / auto)
    # --- the frontier forms
    n_streams: int | None = None  # width n of a widened stream (hc, mhc, mhc_lite); None = 4 there, 1 elsewhere
    sinkhorn_iters: int = 20  # mhc: Sinkhorn-Knopp iterations (the paper's t_max)
    value_residual: bool = False  # ResFormer: every layer's values mixed with layer 1's, with learned weights
    dyt_alpha: float | tuple[float, float, float] = DYT_ALPHA  # DyT/Derf alpha0: one, or (attention, FFN, final)
    dense_dilation: int = 1  # denseformer: block i averages the outputs j with (i - j) % dilation == 0
    dense_period: int = 1  # denseformer: a DWA after every dense_period-th block only
    embed_scale: float | None = None  # a learned scalar on the token embedding, starting at this value (the DyT
    #                                   paper's LLaMA code: sqrt(n_embd)); None: no scale
    attn_res_block: int | None = None  # attn_res: sub-layers per block (Block AttnRes's S; attention and MLP count
    #                                    one each); None = Full AttnRes (every earlier sub-layer output a source)

    def __post_init__(self):
        for name in ("vocab_size", "block_size", "n_layer", "n_head", "n_embd", "d_ff"):
            v = getattr(self, name)
            if (v is not None or name != "d_ff") and (isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 1):
                raise ConfigError(f"{name} must be an integer >= 1, got {v!r}")
        if not _positive_number(self.eps):
            raise ConfigError(f"eps must be a finite number > 0, got {self.eps!r}")
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd={self.n_embd} must be divisible by n_head={self.n_head}")
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {ACTIVATIONS}, got {self.activation!r}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")
        if self.embed_scale is not None and not _positive_number(self.embed_scale):
            raise ConfigError(f"embed_scale must be None or a finite number > 0, got {self.embed_scale!r}")
        object.__setattr__(self, "placement", _placement_spec(self.placement))
        if isinstance(self.dyt_alpha, list):
            object.__setattr__(self, "dyt_alpha", tuple(self.dyt_alpha))
        if self.norm is not None and self.norm not in NORM_KINDS:
            raise ConfigError(f"norm kind must be one of {NORM_KINDS}, got {self.norm!r}")
        self._check_mix_post_layers()
        placements = self.placements()  # validates the names
        if self.norm is None:
            object.__setattr__(self, "norm", regimes.default_norm(placements))
        regimes.validate(self, placements)  # the residual stream's regime and its own options
        if not isinstance(self.value_residual, bool):
            raise ConfigError(f"value_residual must be True or False, got {self.value_residual!r}")
        self._check_dyt_alpha(placements)

    def _check_mix_post_layers(self) -> None:
        k = self.mix_post_layers
        if k is None:
            return
        if self.placement != "mix":
            raise ConfigError(f"mix_post_layers={k!r} sets how many leading layers of placement 'mix' are post-norm; "
                              f"placement {spec_name(self.placement)} does not read it")
        if isinstance(k, bool) or not isinstance(k, numbers.Integral) or not 0 <= k <= self.n_layer:
            raise ConfigError(f"mix_post_layers must be an integer in [0, n_layer={self.n_layer}], got {k!r}")

    def _check_dyt_alpha(self, placements: list[Placement]) -> None:
        a = self.dyt_alpha
        alphas = a if isinstance(a, tuple) else (a,)
        if isinstance(a, tuple) and len(a) != 3:
            raise ConfigError(f"dyt_alpha must be one number or (attention, FFN, final), got {len(a)} values")
        if any(isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) for v in alphas):
            raise ConfigError(f"dyt_alpha must be finite numbers, got {a!r}")
        read = self._alpha_slots(placements)
        if any(v != DYT_ALPHA for v in alphas) and not read:
            raise ConfigError(f"dyt_alpha={a!r} sets the alpha of DyT/Derf norms, and this model has none "
                              f"(norm={self.norm!r}, placement {spec_name(self.placement)})")
        if isinstance(a, tuple):
            for slot, v in zip(ALPHA_SLOTS, a):
                if v != DYT_ALPHA and slot not in read:
                    raise ConfigError(f"dyt_alpha={a!r}: its {slot} entry sets the alpha of DyT/Derf norms in the "
                                      f"{slot} slot, and this model has none there (norm={self.norm!r}, "
                                      f"placement {spec_name(self.placement)}); leave it at {DYT_ALPHA}")

    def _alpha_slots(self, placements: list[Placement]) -> set[str]:
        """The entries of dyt_alpha that some DyT/Derf norm reads: 'attn' (attention's norm slots and
        HybridNorm's QKV norms), 'mlp' (the FFN's norm slots), 'final' (the final norm)."""
        slots = ("before", "after_branch", "after_sum")
        read = set()
        if any(getattr(p, s) in POINTWISE_KINDS for p in placements for s in slots) or \
                (self.norm in POINTWISE_KINDS and any(p.qkv_norm for p in placements)):
            read.add("attn")
        if any(getattr(p.for_mlp(), s) in POINTWISE_KINDS for p in placements for s in slots):
            read.add("mlp")
        if self.norm in POINTWISE_KINDS and final_norm_needed(placements):
            read.add("final")
        return read

    @property
    def ff_dim(self) -> int:
        return 4 * self.n_embd if self.d_ff is None else self.d_ff

    @property
    def streams(self) -> int:
        """The residual stream's width: n_streams, or its default for the placement."""
        if self.n_streams is not None:
            return self.n_streams
        return DEFAULT_STREAMS if self.placements()[0].widened else 1

    def slot_alpha(self, slot: str) -> float:
        """DyT/Derf alpha0 of a norm slot: 'attn', 'mlp' or 'final'."""
        a = self.dyt_alpha
        return float(a if not isinstance(a, tuple) else a[("attn", "mlp", "final").index(slot)])

    def placements(self) -> list[Placement]:
        return resolve_placements(self.placement, self.n_layer, "layer" if self.norm is None else self.norm,
                                  self.mix_post_layers)



def _positive_number(v) -> bool:
    return not isinstance(v, bool) and isinstance(v, numbers.Real) and math.isfinite(v) and v > 0


def _placement_spec(spec) -> PlacementSpec:
    """The placement as a name, a Placement, or a tuple of them (hashable and frozen); 'a+b+c' is the CLI's
    one placement per layer."""
    if isinstance(spec, str):
        try:
            return parse_placement(spec)
        except ValueError as e:
            raise ConfigError(str(e)) from None
    if isinstance(spec, Placement):
        return spec
    if isinstance(spec, list | tuple) and spec and all(isinstance(p, str | Placement) for p in spec):
        return tuple(spec)
    raise ConfigError(f"placement must be a placement name, a Placement, or a list of them (one per layer), "
                      f"got {spec!r}")
