"""The Triton kernels of fused Add & Norm: forward, backward, and the weight-gradient reduction.

Same semantics as the CPU kernels and ``addnorm.ops.norm.formulas``, row by row:

    s = round_sdt(x + residual)           the stream, in its own dtype (stored when it is returned)
    mean = sum(s) / D;  var = sum((s - mean)^2) / D      LayerNorm (two passes, the mean corrected by
                                          the mean deviation: exact for a constant row)
    var = sum(s^2) / D                                    RMSNorm
    rstd = 1 / sqrt(var + eps)            in float64, rounded once to float32
    y = xhat * (weight + weight_offset) + bias            in float32, rounded once to y's dtype
                                          (cast_before_weight: xhat rounded to the stream's dtype first)

Programs work on tiles of ROWS rows x BLOCK columns (several short rows at once; one row of up to
BLOCK elements). A row that fits in one block (``CHUNKS == 1``) is held in registers; a longer one is
walked in chunks of BLOCK: the forward's first pass writes the stream, the later ones read it back (so
``residual_out=residual`` in place stays right); the backward reads its inputs twice.

Backward recomputes xhat from s and the saved statistics. Each program takes a fixed range of rows and
sums dy * xhat and dy over it: per tile in a tree (``tl.sum``), across tiles with Kahan compensation,
in float32; one row of partials per program, which ``reduce_partials`` sums column by column in float64
in program order. The weight gradient is deterministic and as close to float64 as torch's.

Under Triton's interpreter (``RNE``) float32 -> bfloat16 casts truncate; ``_to`` (``common.cast_rne``) rounds to
nearest-even first, as the GPU's cast does, so interpreted results are the GPU's bit for bit in that respect.
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
def _affine(xhat, W, B, Y, offs_y, cols, mask, cmask, weight_offset, HAS_W: tl.constexpr, HAS_B: tl.constexpr,
            CAST_BEFORE_W: tl.constexpr, SDT: tl.constexpr, RNE: tl.constexpr):
    """y = xhat * (weight + offset) + bias, stored in Y's dtype."""
    y = xhat
    if CAST_BEFORE_W:  # Llama's order: the normalized row in the dtype of what the norm reads, then the weight
        y = _to(y, SDT, RNE).to(tl.float32)
    if HAS_W:
        y = y * (_load(W, cols, cmask) + weight_offset)[None, :]
    if HAS_B:
        y = y + _load(B, cols, cmask)[None, :]
    tl.store(Y + offs_y, _to(y, Y.dtype.element_ty, RNE), mask=mask)


@triton.jit
def _stream(X, R, S, rx, rr, rs, cols, mask, HAS_R: tl.constexpr, STORE_S: tl.constexpr, RNE: tl.constexpr):
    """A tile of the stream in float32 (0 where masked): x + residual rounded to the stream's dtype, and
    written to S when it is returned."""
    s = _load(X, rx + cols[None, :], mask)
    if HAS_R:
        s += _load(R, rr + cols[None, :], mask)
    if STORE_S:
        sr = _to(s, S.dtype.element_ty, RNE)
        tl.store(S + rs + cols[None, :], sr, mask=mask)
        s = sr.to(tl.float32)
    return s


@triton.jit
def _stream_again(X, S, rx, rs, cols, mask, STORE_S: tl.constexpr):
    """A tile of the stream already passed: read back from S where it was written (the residual may be
    S itself, updated in place), else x."""
    if STORE_S:
        return _load(S, rs + cols[None, :], mask)
    return _load(X, rx + cols[None, :], mask)


