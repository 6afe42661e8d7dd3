"""torch tensors / NumPy arrays <-> MAX tensors, through DLPack: no copy where the memory allows."""

from __future__ import annotations

import numpy as np
from max.experimental.tensor import Tensor


def to_max(a) -> Tensor:
    """A MAX Tensor sharing memory with a contiguous CPU torch tensor or NumPy array (copied only when the
    layout cannot be shared: non-contiguous, or a NumPy array that does not own aligned memory)."""
    if isinstance(a, Tensor):
        return a
    if hasattr(a, "detach"):  # torch
        t = a.detach()
        if not t.is_contiguous():
            t = t.contiguous()
        return Tensor.from_dlpack(t)
    arr = np.ascontiguousarray(a)
    return Tensor.from_dlpack(arr)


def to_numpy(t: Tensor) -> np.ndarray:
    return t.to_numpy()


def to_torch(t: Tensor):
    """A torch tensor sharing the MAX tensor's memory (CPU)."""
    import torch

    return torch.from_dlpack(t)
