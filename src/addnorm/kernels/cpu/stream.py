"""Host side of the widened stream's CPU kernels (``stream_rows.h``).

    stream_read(x, h_pre)                          -> h            h = sum_i H_pre[i] X_i
    stream_read_backward(dh, x, h_pre)             -> (dx, dh_pre)
    stream_write(x, y, h_post, h_res, want_q)      -> (x2, q)      X'_i = sum_j H_res[i, j] X_j + H_post[i] y
    stream_write_backward(dx2, dq, x, y, x2, h_post, h_res) -> (dx, dy, dh_post, dh_res)

x is (..., n, C), y and h (..., C), the coefficients (..., n) and (..., n, n). Activations are read as they
are when contiguous (else copied), coefficients as contiguous float32; coefficient gradients come back in
float32 (the caller casts them to the coefficients' dtype).
"""

from __future__ import annotations

import torch

from ..rows import f32 as _f32, resolved
from .library import availability, library
from .norm import DTYPE, empty_rows_like, num_threads, ptr

MAX_STREAMS = 8  # AN_STREAM_MAX_N
READ, READ_BWD, WRITE, WRITE_BWD = 0, 1, 2, 3


def applies(x: torch.Tensor, *others) -> bool:
    """Whether the kernels take this call: one kernel dtype for the activations, n <= 8, C >= 1."""
    return (x.dtype in DTYPE and all(t is None or t.dtype == x.dtype for t in others) and x.dim() >= 2
            and 1 <= x.shape[-2] <= MAX_STREAMS and x.shape[-1] > 0 and availability().available)


def _c(t):
    return None if t is None else t.contiguous()


def _run(op, n, x, y, xin, xout, out, dy, h_pre, h_post, h_res, q, dq, d_pre, d_post, d_res, N, C):
    rc = library().stream(op, n, DTYPE[x.dtype], N, C, ptr(x), ptr(y), ptr(xin), ptr(xout), ptr(out), ptr(dy),
                          ptr(h_pre), ptr(h_post), ptr(h_res), ptr(q), ptr(dq), ptr(d_pre), ptr(d_post),
                          ptr(d_res), num_threads())
    if rc == -1:
        raise MemoryError("addnorm CPU stream kernel could not allocate its scratch rows")
    if rc:
        raise ValueError(f"addnorm CPU stream kernel refused the call (code {rc})")


def stream_read(x, h_pre):
    x, h_pre = resolved(x, h_pre)
    n, C = x.shape[-2], x.shape[-1]
    x = _c(x)
    N = x.numel() // (n * C)
    h = torch.empty(x.shape[:-2] + (C,), device="cpu", dtype=x.dtype)
    _run(READ, n, x, None, None, None, h, None, _f32(h_pre), None, None, None, None, None, None, None, N, C)
    return h


def stream_read_backward(dh, x, h_pre):
    dh, x, h_pre = resolved(dh, x, h_pre)
    n, C = x.shape[-2], x.shape[-1]
    x, dh = _c(x), _c(dh)
    N = x.numel() // (n * C)
    dx = empty_rows_like(x)
    d_pre = torch.empty(x.shape[:-1], device="cpu", dtype=torch.float32)
    _run(READ_BWD, n, x, dh, None, None, dx, None, _f32(h_pre), None, None, None, None, d_pre, None, None, N, C)
    return dx, d_pre


def stream_write(x, y, h_post, h_res, want_q: bool):
    x, y, h_post, h_res = resolved(x, y, h_post, h_res)
    n, C = x.shape[-2], x.shape[-1]
    x, y = _c(x), _c(y)
    N = x.numel() // (n * C)
    x2 = empty_rows_like(x)
    q = torch.empty(x.shape[:-2], device="cpu", dtype=torch.float32) if want_q else None
    _run(WRITE, n, x, y, None, None, x2, None, None, _f32(h_post), _f32(h_res), q, None, None, None, None, N, C)
    return x2, q


def stream_write_backward(dx2, dq, x, y, x2, h_post, h_res):
    dx2, dq, x, y, x2, h_post, h_res = resolved(dx2, dq, x, y, x2, h_post, h_res)
    n, C = x.shape[-2], x.shape[-1]
    dx2, x, y = _c(dx2), _c(x), _c(y)
    N = x.numel() // (n * C)
    dx = empty_rows_like(x)
    dy = empty_rows_like(y)
    d_post = torch.empty(x.shape[:-1], device="cpu", dtype=torch.float32)
    d_res = torch.empty(x.shape[:-1] + (n,), device="cpu", dtype=torch.float32)
    _run(WRITE_BWD, n, dx2, y, x, None if dq is None else _c(x2), dx, dy, None, _f32(h_post), _f32(h_res), None,
         _f32(dq), None, d_post, d_res, N, C)
    return dx, dy, d_post, d_res
