"""Triton kernels of the fused forms: norm-then-add and the parallel residual (see ``fused_rows.h``).

    forward   s = X + round_amdt(A + M)           (each term optional but X), rounded to S's dtype
              y = Norm(s; w1, b1)  or  y = post + round_ndt(Norm(s))   (norm-then-add)
              y2 = Norm(s; w2, b2)
    backward  g = dy * (w1 + off) + dy2 * (w2 + off);  ds = rstd * (g - mean(g) - xhat * mean(g * xhat)) + dres

A program takes ROWS rows of up to BLOCK elements, held in registers (rows longer than the largest
block take the torch formulas). The parameter gradients are summed per program with Kahan compensation
and reduced across programs in float64 by ``jit.norm.reduce_partials``, as the Add & Norm backward does.
"""

import triton
import triton.language as tl

from .common import cast_rne as _to
from .common import centred as _centred
from .common import kahan_add as _kahan
from .common import load_f32 as _load
from .common import variance as _variance
from .common import row_scale as _row_scale
from .common import rstd_scaled as _rstd_scaled
from .common import xhat_from_stats as _xhat


@triton.jit
def _norm_out(xhat, W, B, cols, cmask, weight_offset, NDT: tl.constexpr, HAS_W: tl.constexpr, HAS_B: tl.constexpr,
              CAST_BEFORE_W: tl.constexpr, RNE: tl.constexpr):
    y = xhat
    if CAST_BEFORE_W:
        y = _to(y, NDT, RNE).to(tl.float32)
    if HAS_W:
        y = y * (_load(W, cols, cmask) + weight_offset)[None, :]
    if HAS_B:
        y = y + _load(B, cols, cmask)[None, :]
    return y