@triton.jit
def add_norm_fwd(X, R, W, B, Y, S, MEAN, RSTD, stride_x, stride_r, stride_y, stride_s, N, D, eps, weight_offset,
                 IS_LAYER: tl.constexpr, HAS_R: tl.constexpr, HAS_W: tl.constexpr, HAS_B: tl.constexpr,
                 STORE_S: tl.constexpr, STORE_STATS: tl.constexpr, CAST_BEFORE_W: tl.constexpr, SDT: tl.constexpr,
                 ROWS: tl.constexpr, BLOCK: tl.constexpr, CHUNKS: tl.constexpr, RNE: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)  # int64: rows * stride may pass 2**31
    rmask = rows < N
    rx, ry = rows[:, None] * stride_x, rows[:, None] * stride_y
    rr, rs = rows[:, None] * stride_r, rows[:, None] * stride_s
    if CHUNKS == 1:  # the rows in registers
        cols = tl.arange(0, BLOCK)
        mask = rmask[:, None] & (cols < D)[None, :]
        s = _stream(X, R, S, rx, rr, rs, cols, mask, HAS_R, STORE_S, RNE)
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
        _affine(xc * rsc[:, None], W, B, Y, ry + cols[None, :], cols, mask, cols < D, weight_offset, HAS_W, HAS_B,
                CAST_BEFORE_W, SDT, RNE)
    else:
        acc = tl.zeros([ROWS, BLOCK], dtype=tl.float32)
        amax = tl.zeros([ROWS, BLOCK], dtype=tl.float32)
        for c in range(CHUNKS):  # pass 1: the stream (written once), its sum or sum of squares, its largest
            cols = c * BLOCK + tl.arange(0, BLOCK)
            mask = rmask[:, None] & (cols < D)[None, :]
            s = _stream(X, R, S, rx, rr, rs, cols, mask, HAS_R, STORE_S, RNE)
            amax = tl.maximum(amax, tl.abs(s))
            if IS_LAYER:
                acc += s
            else:
                acc += s * s
        tl.debug_barrier()  # the stream written, before any thread reads it back
        sc = _row_scale(tl.max(amax, axis=1))  # rows of huge values scaled (1 for every other)
        mean = tl.zeros([ROWS], dtype=tl.float32)
        if IS_LAYER:  # pass 2: the centred sums of the scaled rows, about mean0 = sum / D
            mean = tl.sum(acc, axis=1) / D
            if tl.min(sc) < 1.0:  # rows of huge values: their mean0 again, scaled (the unscaled sum may overflow)
                acc = tl.zeros([ROWS, BLOCK], dtype=tl.float32)
                for c in range(CHUNKS):
                    cols = c * BLOCK + tl.arange(0, BLOCK)
                    mask = rmask[:, None] & (cols < D)[None, :]
                    acc += _stream_again(X, S, rx, rs, cols, mask, STORE_S) * sc[:, None]
                mean = tl.where(sc < 1.0, tl.sum(acc, axis=1) / D, mean)
            acc = tl.zeros([ROWS, BLOCK], dtype=tl.float32)
            acc1 = tl.zeros([ROWS, BLOCK], dtype=tl.float32)
            for c in range(CHUNKS):
                cols = c * BLOCK + tl.arange(0, BLOCK)
                mask = rmask[:, None] & (cols < D)[None, :]
                s = _stream_again(X, S, rx, rs, cols, mask, STORE_S) * sc[:, None]
                xc = tl.where(mask, s - mean[:, None], 0.0)
                acc1 += xc
                acc += xc * xc
            # the corrected two-pass algorithm (Chan, Golub and LeVeque): the mean moved by the mean deviation
            # s1 / D, the sum of squares by s1^2 / D -- exact for a constant row, as the CPU kernels are
            s1 = tl.sum(acc1, axis=1)
            mean += s1 / D
            ss = tl.sum(acc, axis=1) - s1 * (s1 / D)
            ss = tl.where(ss < 0.0, 0.0, ss)
            var = _variance(ss, D)
        else:
            var = tl.sum(acc, axis=1) / D
            if tl.min(sc) < 1.0:  # rows of huge values: their sums of squares again, scaled
                acc = tl.zeros([ROWS, BLOCK], dtype=tl.float32)
                for c in range(CHUNKS):
                    cols = c * BLOCK + tl.arange(0, BLOCK)
                    mask = rmask[:, None] & (cols < D)[None, :]
                    s = _stream_again(X, S, rx, rs, cols, mask, STORE_S) * sc[:, None]
                    acc += s * s
                var = tl.sum(acc, axis=1) / D
        rsc, rstd = _rstd_scaled(var, eps, sc)
        for c in range(CHUNKS):  # pass 3: normalize
            cols = c * BLOCK + tl.arange(0, BLOCK)
            mask = rmask[:, None] & (cols < D)[None, :]
            s = _stream_again(X, S, rx, rs, cols, mask, STORE_S) * sc[:, None]
            _affine((s - mean[:, None]) * rsc[:, None], W, B, Y, ry + cols[None, :], cols, mask, cols < D,
                    weight_offset, HAS_W, HAS_B, CAST_BEFORE_W, SDT, RNE)
        mean = mean / sc
    if STORE_STATS:
        tl.store(RSTD + rows, rstd, mask=rmask)
        if IS_LAYER:
            tl.store(MEAN + rows, mean, mask=rmask)


