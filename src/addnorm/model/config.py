"""The model configuration: one frozen dataclass, validated on construction."""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

from ..nn.factory import NORM_KINDS, POINTWISE_KINDS
from .placement import Placement, PlacementSpec, resolve_placements

ACTIVATIONS = ("gelu_tanh", "gelu", "relu")
DEFAULT_STREAMS = 4  # n_streams of a widened placement when not given (HC, mHC and DeepSeek V4 use 4)
DYT_ALPHA = 0.5  # DyT's default alpha0 (Zhu et al. 2025); their LLaMA 7B uses (0.8, 0.2, 0.2)
MHC_LITE_MAX_STREAMS = 6  # n! permutation matrices: 720 at n = 6, 40320 at n = 8


class ConfigError(ValueError):
    """A bad GPTConfig field; the message starts with the field's name."""


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

    def __post_init__(self):
        for name in ("vocab_size", "block_size", "n_layer", "n_head", "n_embd", "d_ff"):
            v = getattr(self, name)
            if (v is not None or name != "d_ff") and (isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 1):
                raise ConfigError(f"{name} must be an integer >= 1, got {v!r}")
        if isinstance(self.eps, bool) or not isinstance(self.eps, int | float) or not math.isfinite(self.eps):
            raise ConfigError(f"eps must be a finite number, got {self.eps!r}")
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd={self.n_embd} must be divisible by n_head={self.n_head}")
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {ACTIVATIONS}, got {self.activation!r}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")
        if isinstance(self.placement, list):  # keep the config hashable and frozen
            object.__setattr__(self, "placement", tuple(self.placement))
        if isinstance(self.dyt_alpha, list):
            object.__setattr__(self, "dyt_alpha", tuple(self.dyt_alpha))
        ngpt = _is_ngpt(self.placement)
        if ngpt and self.norm is not None:
            raise ConfigError(f"norm: nGPT normalizes by the L2 norm on the sphere and takes no norm kind, "
                              f"got norm={self.norm!r}")
        if self.norm is None and not ngpt:
            object.__setattr__(self, "norm", "layer")
        if self.norm is not None and self.norm not in NORM_KINDS:
            raise ConfigError(f"norm kind must be one of {NORM_KINDS}, got {self.norm!r}")
        placements = self.placements()  # validates names and the norm kind
        self._check_frontier(placements)

    def _check_frontier(self, placements: list[Placement]) -> None:
        for p in placements:  # a sub-layer without a connection on a widened stream would run once per copy
            if p.for_mlp().stream != p.stream:
                raise ConfigError(f"placement: the FFN's placement must use the attention's residual stream, "
                                  f"got {p.stream!r} for attention and {p.for_mlp().stream!r} for the FFN "
                                  f"(placement {p.name!r})")
        streams = {p.stream for p in placements}
        if len(streams) > 1:
            raise ConfigError(f"placement: every layer must use the same residual stream, got {sorted(streams)}")
        stream = streams.pop()
        n = self.n_streams
        if n is not None:
            if isinstance(n, bool) or not isinstance(n, int):
                raise ConfigError(f"n_streams must be an integer, got {n!r} ({type(n).__name__})")
            if n < 1:
                raise ConfigError(f"n_streams must be >= 1, got {n}")
            if n > 1 and stream == "single":
                raise ConfigError(f"n_streams={n} needs a widened-stream placement (hc, mhc, mhc_lite); "
                                  f"placement {_spec_name(self.placement)} has one stream")
            if stream == "mhc_lite" and n > MHC_LITE_MAX_STREAMS:
                raise ConfigError(f"n_streams={n} is too wide for mhc_lite: it mixes all n! = {math.factorial(n)} "
                                  f"permutation matrices; use n_streams <= {MHC_LITE_MAX_STREAMS} or placement='mhc'")
        it = self.sinkhorn_iters
        if isinstance(it, bool) or not isinstance(it, int) or it < 1:
            raise ConfigError(f"sinkhorn_iters must be an integer >= 1, got {it!r}")
        if not isinstance(self.value_residual, bool):
            raise ConfigError(f"value_residual must be True or False, got {self.value_residual!r}")
        a = self.dyt_alpha
        alphas = a if isinstance(a, tuple) else (a,)
        if isinstance(a, tuple) and len(a) != 3:
            raise ConfigError(f"dyt_alpha must be one number or (attention, FFN, final), got {len(a)} values")
        if any(isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) for v in alphas):
            raise ConfigError(f"dyt_alpha must be finite numbers, got {a!r}")
        for name in ("dense_dilation", "dense_period"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(f"{name} must be an integer >= 1, got {v!r}")
        normalized = [q.residual == "normalized" for p in placements for q in (p, p.for_mlp())]
        if any(normalized) and not all(normalized):
            raise ConfigError("placement: 'ngpt' cannot be mixed with other placements in one model")
        if all(normalized):  # nGPT's blocks read none of these: refuse rather than ignore them
            for p in placements:
                for q in (p, p.for_mlp()):
                    for field in ("before", "after_branch", "after_sum"):
                        if getattr(q, field) is not None:
                            raise ConfigError(f"placement: nGPT (residual='normalized') normalizes by the L2 norm "
                                              f"and takes no norm slot, got {field}={getattr(q, field)!r} in "
                                              f"placement {q.name!r}")
                    for field in ("dense", "depth_scaled", "qkv_norm"):
                        if getattr(q, field):
                            raise ConfigError(f"placement: nGPT (residual='normalized') takes no {field}, "
                                              f"got {field}=True in placement {q.name!r}")
        dense = {p.dense for p in placements}
        if len(dense) > 1:  # GPT puts the DWAs after every block or none
            raise ConfigError(f"placement: every layer must agree on dense (DenseFormer's depth-weighted averages "
                              f"follow every block or none), got dense={[p.dense for p in placements]}")
        if not dense.pop():
            for name in ("dense_dilation", "dense_period"):
                if getattr(self, name) != 1:
                    raise ConfigError(f"{name}={getattr(self, name)} needs a DenseFormer placement (dense=True); "
                                      f"placement {_spec_name(self.placement)} has none")
        if any(v != DYT_ALPHA for v in alphas) and not self._has_pointwise_norm(placements):
            raise ConfigError(f"dyt_alpha={a!r} sets the alpha of DyT/Derf norms, and this model has none "
                              f"(norm={self.norm!r}, placement {_spec_name(self.placement)})")

    def _has_pointwise_norm(self, placements: list[Placement]) -> bool:
        """Does any norm of the model take dyt_alpha: the norm kind DyT or Derf (default slots, the final
        norm, HybridNorm's QKV norms), or a DyT/Derf kind in a placement's own slot?"""
        if self.norm in POINTWISE_KINDS:
            return True
        return any(getattr(q, s) in POINTWISE_KINDS for p in placements for q in (p, p.for_mlp())
                   for s in ("before", "after_branch", "after_sum"))

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


def _spec_name(spec: PlacementSpec) -> str:
    """The placement as the user gave it, for messages: 'mix', 'hybrid_star', or each layer's name."""
    if isinstance(spec, str):
        return repr(spec)
    if isinstance(spec, Placement):
        return repr(spec.name)
    return repr([p if isinstance(p, str) else p.name for p in spec])


def _is_ngpt(spec: PlacementSpec) -> bool:
    names = [spec] if isinstance(spec, str | Placement) else list(spec)
    return any((p == "ngpt") if isinstance(p, str) else p.residual == "normalized" for p in names)
