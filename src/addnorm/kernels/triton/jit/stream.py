"""Triton kernels of the widened stream's read and write (see ``kernels/cpu/stream_rows.h``): one program per
token, its n rows of up to BLOCK elements held in registers; coefficients float32, sums float32, each output
rounded once (``_to``: round-to-nearest-even under the interpreter too)."""

import triton
import triton.language as tl

from .common import cast_rne as _to
from .common import load_f32 as _load


@triton.jit
def stream_read(X, HP, H, C, NS: tl.constexpr, BLOCK: tl.constexpr, RNE: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    m = cols < C
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for i in tl.static_range(NS):
        acc += tl.load(HP + t * NS + i) * _load(X, (t * NS + i) * C + cols, m)
    tl.store(H + t * C + cols, _to(acc, H.dtype.element_ty, RNE), mask=m)


@triton.jit
def stream_read_bwd(DH, X, HP, DX, DPRE, C, NS: tl.constexpr, BLOCK: tl.constexpr, RNE: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    m = cols < C
    dh = _load(DH, t * C + cols, m)
    for i in tl.static_range(NS):
        tl.store(DPRE + t * NS + i, tl.sum(dh * _load(X, (t * NS + i) * C + cols, m), axis=0))
        tl.store(DX + (t * NS + i) * C + cols, _to(tl.load(HP + t * NS + i) * dh, DX.dtype.element_ty, RNE), mask=m)


@triton.jit
def stream_write(X, Y, HPOST, HRES, X2, Q, C, NS: tl.constexpr, BLOCK: tl.constexpr, STORE_Q: tl.constexpr,
                 RNE: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    m = cols < C
    y = _load(Y, t * C + cols, m)
    q = tl.zeros([BLOCK], dtype=tl.float32)
    for i in tl.static_range(NS):
        acc = tl.load(HPOST + t * NS + i) * y
        for j in tl.static_range(NS):
            acc += tl.load(HRES + (t * NS + i) * NS + j) * _load(X, (t * NS + j) * C + cols, m)
        v = _to(acc, X2.dtype.element_ty, RNE)
        tl.store(X2 + (t * NS + i) * C + cols, v, mask=m)
        vf = tl.where(m, v.to(tl.float32), 0.0)
        q += vf * vf
    if STORE_Q:
        tl.store(Q + t, tl.sum(q, axis=0))


@triton.jit
def _g(DX2, X2, dq, t, i, C, cols, m, NS: tl.constexpr, HAS_DQ: tl.constexpr):
    g = _load(DX2, (t * NS + i) * C + cols, m)
    if HAS_DQ:
        g += 2.0 * dq * _load(X2, (t * NS + i) * C + cols, m)
    return g


@triton.jit
def stream_write_bwd(DX2, DQ, X, Y, X2, HPOST, HRES, DX, DY, DPOST, DRES, C, NS: tl.constexpr, BLOCK: tl.constexpr,
                     HAS_DQ: tl.constexpr, RNE: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    m = cols < C
    dq = 0.0
    if HAS_DQ:
        dq = tl.load(DQ + t)
    y = _load(Y, t * C + cols, m)
    dy = tl.zeros([BLOCK], dtype=tl.float32)
    for i in tl.static_range(NS):
        g = _g(DX2, X2, dq, t, i, C, cols, m, NS, HAS_DQ)
        tl.store(DPOST + t * NS + i, tl.sum(g * y, axis=0))
        dy += tl.load(HPOST + t * NS + i) * g
    tl.store(DY + t * C + cols, _to(dy, DY.dtype.element_ty, RNE), mask=m)
    for j in tl.static_range(NS):
        xj = _load(X, (t * NS + j) * C + cols, m)
        dx = tl.zeros([BLOCK], dtype=tl.float32)
        for i in tl.static_range(NS):
            g = _g(DX2, X2, dq, t, i, C, cols, m, NS, HAS_DQ)
            tl.store(DRES + (t * NS + i) * NS + j, tl.sum(g * xj, axis=0))
            dx += tl.load(HRES + (t * NS + i) * NS + j) * g
        tl.store(DX + (t * NS + j) * C + cols, _to(dx, DX.dtype.element_ty, RNE), mask=m)