@triton.jit
def _tile_grad(DY, S, W, rdy, rs, cols, mask, mean, rstd, weight_offset, D, HAS_W: tl.constexpr):
    """(dy, xhat, g = dy * (weight + offset)) of one tile, float32, 0 where masked."""
    dy = _load(DY, rdy + cols[None, :], mask)
    xhat = tl.where(mask, _xhat(_load(S, rs + cols[None, :], mask), mean, rstd), 0.0)
    g = dy
    if HAS_W:
        g = dy * (_load(W, cols, cols < D) + weight_offset)[None, :]
    return dy, xhat, g


@triton.jit
def _store_ds(ds, DRES, DS, DX, rdres, rds, rdx, cols, mask, HAS_DRES: tl.constexpr, STORE_DX: tl.constexpr,
              RNE: tl.constexpr):
    if HAS_DRES:
        ds += _load(DRES, rdres + cols[None, :], mask)
    tl.store(DS + rds + cols[None, :], _to(ds, DS.dtype.element_ty, RNE), mask=mask)
    if STORE_DX:  # x's gradient in x's dtype, from the same float32 value (one rounding each)
        tl.store(DX + rdx + cols[None, :], _to(ds, DX.dtype.element_ty, RNE), mask=mask)


@triton.jit
def add_norm_bwd(DY, DRES, S, MEAN, RSTD, W, DS, DX, DWP, DBP, stride_dy, stride_dres, stride_s, stride_ds,
                 stride_dx, N, D, rows_per_program, weight_offset,
                 IS_LAYER: tl.constexpr, HAS_DRES: tl.constexpr, HAS_W: tl.constexpr, WANT_DW: tl.constexpr,
                 WANT_DB: tl.constexpr, STORE_DX: tl.constexpr, ROWS: tl.constexpr, BLOCK: tl.constexpr,
                 CHUNKS: tl.constexpr, RNE: tl.constexpr):
    pid = tl.program_id(0).to(tl.int64)
    first = pid * rows_per_program  # int64 bounds: row indices (and offsets) in int64
    last = tl.minimum(first + rows_per_program, N)
    DWP += pid * D
    DBP += pid * D
    dw = tl.zeros([BLOCK], dtype=tl.float32)
    dw_carry = tl.zeros([BLOCK], dtype=tl.float32)
    db = tl.zeros([BLOCK], dtype=tl.float32)
    db_carry = tl.zeros([BLOCK], dtype=tl.float32)
    for t in range(first, last, ROWS):
        rows = t + tl.arange(0, ROWS)
        rmask = rows < last
        rstd = tl.load(RSTD + rows, mask=rmask, other=0.0)
        mean = tl.zeros([ROWS], dtype=tl.float32)
        if IS_LAYER:
            mean = tl.load(MEAN + rows, mask=rmask, other=0.0)
        rdy, rs, rds = rows[:, None] * stride_dy, rows[:, None] * stride_s, rows[:, None] * stride_ds
        rdres, rdx = rows[:, None] * stride_dres, rows[:, None] * stride_dx
        if CHUNKS == 1:
            cols = tl.arange(0, BLOCK)
            mask = rmask[:, None] & (cols < D)[None, :]
            dy, xhat, g = _tile_grad(DY, S, W, rdy, rs, cols, mask, mean, rstd, weight_offset, D, HAS_W)
            part = g - xhat * (tl.sum(g * xhat, axis=1) / D)[:, None]
            if IS_LAYER:
                part -= (tl.sum(g, axis=1) / D)[:, None]
            _store_ds(part * rstd[:, None], DRES, DS, DX, rdres, rds, rdx, cols, mask, HAS_DRES, STORE_DX, RNE)
            if WANT_DW:
                dw, dw_carry = _kahan(dw, dw_carry, tl.sum(dy * xhat, axis=0))
            if WANT_DB:
                db, db_carry = _kahan(db, db_carry, tl.sum(dy, axis=0))
        else:
            c1 = tl.zeros([ROWS, BLOCK], dtype=tl.float32)
            c2 = tl.zeros([ROWS, BLOCK], dtype=tl.float32)
            for c in range(CHUNKS):  # pass 1: each row's two means
                cols = c * BLOCK + tl.arange(0, BLOCK)
                mask = rmask[:, None] & (cols < D)[None, :]
                dy, xhat, g = _tile_grad(DY, S, W, rdy, rs, cols, mask, mean, rstd, weight_offset, D, HAS_W)
                c1 += g * xhat
                c2 += g
            m1 = tl.sum(c1, axis=1) / D
            m2 = tl.sum(c2, axis=1) / D
            for c in range(CHUNKS):  # pass 2: the gradient, and this program's partial sums (its own row)
                cols = c * BLOCK + tl.arange(0, BLOCK)
                cmask = cols < D
                mask = rmask[:, None] & cmask[None, :]
                dy, xhat, g = _tile_grad(DY, S, W, rdy, rs, cols, mask, mean, rstd, weight_offset, D, HAS_W)
                part = g - xhat * m1[:, None]
                if IS_LAYER:
                    part -= m2[:, None]
                _store_ds(part * rstd[:, None], DRES, DS, DX, rdres, rds, rdx, cols, mask, HAS_DRES, STORE_DX, RNE)
                if WANT_DW:
                    tl.store(DWP + cols, _load(DWP, cols, cmask) + tl.sum(dy * xhat, axis=0), mask=cmask)
                if WANT_DB:
                    tl.store(DBP + cols, _load(DBP, cols, cmask) + tl.sum(dy, axis=0), mask=cmask)
    if CHUNKS == 1:
        cols = tl.arange(0, BLOCK)
        if WANT_DW:
            tl.store(DWP + cols, dw, mask=cols < D)
        if WANT_DB:
            tl.store(DBP + cols, db, mask=cols < D)


@triton.jit
def reduce_partials(P, OUT, P_ROWS, D, BLOCK: tl.constexpr, ROWS: tl.constexpr):
    """OUT[j] = sum over programs p of P[p, j] in float64, in a fixed order: ROWS rows of partials at a time,
    summed as a tree, the groups added in program order (OUT is float64: the host rounds it once to the
    parameter's dtype). ROWS > 1 loads several rows per step: a short reduction over many programs is
    latency-bound one row at a time."""
    cols = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < D
    acc = tl.zeros([BLOCK], dtype=tl.float64)
    r = tl.arange(0, ROWS)
    ptrs = P + r[:, None].to(tl.int64) * D + cols[None, :]
    for start in range(0, P_ROWS, ROWS):
        m = ((start + r) < P_ROWS)[:, None] & mask[None, :]
        acc += tl.sum(tl.load(ptrs, mask=m, other=0.0).to(tl.float64), axis=0)
        ptrs += ROWS * D  # pointer arithmetic: 64-bit however many programs
    tl.store(OUT + cols, acc, mask=mask)
