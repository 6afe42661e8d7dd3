"""Learned scalars kept as one-element vectors, shape (1,).

DyT's and Derf's reference code keep ``alpha`` (and Derf's shift) that way, and FSDP2 requires it:
``fully_shard`` refuses a 0-d parameter ("doesn't support scalar parameters"), so one such scalar anywhere in a
block kept a model from being sharded.

A (1,) tensor broadcasts as a 0-d one does, but type promotion tells them apart: a float32 0-d tensor times a
bfloat16 tensor is bfloat16, as with a Python number, while a (1,) one makes it float32. Where a scalar multiplies an
activation in torch ops, ``as_scalar`` gives its 0-d view (which carries the gradient back), so the result's dtype
is what it was with a 0-d parameter.

Checkpoints that hold a scalar as 0-d (addnorm's own before this change, and code that uses ``torch.tensor(v)``)
still load: ``ScalarParameters`` reshapes such an entry to (1,) as it is read, and ``fit_optimizer_state`` does the
same to an optimizer's per-element state (Adam's moments, SGD's momentum) after ``optimizer.load_state_dict``, which
checks no shapes and would otherwise fail at the next step.
"""

from __future__ import annotations

import torch
from torch import nn


def scalar_parameter(value: float | None = None, *, device=None, dtype=None) -> nn.Parameter:
    """A learned scalar of shape (1,), filled with ``value`` (left uninitialized where None)."""
    t = torch.empty(1, device=device, dtype=dtype)
    if value is not None:
        t.fill_(float(value))
    return nn.Parameter(t)


def as_scalar(p: torch.Tensor) -> torch.Tensor:
    """The 0-d view of a (1,) scalar: it promotes types as a Python number does (see above)."""
    return p.reshape(())


def fit_optimizer_state(optimizer: torch.optim.Optimizer) -> None:
    """After ``optimizer.load_state_dict`` of a checkpoint made when the (1,) scalars were 0-d: each 0-d state tensor
    of a (1,) parameter other than its step count reshaped to (1,), in place in the optimizer's state."""
    for group in optimizer.param_groups:
        for p in group["params"]:
            state = optimizer.state.get(p)
            if not state or p.shape != (1,):
                continue
            for key, t in state.items():
                if key != "step" and isinstance(t, torch.Tensor) and t.dim() == 0:
                    state[key] = t.reshape(1)


class ScalarParameters(nn.Module):
    """A module whose (1,) parameters load from a checkpoint that holds them 0-d."""

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        # state_dict is load_state_dict's own copy of the caller's mapping: replacing an entry leaves theirs as it is
        for name, p in self._parameters.items():
            t = state_dict.get(prefix + name)
            if p is not None and p.shape == (1,) and isinstance(t, torch.Tensor) and t.dim() == 0:
                state_dict[prefix + name] = t.reshape(1)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)
