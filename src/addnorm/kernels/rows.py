"""The row view every kernel reads: a tensor ending in the normalized dims as (rows, D), unit stride on D."""

from __future__ import annotations

import torch


def as_rows(t: torch.Tensor, D: int) -> torch.Tensor:
    """(…, *normalized_shape) -> (N, D) with unit stride on D; copies only when it must."""
    if t.is_contiguous():
        return t.view(-1, D)
    t2 = t.reshape(-1, D)
    if D > 1 and t2.stride(1) != 1:
        t2 = t2.contiguous()
    return t2


def f32(t: torch.Tensor | None) -> torch.Tensor | None:
    """A tensor the kernels read as contiguous float32 (per-token coefficients, their gradients), detached;
    None stays None."""
    return None if t is None else t.detach().to(torch.float32).contiguous()


def resolved(*ts):
    """The tensors with any negative bit applied: a negative view (``torch._neg_view``, a conjugate's imaginary
    part) holds its values un-negated with a flag the kernels, reading raw memory, cannot see. Every kernel
    entry takes its tensors through this (forward inputs and backward gradients alike); a copy only where the
    flag is set."""
    for t in ts:  # the common case (no flag anywhere) returns the arguments as they came, nothing built
        if t is not None and t.is_neg():
            return tuple(u.resolve_neg() if u is not None and u.is_neg() else u for u in ts)
    return ts