@triton.jit
def fused_fwd(X, A, M, P, W1, B1, W2, B2, Y, Y2, S, MEAN, RSTD, sx, sa, sm, sp, sy, sy2, ss, N, D, eps, weight_offset,
              AMDT: tl.constexpr, NDT: tl.constexpr, IS_LAYER: tl.constexpr, HAS_A: tl.constexpr,
              HAS_M: tl.constexpr, HAS_P: tl.constexpr, HAS_W1: tl.constexpr, HAS_B1: tl.constexpr,
              HAS_W2: tl.constexpr, HAS_B2: tl.constexpr, STORE_Y: tl.constexpr, STORE_Y2: tl.constexpr,
              STORE_S: tl.constexpr, STORE_STATS: tl.constexpr, CAST_BEFORE_W: tl.constexpr, ROWS: tl.constexpr,
              BLOCK: tl.constexpr, RNE: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    rmask = rows < N
    cols = tl.arange(0, BLOCK)
    cmask = cols < D
    mask = rmask[:, None] & cmask[None, :]
    r = rows[:, None]
    s = _load(X, r * sx + cols[None, :], mask)
    if HAS_A:
        t = _load(A, r * sa + cols[None, :], mask)
        if HAS_M:
            t = _to(t + _load(M, r * sm + cols[None, :], mask), AMDT, RNE).to(tl.float32)
        s = _to(s + t, S.dtype.element_ty, RNE).to(tl.float32)
    if STORE_S:
        tl.store(S + r * ss + cols[None, :], _to(s, S.dtype.element_ty, RNE), mask=mask)
    c = _row_scale(tl.max(tl.abs(s), axis=1))  # rows of huge values scaled (1 for every other)
    xc = s * c[:, None]
    mean = tl.zeros([ROWS], dtype=tl.float32)
    if IS_LAYER:
        mean, xc = _centred(xc, mask, D)
        var = _variance(tl.sum(xc * xc, axis=1), D)
    else:
        var = tl.sum(xc * xc, axis=1) / D  # RMSNorm: a row with an inf has rstd 0, as torch's rms_norm gives
    rsc, rstd = _rstd_scaled(var, eps, c)
    mean = mean / c
    xhat = xc * rsc[:, None]
    if STORE_Y:
        y = _norm_out(xhat, W1, B1, cols, cmask, weight_offset, NDT, HAS_W1, HAS_B1, CAST_BEFORE_W, RNE)
        if HAS_P:
            y = _to(y, NDT, RNE).to(tl.float32) + _load(P, r * sp + cols[None, :], mask)
        tl.store(Y + r * sy + cols[None, :], _to(y, Y.dtype.element_ty, RNE), mask=mask)
    if STORE_Y2:
        y2 = _norm_out(xhat, W2, B2, cols, cmask, weight_offset, NDT, HAS_W2, HAS_B2, CAST_BEFORE_W, RNE)
        tl.store(Y2 + r * sy2 + cols[None, :], _to(y2, Y2.dtype.element_ty, RNE), mask=mask)
    if STORE_STATS:
        tl.store(RSTD + rows, rstd, mask=rmask)
        if IS_LAYER:
            tl.store(MEAN + rows, mean, mask=rmask)


@triton.jit
def fused_bwd(DY, DY2, DRES, S, MEAN, RSTD, W1, W2, DS, DWP, sdy, sdy2, sdres, s_s, sds, N, D, rows_per_program,
              weight_offset, IS_LAYER: tl.constexpr, HAS_DY: tl.constexpr, HAS_DY2: tl.constexpr,
              HAS_DRES: tl.constexpr, HAS_W1: tl.constexpr, HAS_W2: tl.constexpr, WANT_DW1: tl.constexpr,
              WANT_DB1: tl.constexpr, WANT_DW2: tl.constexpr, WANT_DB2: tl.constexpr, ROWS: tl.constexpr,
              BLOCK: tl.constexpr, RNE: tl.constexpr):
    pid = tl.program_id(0).to(tl.int64)
    first = pid * rows_per_program
    last = tl.minimum(first + rows_per_program, N)
    cols = tl.arange(0, BLOCK)
    cmask = cols < D
    acc_w1 = tl.zeros([BLOCK], dtype=tl.float32)
    car_w1 = tl.zeros([BLOCK], dtype=tl.float32)
    acc_b1 = tl.zeros([BLOCK], dtype=tl.float32)
    car_b1 = tl.zeros([BLOCK], dtype=tl.float32)
    acc_w2 = tl.zeros([BLOCK], dtype=tl.float32)
    car_w2 = tl.zeros([BLOCK], dtype=tl.float32)
    acc_b2 = tl.zeros([BLOCK], dtype=tl.float32)
    car_b2 = tl.zeros([BLOCK], dtype=tl.float32)
    w1 = tl.full([BLOCK], 1.0, tl.float32)
    w2 = tl.full([BLOCK], 1.0, tl.float32)
    if HAS_W1:
        w1 = _load(W1, cols, cmask) + weight_offset
    if HAS_W2:
        w2 = _load(W2, cols, cmask) + weight_offset
    for t in range(first, last, ROWS):
        rows = t + tl.arange(0, ROWS)
        rmask = rows < last
        mask = rmask[:, None] & cmask[None, :]
        r = rows[:, None]
        rstd = tl.load(RSTD + rows, mask=rmask, other=0.0)
        mean = tl.zeros([ROWS], dtype=tl.float32)
        if IS_LAYER:
            mean = tl.load(MEAN + rows, mask=rmask, other=0.0)
        xhat = tl.where(mask, _xhat(_load(S, r * s_s + cols[None, :], mask), mean, rstd), 0.0)
        g = tl.zeros([ROWS, BLOCK], dtype=tl.float32)
        dy = g
        dy2 = g
        if HAS_DY:
            dy = _load(DY, r * sdy + cols[None, :], mask)
            g += dy * w1[None, :]
        if HAS_DY2:
            dy2 = _load(DY2, r * sdy2 + cols[None, :], mask)
            g += dy2 * w2[None, :]
        part = g - xhat * (tl.sum(g * xhat, axis=1) / D)[:, None]
        if IS_LAYER:
            part -= (tl.sum(g, axis=1) / D)[:, None]
        ds = part * rstd[:, None]
        if HAS_DRES:
            ds += _load(DRES, r * sdres + cols[None, :], mask)
        tl.store(DS + r * sds + cols[None, :], _to(ds, DS.dtype.element_ty, RNE), mask=mask)
        if WANT_DW1:
            acc_w1, car_w1 = _kahan(acc_w1, car_w1, tl.sum(dy * xhat, axis=0))
        if WANT_DB1:
            acc_b1, car_b1 = _kahan(acc_b1, car_b1, tl.sum(dy, axis=0))
        if WANT_DW2:
            acc_w2, car_w2 = _kahan(acc_w2, car_w2, tl.sum(dy2 * xhat, axis=0))
        if WANT_DB2:
            acc_b2, car_b2 = _kahan(acc_b2, car_b2, tl.sum(dy2, axis=0))
    # DWP: (4, programs, D) partial rows, one per gradient
    P = tl.num_programs(0).to(tl.int64) * D
    base = DWP + pid * D
    if WANT_DW1:
        tl.store(base + cols, acc_w1, mask=cmask)
    if WANT_DB1:
        tl.store(base + P + cols, acc_b1, mask=cmask)
    if WANT_DW2:
        tl.store(base + 2 * P + cols, acc_w2, mask=cmask)
    if WANT_DB2:
        tl.store(base + 3 * P + cols, acc_b2, mask=cmask)
