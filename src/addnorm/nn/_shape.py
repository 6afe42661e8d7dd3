from __future__ import annotations

import numbers
from collections.abc import Sequence

import torch

from ..functional.core import as_dim


def as_normalized_shape(normalized_shape) -> tuple[int, ...]:
    """int or sequence of ints -> tuple of ints, as torch.nn.LayerNorm accepts it: each element an int (or what
    torch takes as one: a numpy int, a 0-dim integer tensor), never a float, a bool or a string -- 64.7 is not
    truncated to 64 -- and none negative."""
    if isinstance(normalized_shape, numbers.Integral | torch.Tensor) and not isinstance(normalized_shape, bool):
        shape = (as_dim(normalized_shape),)
    elif isinstance(normalized_shape, torch.Size | Sequence) and not isinstance(normalized_shape, str | bytes):
        shape = tuple(as_dim(s) for s in normalized_shape)
    else:
        raise TypeError(f"normalized_shape must be an int or a tuple of ints, got {normalized_shape!r}")
    if any(s < 0 for s in shape):
        raise ValueError(f"normalized_shape must be non-negative, got {shape}")
    return shape
