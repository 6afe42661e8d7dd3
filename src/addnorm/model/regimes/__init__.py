"""The residual stream's model-wide regimes (``base.py`` says what a regime is): which one a model gets, and
the validation of every GPTConfig field that only a regime reads."""

from __future__ import annotations

from ..errors import ConfigError, refuse_unless_default, spec_name
from ..placement import Placement
from .attn_res import AttnResStream
from .base import DEFAULT_SINKHORN_ITERS, Regime, SingleStream
from .dense import DenseFormer
from .normalized import NormalizedStream
from .widened import MHC_LITE_MAX_STREAMS, WidenedStream

__all__ = ["Regime", "SingleStream", "WidenedStream", "DenseFormer", "NormalizedStream", "AttnResStream",
           "MHC_LITE_MAX_STREAMS",
           "regime_for", "validate", "default_norm"]


def default_norm(placements: list[Placement]) -> str | None:
    """The norm kind of a config that names none: LayerNorm, or none at all for nGPT."""
    return None if any(q.residual == "normalized" for p in placements for q in (p, p.for_mlp())) else "layer"


def validate(config, placements: list[Placement]) -> None:
    """Every layer agrees on one regime; it validates its options, and the options of the others are refused
    (nothing would read them)."""
    _check_layers_agree(config, placements)
    chosen = _chosen(placements)
    for cls in (SingleStream, WidenedStream, DenseFormer, NormalizedStream, AttnResStream):
        if cls in chosen:
            cls.validate(config, placements)
    if WidenedStream not in chosen:
        n = config.n_streams
        if n is not None and (isinstance(n, bool) or n != 1):
            raise ConfigError(f"n_streams={n!r} needs a widened-stream placement (hc, mhc, mhc_lite); "
                              f"placement {spec_name(config.placement)} has one stream")
        refuse_unless_default(config, "sinkhorn_iters", DEFAULT_SINKHORN_ITERS, "the mhc placement")
    if AttnResStream not in chosen and config.attn_res_block is not None:
        raise ConfigError(f"attn_res_block={config.attn_res_block!r} sets Block AttnRes's block size and needs the "
                          f"attn_res placement; placement {spec_name(config.placement)} does not read it")
    if DenseFormer not in chosen:
        for name in ("dense_dilation", "dense_period"):
            if getattr(config, name) != 1:
                raise ConfigError(f"{name}={getattr(config, name)!r} needs a DenseFormer placement (dense=True); "
                                  f"placement {spec_name(config.placement)} has none")


def regime_for(config) -> Regime:
    """The regime of a (validated) config."""
    placements = config.placements()
    chosen = _chosen(placements)
    if NormalizedStream in chosen:
        return NormalizedStream(config, placements)
    if AttnResStream in chosen:
        return AttnResStream(config, placements)
    stream = (WidenedStream if WidenedStream in chosen else SingleStream)(config, placements)
    return DenseFormer(config, placements, stream) if DenseFormer in chosen else stream


def _chosen(placements: list[Placement]) -> tuple[type[Regime], ...]:
    first = placements[0]
    if first.residual == "normalized":
        return (NormalizedStream,)
    if first.attn_res:
        return (AttnResStream,)
    stream = WidenedStream if first.widened else SingleStream
    return (stream, DenseFormer) if first.dense else (stream,)


def _check_layers_agree(config, placements: list[Placement]) -> None:
    """One regime for the whole model: every sub-layer on the same stream, DWAs after every block or none,
    nGPT everywhere or nowhere, Attention Residuals everywhere or nowhere."""
    for p in placements:  # a sub-layer without a connection on a widened stream would run once per copy
        if p.for_mlp().stream != p.stream:
            raise ConfigError(f"placement: the FFN's placement must use the attention's residual stream, "
                              f"got {p.stream!r} for attention and {p.for_mlp().stream!r} for the FFN "
                              f"(placement {p.name!r})")
    streams = {p.stream for p in placements}
    if len(streams) > 1:
        raise ConfigError(f"placement: every layer must use the same residual stream, got {sorted(streams)}")
    normalized = [q.residual == "normalized" for p in placements for q in (p, p.for_mlp())]
    if any(normalized) and not all(normalized):
        raise ConfigError("placement: 'ngpt' cannot be mixed with other placements in one model")
    attn_res = [q.attn_res for p in placements for q in (p, p.for_mlp())]
    if any(attn_res) and not all(attn_res):
        raise ConfigError("placement: 'attn_res' (Attention Residuals) cannot be mixed with other placements in one "
                          "model: every sub-layer reads its input over depth, or none does")
    dense = {p.dense for p in placements}
    if len(dense) > 1:
        raise ConfigError(f"placement: every layer must agree on dense (DenseFormer's depth-weighted averages "
                          f"follow every block or none), got dense={[p.dense for p in placements]}")
