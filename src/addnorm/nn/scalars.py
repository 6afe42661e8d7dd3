"""Learned scalars kept as one-element vectors, shape (1,).

DyT's and Derf's reference code keep ``alpha`` (and Derf's shift) that way, and FSDP2 requires it:
``fully_shard`` refuses a 0-d parameter ("doesn't support scalar parameters"), so one such scalar anywhere in a
block kept a model from being sharded. A (1,) scalar broadcasts as a 0-d one does and gives the same numbers.
Checkpoints that hold a scalar as 0-d (addnorm's own before this change, and code that uses ``torch.tensor(v)``)
still load: ``ScalarParameters`` reshapes such an entry to (1,) as it is read.
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


class ScalarParameters(nn.Module):
    """A module whose (1,) parameters load from a checkpoint that holds them 0-d."""

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        # state_dict is load_state_dict's own copy of the caller's mapping: replacing an entry leaves theirs as it is
        for name, p in self._parameters.items():
            t = state_dict.get(prefix + name)
            if p is not None and p.shape == (1,) and isinstance(t, torch.Tensor) and t.dim() == 0:
                state_dict[prefix + name] = t.reshape(1)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)
