"""Host side of Qwen4-exp's gated-read CPU kernels (``hyper_rows.h``): one walk over each token's n rows of C.

    stream_norm(x, weight, eps, weight_offset)                   -> normed        N_i = X_i rstd_i (off + w_i)
    stream_norm_backward(dn, x, weight, eps, weight_offset)      -> (dx, dweight)
    write_norm(x, y, h_post, weight, eps, weight_offset, products) -> (x2, normed) X' = X + H_post^T y, N = norm(X')
    write_norm_backward(dx2, dn, x2, y, h_post, weight, eps, weight_offset) -> (dx, dy, dh_post, dweight)
    sigmoid_collapse(x, logits, products)                        -> h             h = (1/n) sum_i sigmoid(U_i) X_i
    sigmoid_collapse_backward(dh, x, logits, products)           -> (dx, dlogits)

x (..., n, C), and the activations beside it (y and h (..., C), logits, the gradients), in one kernel dtype, read
as they are when contiguous (else copied); the weight (n, C) and H_post (..., n) go in as float32, dweight and
dh_post come back float32 (the caller casts them to the parameters' dtypes). The backward recomputes each row's
statistics from X (or X'), so the forward saves nothing but its inputs. ``products``: where eager 16-bit code rounds
(the write's H_post[i] y; the gate and each gated product), see ``hyper_rows.h``.
"""

from __future__ import annotations

import torch

from ..rows import f32 as _f32, resolved
from .library import availability, library
from .norm import DTYPE, empty_rows_like, num_threads, ptr

NORM, NORM_BWD, WNORM, WNORM_BWD, GATE, GATE_BWD = 0, 1, 2, 3, 4, 5


def applies(x: torch.Tensor, *others) -> bool:
    """Whether the kernels take this call: the activations (``others`` beside x; None: absent) of one kernel dtype,
    a stream (..., n >= 1, C >= 1)."""
    return (x.dtype in DTYPE and all(t is None or t.dtype == x.dtype for t in others) and x.dim() >= 2
            and x.shape[-2] > 0 and x.shape[-1] > 0 and availability().available)


def _c(t):
    return None if t is None else t.contiguous()


def _run(op, x, *, y=None, u=None, w=None, off=0.0, eps=0.0, h_post=None, out=None, x2=None, dout=None, dx2=None,
         dy=None, du=None, d_post=None, dw=None, products=False):
    n, C = x.shape[-2], x.shape[-1]
    N = x.numel() // (n * C)
    rc = library().hyper(op, n, DTYPE[x.dtype], N, C, int(bool(products)), ptr(x), ptr(y), ptr(u), ptr(w),
                         float(off), float(eps), ptr(h_post), ptr(out), ptr(x2), ptr(dout), ptr(dx2), ptr(dy), ptr(du),
                         ptr(d_post), ptr(dw), num_threads())
    if rc == -1:
        raise MemoryError("addnorm CPU hyper kernel could not allocate its partial sums")
    if rc:
        raise ValueError(f"addnorm CPU hyper kernel refused the call (code {rc})")


def _weight(weight, x):
    return _f32(weight).reshape(x.shape[-2:])


def stream_norm(x, weight, eps, weight_offset):
    x, weight = resolved(x, weight)
    x = _c(x)
    out = empty_rows_like(x)
    _run(NORM, x, w=_weight(weight, x), off=weight_offset, eps=eps, out=out)
    return out


def stream_norm_backward(dn, x, weight, eps, weight_offset):
    dn, x, weight = resolved(dn, x, weight)
    x, dn = _c(x), _c(dn)
    dx = empty_rows_like(x)
    dw = torch.empty(x.shape[-2:], device="cpu", dtype=torch.float32)
    _run(NORM_BWD, x, w=_weight(weight, x), off=weight_offset, eps=eps, out=dx, dout=dn, dw=dw)
    return dx, dw


def write_norm(x, y, h_post, weight, eps, weight_offset, products):
    x, y, h_post, weight = resolved(x, y, h_post, weight)
    x, y = _c(x), _c(y)
    x2, out = empty_rows_like(x), empty_rows_like(x)
    _run(WNORM, x, y=y, h_post=_f32(h_post), w=_weight(weight, x), off=weight_offset, eps=eps, out=out, x2=x2,
         products=products)
    return x2, out


def write_norm_backward(dx2, dn, x2, y, h_post, weight, eps, weight_offset):
    dx2, dn, x2, y, h_post, weight = resolved(dx2, dn, x2, y, h_post, weight)
    x2, y, dn, dx2 = _c(x2), _c(y), _c(dn), _c(dx2)
    dx, dy = empty_rows_like(x2), empty_rows_like(y)
    d_post = torch.empty(x2.shape[:-1], device="cpu", dtype=torch.float32)
    dw = torch.empty(x2.shape[-2:], device="cpu", dtype=torch.float32)
    _run(WNORM_BWD, x2, y=y, h_post=_f32(h_post), w=_weight(weight, x2), off=weight_offset, eps=eps, out=dx, dout=dn,
         dx2=dx2, dy=dy, d_post=d_post, dw=dw)
    return dx, dy, d_post, dw


def sigmoid_collapse(x, logits, products):
    x, logits = resolved(x, logits)
    x, logits = _c(x), _c(logits)
    h = torch.empty(x.shape[:-2] + x.shape[-1:], device="cpu", dtype=x.dtype)
    _run(GATE, x, u=logits, out=h, products=products)
    return h


def sigmoid_collapse_backward(dh, x, logits, products):
    dh, x, logits = resolved(dh, x, logits)
    x, logits, dh = _c(x), _c(logits), _c(dh)
    dx, du = empty_rows_like(x), empty_rows_like(logits)
    _run(GATE_BWD, x, u=logits, out=dx, dout=dh, du=du, products=products)
    return dx, du
