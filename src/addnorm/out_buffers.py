"""Rules for caller-provided output buffers (``out=`` / ``residual_out=``), the allocation-free path.

Aliasing rules (checked, never assumed):
  * an output may be *exactly* an input (same storage offset, shape and strides): each row is
    read completely before that row is written, so ``residual_out=residual`` updates the residual
    stream in place (vLLM's fused_add_rms_norm style) and ``out=x`` overwrites the branch output;
  * an output may not partially overlap any input (a shifted view would be read after written);
  * ``out`` and ``residual_out`` may not overlap each other at all;
  * outputs must have x's shape, dtype and device, and be viewable as (rows, D) with unit stride
    on D (a contiguous tensor always is).
Autograd is not supported on this path (PyTorch's own ``out=`` rule): the call is for inference.
"""

from __future__ import annotations

import torch


def _span(t: torch.Tensor) -> tuple[int, int]:
    if t.numel() == 0:
        return (0, 0)
    last = sum((s - 1) * abs(st) for s, st in zip(t.shape, t.stride()))
    return t.data_ptr(), t.data_ptr() + (last + 1) * t.element_size()


def _overlap(a: torch.Tensor, b: torch.Tensor) -> bool:
    (a0, a1), (b0, b1) = _span(a), _span(b)
    return a0 < b1 and b0 < a1


def _same_view(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.data_ptr() == b.data_ptr() and a.shape == b.shape and a.stride() == b.stride()


def _check_buffer(name: str, t, x: torch.Tensor) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.shape != x.shape or t.dtype != x.dtype or t.device != x.device:
        raise ValueError(f"{name} must match x (shape {tuple(x.shape)}, {x.dtype}, {x.device}); "
                         f"got shape {tuple(t.shape)}, {t.dtype}, {t.device}")
    D = x.shape[-1] if x.dim() else 1
    try:
        v = t.view(-1, D)
    except RuntimeError:
        raise ValueError(f"{name} must be viewable as (rows, {D}); pass a contiguous tensor") from None
    if D > 1 and v.numel() and v.stride(1) != 1:
        raise ValueError(f"{name} must have unit stride along its last dim; pass a contiguous tensor")


def check_out_buffers(x, residual, out, residual_out) -> None:
    if residual_out is not None and residual is None:
        raise ValueError("residual_out was given but residual is None: there is no residual sum to write")
    outs = [(n, t) for n, t in (("out", out), ("residual_out", residual_out)) if t is not None]
    for name, t in outs:
        _check_buffer(name, t, x)
        for in_name, src in (("x", x), ("residual", residual)):
            if src is not None and _overlap(t, src) and not _same_view(t, src):
                raise ValueError(f"{name} partially overlaps {in_name}; an output may only be exactly an input "
                                 "(same storage offset, shape and strides) or not overlap it at all")
    if out is not None and residual_out is not None and _overlap(out, residual_out):
        raise ValueError("out and residual_out overlap; they must be separate buffers")
