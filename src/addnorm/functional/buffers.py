"""Rules for caller-provided output buffers (``out=`` / ``residual_out=``), the allocation-free path.

Aliasing rules (checked, never assumed):
  * an output may be *exactly* an input (same storage offset, shape, strides and dtype): each row is
    read completely before that row is written, so ``residual_out=residual`` updates the residual
    stream in place (vLLM's fused_add_rms_norm style) and ``out=x`` overwrites the branch output;
  * an output may not partially overlap any input (a shifted view would be read after written), nor
    overlap the weight or bias at all (every row reads them);
  * an output may not overlap itself (an expanded tensor: several elements share one address);
  * ``out`` and ``residual_out`` may not overlap each other at all;
  * outputs must have x's shape and device, ``out`` the output dtype and ``residual_out`` the stream's,
    and be viewable as (rows, D) -- D the product of the normalized dims -- with unit stride on D (a
    contiguous tensor always is).
Autograd is not supported on this path (PyTorch's own ``out=`` rule): the call is for inference.
"""

from __future__ import annotations

import torch

def _span(t: torch.Tensor) -> tuple[int, int]:
    if t.numel() == 0:
        return (0, 0)
    lo = t.data_ptr() + sum((s - 1) * st for s, st in zip(t.shape, t.stride()) if st < 0) * t.element_size()
    extent = sum((s - 1) * abs(st) for s, st in zip(t.shape, t.stride()))
    return lo, lo + (extent + 1) * t.element_size()


def _overlap(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.untyped_storage().data_ptr() != b.untyped_storage().data_ptr():
        return False
    (a0, a1), (b0, b1) = _span(a), _span(b)
    return a0 < b1 and b0 < a1


def _same_view(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (a.data_ptr() == b.data_ptr() and a.shape == b.shape and a.stride() == b.stride()
            and a.dtype == b.dtype)


def _check_buffer(name: str, t, x: torch.Tensor, D: int, dtype: torch.dtype) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.shape != x.shape or t.dtype != dtype or t.device != x.device:
        raise ValueError(f"{name} must have shape {tuple(x.shape)}, dtype {dtype} and device {x.device}; "
                         f"got shape {tuple(t.shape)}, {t.dtype}, {t.device}")
    if any(n > 1 and st == 0 for n, st in zip(t.shape, t.stride())):  # expanded
        raise _self_overlap(name)
    if not D or not t.numel():
        return
    try:
        v = t.view(-1, D)
    except RuntimeError:
        raise ValueError(f"{name} must be viewable as (rows, {D}); pass a contiguous tensor") from None
    if D > 1 and v.stride(1) != 1:
        raise ValueError(f"{name} must have unit stride along its normalized dims; pass a contiguous tensor")
    if v.shape[0] > 1 and abs(v.stride(0)) < D:  # rows closer than a row's length share elements
        raise _self_overlap(name)


def _self_overlap(name: str) -> ValueError:
    return ValueError(f"{name} overlaps itself (several of its elements share memory, e.g. an expanded "
                      "tensor); pass a tensor with its own memory for every element")


def check_out_buffers(x, residual, weight, bias, out, residual_out, D: int, out_dtype, sum_dtype, has_sum) -> None:
    if residual_out is not None and not has_sum:
        raise ValueError("residual_out was given but residual is None: there is no residual sum to write")
    outs = [(n, t, dt) for n, t, dt in (("out", out, out_dtype), ("residual_out", residual_out, sum_dtype))
            if t is not None]
    for name, t, dt in outs:
        _check_buffer(name, t, x, D, dt)
        for in_name, src in (("x", x), ("residual", residual)):
            if src is not None and _overlap(t, src) and not _same_view(t, src):
                raise ValueError(f"{name} partially overlaps {in_name}; an output may only be exactly an input "
                                 "(same storage offset, shape, strides and dtype) or not overlap it at all")
        for p_name, p in (("weight", weight), ("bias", bias)):
            if p is not None and _overlap(t, p):
                raise ValueError(f"{name} overlaps {p_name}; every row reads the {p_name}, so an output may not "
                                 "share its memory")
    if out is not None and residual_out is not None and _overlap(out, residual_out):
        raise ValueError("out and residual_out overlap; they must be separate buffers")


def mark_written(*buffers) -> None:
    """The kernels wrote the caller's buffers through their pointers: bump their version counters, as an in-place
    torch op does, so that autograd refuses a backward that saved one of them (else it would use the new values)."""
    ts = [t for t in buffers if t is not None and not t.is_inference()]
    if ts:
        torch.autograd.graph.increment_version(ts)

