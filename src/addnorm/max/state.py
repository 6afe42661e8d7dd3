"""Load norm weights into the MAX modules from addnorm / torch / HuggingFace GPT-2 state_dicts."""

from __future__ import annotations

from .convert import to_max
from .modules import LayerNorm


def load_norm_weights(module, state_dict, prefix: str = "") -> None:
    """Copy ``{prefix}weight`` (and ``{prefix}bias``, if the module has one) into a MAX norm module."""
    state = {}
    for name in ("weight", "bias"):
        key = prefix + name
        if hasattr(module, name):
            if key not in state_dict:
                raise KeyError(f"{key!r} is not in the state_dict; keys include {sorted(state_dict)[:6]}")
            t = state_dict[key]
            state[name] = to_max(t.detach().float().contiguous() if hasattr(t, "detach") else t)
    module.load_state_dict(state)


def layer_norm_from_state_dict(state_dict, prefix: str, eps: float = 1e-5) -> LayerNorm:
    """A MAX LayerNorm with the weights at ``prefix`` -- e.g. ``"transformer.h.0.ln_1."`` of a HuggingFace
    GPT-2 checkpoint, or ``"h.0.attn.norm_before."`` of an addnorm GPT."""
    w = state_dict[prefix + "weight"]
    ln = LayerNorm(int(w.shape[0]), eps=eps)
    load_norm_weights(ln, state_dict, prefix)
    return ln
