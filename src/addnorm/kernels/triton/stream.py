"""Host side of the widened stream's Triton kernels, with the CPU host's signatures (``kernels.cpu.stream``)."""

from __future__ import annotations

import torch

from ..rows import f32 as _f32, resolved
from .availability import availability
from .norm import MAX_BLOCK, OPTIONS, SUPPORTED_DTYPES, next_pow2, on_device, warps

MAX_STREAMS = 8


def applies(x: torch.Tensor, *others) -> bool:
    if not (x.dtype in SUPPORTED_DTYPES and all(t is None or t.dtype == x.dtype for t in others) and x.dim() >= 2
            and 1 <= x.shape[-2] <= MAX_STREAMS and 0 < x.shape[-1] <= MAX_BLOCK):
        return False
    av = availability()
    return av.available and (x.is_cuda or av.interpreted)


def _k():
    from .jit import stream as stream_kernels

    return stream_kernels


def _launch(name, x, *args, **meta):
    n, C = x.shape[-2], x.shape[-1]
    N = x.numel() // (n * C)
    if N == 0:
        return
    block = next_pow2(C)
    with on_device(x):
        getattr(_k(), name)[(N,)](*args, C, NS=n, BLOCK=block, RNE=availability().interpreted,
                                  num_warps=warps(block, 8), **meta, **OPTIONS)


def stream_read(x, h_pre):
    x, h_pre = resolved(x, h_pre)
    x = x.contiguous()
    h = torch.empty(x.shape[:-2] + x.shape[-1:], dtype=x.dtype, device=x.device)
    _launch("stream_read", x, x, _f32(h_pre), h)
    return h


def stream_read_backward(dh, x, h_pre):
    dh, x, h_pre = resolved(dh, x, h_pre)
    x, dh = x.contiguous(), dh.contiguous()
    dx = torch.empty_like(x)
    d_pre = torch.empty(x.shape[:-1], dtype=torch.float32, device=x.device)
    _launch("stream_read_bwd", x, dh, x, _f32(h_pre), dx, d_pre)
    return dx, d_pre


def stream_write(x, y, h_post, h_res, want_q: bool):
    x, y, h_post, h_res = resolved(x, y, h_post, h_res)
    x, y = x.contiguous(), y.contiguous()
    x2 = torch.empty_like(x)
    q = torch.empty(x.shape[:-2], dtype=torch.float32, device=x.device) if want_q else None
    _launch("stream_write", x, x, y, _f32(h_post), _f32(h_res), x2, x2 if q is None else q, STORE_Q=want_q)
    return x2, q


def stream_write_backward(dx2, dq, x, y, x2, h_post, h_res):
    dx2, dq, x, y, x2, h_post, h_res = resolved(dx2, dq, x, y, x2, h_post, h_res)
    dx2, x, y = dx2.contiguous(), x.contiguous(), y.contiguous()
    dx, dy = torch.empty_like(x), torch.empty_like(y)
    d_post = torch.empty(x.shape[:-1], dtype=torch.float32, device=x.device)
    d_res = torch.empty(x.shape[:-1] + x.shape[-2:-1], dtype=torch.float32, device=x.device)
    has_dq = dq is not None
    _launch("stream_write_bwd", x, dx2, _f32(dq) if has_dq else d_post, x, y, x2.contiguous() if has_dq else x,
            _f32(h_post), _f32(h_res), dx, dy, d_post, d_res, HAS_DQ=has_dq)
    return dx, dy, d_post, d_res
