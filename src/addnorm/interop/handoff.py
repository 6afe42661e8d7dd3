"""The hand-off: a decoder layer's last add, fused with the norms that read its result next.

HuggingFace's model loop is ``h = layer(h)`` for every layer, then ``norm(h)``; the norm that reads a
layer's output lives in the next layer (its input norm, or GPT-NeoX's two) or is the model's final norm.
``patch_hf_model`` finds those readers by running the model once (``Readers``); afterwards a layer's last
add computes its sum *and* the readers' outputs in one pass, returns the sum to the loop unchanged, and
leaves each normalized output with its reader (``give``). When the reader is called, it takes that output
only if it is called on that very tensor, unmodified, in the same grad mode and with its parameters
unchanged (``take``); otherwise it computes as usual. A hook that replaces the layer's output, an in-place
edit, a reader the loop skips: each falls back to the eager result, never to a stale one.

Under gradient checkpointing (a layer re-run in backward must record the same graph) and under
``torch.compile`` (which traces the eager form) nothing is handed off.
"""

from __future__ import annotations

import weakref

import torch
from torch import nn

# norm -> what was left for it; kept beside the module, not in it, so that a patched model pickles with an
# output still waiting (a weakref cannot be pickled)
_PENDING: "weakref.WeakKeyDictionary[nn.Module, tuple]" = weakref.WeakKeyDictionary()


def enabled(layer: nn.Module) -> bool:
    """Whether ``layer`` may hand off its sum now."""
    if torch.compiler.is_compiling() or torch.is_inference_mode_enabled():
        return False
    owner = layer.__dict__.get("_addnorm_layer", layer)  # a rewritten child (BLOOM's MLP): its decoder layer's
    return not (getattr(owner, "gradient_checkpointing", False) and owner.training)


def _versions(norm: nn.Module):
    # its children's too: a hyper-connection reader's norm and projections are child modules
    return tuple(p._version for p in norm.parameters())


def _same_memory(x: torch.Tensor, s: torch.Tensor) -> bool:
    """x is s, or a view of all of it with the same rows (OPT's ``.reshape(-1, C)``): a view autograd knows
    (``x._base is s``), never a ``.detach()`` or ``.data`` of it, which share the memory but not the graph."""
    return x is s or (x._base is s and x.requires_grad == s.requires_grad and x.dtype == s.dtype
                      and x.numel() == s.numel() and x.dim() > 0 and x.shape[-1] == s.shape[-1]
                      and x.is_contiguous() and s.is_contiguous() and x.data_ptr() == s.data_ptr())


def give(norm: nn.Module, s: torch.Tensor, y) -> None:
    """Leave ``y = norm(s)`` with ``norm`` for its next call on ``s`` (a hyper-connection: its read of ``s``)."""
    _PENDING[norm] = (weakref.ref(s), s._version, y, torch.is_grad_enabled(), _versions(norm))


def take(norm: nn.Module, x) -> torch.Tensor | None:
    """The output left for this call of ``norm`` on ``x``, or None; whatever was left is dropped either way."""
    pending = _PENDING.pop(norm, None)
    if pending is None or torch.compiler.is_compiling() or not isinstance(x, torch.Tensor) or x.is_inference():
        return None
    ref, version, y, grad, versions = pending
    s = ref()
    if (s is not None and _same_memory(x, s) and x._version == version and torch.is_grad_enabled() == grad
            and _versions(norm) == versions):
        if x.shape == s.shape:
            return y
        return y.reshape(x.shape) if isinstance(y, torch.Tensor) else None  # a read's outputs: only for s itself
    return None


def drop(norm: nn.Module) -> None:
    _PENDING.pop(norm, None)


def readers(layer: nn.Module, site: str) -> tuple:
    return layer.__dict__.get("_addnorm_readers", {}).get(site, ())


_RECORDER: list = []  # the Readers running now, if any


def record(layer: nn.Module, site: str, s) -> None:
    """A hand-off site's result, seen by the Readers of a probe run."""
    if _RECORDER and isinstance(s, torch.Tensor) and not s.is_inference():
        _RECORDER[-1].sums.append((layer, site, s))


class Readers:
    """Finds, in one run of the model, which patched norms read each hand-off site's result (the tensor
    itself, or a reshape of all of it): ``found[layer][site] = [norm, ...]``."""

    def __init__(self, norms):
        self.norms = list(norms)
        self.sums: list = []  # (layer, site, tensor), kept alive so that no storage is reused
        self.found: dict[nn.Module, dict[str, list[nn.Module]]] = {}
        self._hooks = []

    def __enter__(self):
        _RECORDER.append(self)
        for n in self.norms:
            self._hooks.append(n.register_forward_pre_hook(self._norm_in))
        return self

    def __exit__(self, *exc):
        _RECORDER.remove(self)
        for h in self._hooks:
            h.remove()
        self.sums.clear()

    def _norm_in(self, norm, args):
        if not args or not isinstance(args[0], torch.Tensor):
            return
        for layer, site, s in reversed(self.sums):
            if _same_memory(args[0], s):
                found = self.found.setdefault(layer, {}).setdefault(site, [])
                if norm not in found:
                    found.append(norm)
                return
