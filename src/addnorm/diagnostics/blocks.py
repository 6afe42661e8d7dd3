"""Find the blocks (the units the residual stream passes through) of a model."""

from __future__ import annotations

from torch import nn

# where well-known models keep their stack of blocks
_KNOWN = ("h", "transformer.h", "model.layers", "layers", "blocks", "encoder.layer", "decoder.layers")


def _get(model: nn.Module, dotted: str):
    obj = model
    for part in dotted.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj


def find_blocks(model: nn.Module) -> list[nn.Module]:
    """The model's transformer blocks, in order: a known attribute path (addnorm GPT's ``h``, HF GPT-2's
    ``transformer.h``, Llama's ``model.layers``, ...) or else the longest ModuleList whose entries all
    have the same type. Raises if there is none: pass ``blocks=`` to ``record`` then."""
    for path in _KNOWN:
        ml = _get(model, path)
        if isinstance(ml, nn.ModuleList) and len(ml) > 0:
            return list(ml)
    best: list[nn.Module] = []
    for m in model.modules():
        if isinstance(m, nn.ModuleList) and len(m) > len(best) and len({type(x) for x in m}) == 1:
            best = list(m)
    if not best:
        raise ValueError(f"could not find the blocks of {type(model).__name__}; pass blocks=[...] to record()")
    return best


def is_norm(m: nn.Module) -> bool:
    """Norm layers of any origin: torch's, addnorm's, HuggingFace's (by class name)."""
    from ..nn.dyt import DyT
    from ..nn.layer_norm import LayerNorm
    from ..nn.rms_norm import RMSNorm

    if isinstance(m, nn.LayerNorm | nn.RMSNorm | LayerNorm | RMSNorm | DyT):
        return True
    name = type(m).__name__
    return name.endswith(("RMSNorm", "LayerNorm")) and not isinstance(m, nn.ModuleList)
