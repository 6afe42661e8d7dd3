"""Swap the norms of any model for addnorm's: every ``torch.nn.LayerNorm`` and ``torch.nn.RMSNorm`` becomes
``addnorm.nn.LayerNorm`` / ``addnorm.nn.RMSNorm`` with the same shape, eps and -- the same objects -- parameters.

For a model that is not a HuggingFace decoder (``addnorm.interop.patch_hf_model`` needs its decoder layers to
fuse the residual adds): a CNN's head, an encoder, a hand-written transformer. The state_dict keys, an optimizer
already holding the parameters and any tying stay as they were, since the parameters are not copied. Only those
exact classes are swapped: a subclass may have changed the forward, and a GroupNorm or BatchNorm is another norm.
Hooks registered on a replaced module are not carried over.
"""

from __future__ import annotations

from torch import nn

from .layer_norm import LayerNorm
from .rms_norm import RMSNorm


def _replacement(m: nn.Module, backend: str | None) -> nn.Module | None:
    if type(m) is nn.LayerNorm:
        new = LayerNorm(m.normalized_shape, m.eps, m.elementwise_affine, bias=m.bias is not None, device="meta",
                        backend=backend)
        new.weight, new.bias = m.weight, m.bias  # the very Parameters (None where the original has none)
    elif type(m) is nn.RMSNorm:
        new = RMSNorm(m.normalized_shape, m.eps, m.elementwise_affine, device="meta", backend=backend)
        new.weight = m.weight
    else:
        return None
    return new.train(m.training)


def replace_norms(model: nn.Module, *, backend: str | None = None) -> nn.Module:
    """Replace every ``torch.nn.LayerNorm`` / ``torch.nn.RMSNorm`` in ``model`` by addnorm's, in place, keeping
    their parameters; returns the model (the replacement itself when ``model`` is such a norm). A norm shared by
    several parents stays shared. ``backend`` pins the new modules' backend (default: ``addnorm.use_backend``'s).

        model = addnorm.nn.replace_norms(model)
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    done: dict[int, nn.Module] = {}

    def visit(parent: nn.Module) -> None:
        for name, child in list(parent.named_children()):
            if id(child) not in done:
                done[id(child)] = _replacement(child, backend) or child
                if done[id(child)] is child:
                    visit(child)
            if done[id(child)] is not child:
                setattr(parent, name, done[id(child)])

    root = _replacement(model, backend)
    if root is not None:
        return root
    visit(model)
    return model
