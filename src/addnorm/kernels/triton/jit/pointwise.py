"""Triton kernels of DyT / Derf fused with the add (see ``kernels/cpu/pointwise_rows.h``): rows of D in
tiles of ROWS x BLOCK (rows longer than one block take the formulas); alpha and shift read from memory, so
a learned scalar costs no host synchronisation; parameter and scalar gradients summed per program (Kahan)
and reduced in float64 by ``jit.norm.reduce_partials``."""

import triton
import triton.language as tl

from .common import cast_rne as _to
from .common import kahan_add as _kahan
from .common import load_f32 as _load


@triton.jit
def _f(u, IS_DYT: tl.constexpr):
    if IS_DYT:
        # tanh as the C kernels' tanh_v: (1 - e) / (1 + e) with e = exp(-2|u|) from |u| = 0.625 up, and below it
        # Cephes' odd polynomial u + u z q(z), z = u^2 -- there 1 - e cancels (0 below |u| ~ 3e-8, 1 % wrong at 1e-6)
        z = u * u
        q = -5.70498872745e-3 * z + 2.06390887954e-2
        q = q * z - 5.37397155531e-2
        q = q * z + 1.33314422036e-1
        q = q * z - 3.33332819422e-1
        small = q * z * u + u
        e = tl.exp(-2.0 * tl.abs(u))
        t = (1.0 - e) / (1.0 + e)
        return tl.where(tl.abs(u) < 0.625, small, tl.where(u < 0, -t, t))
    return tl.math.erf(u)


@triton.jit
def pointwise_fwd(X, R, ALPHA, SHIFT, W, B, Y, S, sx, sr, N, D, IS_DYT: tl.constexpr, HAS_R: tl.constexpr,
                  HAS_SHIFT: tl.constexpr, HAS_W: tl.constexpr, HAS_B: tl.constexpr, STORE_S: tl.constexpr,
                  ROWS: tl.constexpr, BLOCK: tl.constexpr, RNE: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK)
    cm = cols < D
    m = (rows < N)[:, None] & cm[None, :]
    s = _load(X, rows[:, None] * sx + cols[None, :], m)
    if HAS_R:
        s = _to(s + _load(R, rows[:, None] * sr + cols[None, :], m), S.dtype.element_ty, RNE)
        if STORE_S:
            tl.store(S + rows[:, None] * D + cols[None, :], s, mask=m)
        s = s.to(tl.float32)
    u = tl.load(ALPHA).to(tl.float32) * s
    if HAS_SHIFT:
        u += tl.load(SHIFT).to(tl.float32)
    y = _f(u, IS_DYT)
    if HAS_W:
        y = y * _load(W, cols, cm)[None, :]
    if HAS_B:
        y = y + _load(B, cols, cm)[None, :]
    tl.store(Y + rows[:, None] * D + cols[None, :], _to(y, Y.dtype.element_ty, RNE), mask=m)


@triton.jit
def pointwise_bwd(DY, DRES, S, ALPHA, SHIFT, W, DS, PART, sdy, sdres, N, D, rows_per_program,
                  IS_DYT: tl.constexpr, HAS_DRES: tl.constexpr, HAS_SHIFT: tl.constexpr, HAS_W: tl.constexpr,
                  ROWS: tl.constexpr, BLOCK: tl.constexpr, RNE: tl.constexpr):
    """PART: (4, programs, BLOCK) float32 -- dweight, dbias, and (dalpha, dshift) in columns 0, 1 of row 2."""
    pid = tl.program_id(0).to(tl.int64)
    first = pid * rows_per_program
    last = tl.minimum(first + rows_per_program, N)
    cols = tl.arange(0, BLOCK)
    cm = cols < D
    alpha = tl.load(ALPHA).to(tl.float32)
    shift = 0.0
    if HAS_SHIFT:
        shift = tl.load(SHIFT).to(tl.float32)
    w = tl.full([BLOCK], 1.0, tl.float32)
    if HAS_W:
        w = _load(W, cols, cm)
    dw = tl.zeros([BLOCK], dtype=tl.float32)
    dw_c = tl.zeros([BLOCK], dtype=tl.float32)
    db = tl.zeros([BLOCK], dtype=tl.float32)
    db_c = tl.zeros([BLOCK], dtype=tl.float32)
    da = tl.zeros([ROWS], dtype=tl.float32)
    dsh = tl.zeros([ROWS], dtype=tl.float32)
    for t in range(first, last, ROWS):
        rows = t + tl.arange(0, ROWS)
        m = (rows < last)[:, None] & cm[None, :]
        s = _load(S, rows[:, None] * D + cols[None, :], m)
        dy = _load(DY, rows[:, None] * sdy + cols[None, :], m)
        u = alpha * s + shift
        f = _f(u, IS_DYT)
        if IS_DYT:
            fp = 1.0 - f * f
        else:
            fp = 1.1283791670955126 * tl.exp(-u * u)
        g = tl.where(m, dy * w[None, :] * fp, 0.0)
        ds = alpha * g
        if HAS_DRES:
            ds += _load(DRES, rows[:, None] * sdres + cols[None, :], m)
        tl.store(DS + rows[:, None] * D + cols[None, :], _to(ds, DS.dtype.element_ty, RNE), mask=m)
        da += tl.sum(g * s, axis=1)
        dsh += tl.sum(g, axis=1)
        dw, dw_c = _kahan(dw, dw_c, tl.sum(tl.where(m, dy * f, 0.0), axis=0))
        db, db_c = _kahan(db, db_c, tl.sum(dy, axis=0))
    P = tl.num_programs(0).to(tl.int64) * BLOCK
    base = PART + pid * BLOCK
    tl.store(base + cols, dw, mask=cm)
    tl.store(base + P + cols, db, mask=cm)
    scal = tl.where(cols == 0, tl.sum(da, axis=0), tl.where(cols == 1, tl.sum(dsh, axis=0), 0.0))
    tl.store(base + 2 * P + cols, scal, mask=cols < 2)
