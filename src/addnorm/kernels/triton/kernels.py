"""The Triton kernels of fused Add & Norm: forward, backward, and the weight-gradient reduction.

Same semantics as the CPU kernels and ``addnorm.ops.formulas``, row by row:

    s = round_sdt(x + residual)           the stream, in its own dtype (stored when it is returned)
    mean = sum(s) / D;  var = sum((s - mean)^2) / D      LayerNorm (two passes, as the formulas)
    var = sum(s^2) / D                                    RMSNorm
    rstd = 1 / sqrt(var + eps)            in float64, rounded once to float32
    y = xhat * (weight + weight_offset) + bias            in float32, rounded once to y's dtype
                                          (cast_before_weight: xhat rounded to y's dtype first)

Backward recomputes xhat from s and the saved statistics; each program takes a block of rows and keeps
float32 partial sums of dy * xhat and dy, one row of partials per program, which ``reduce_partials``
sums column by column in float64 in program order: the weight gradient is deterministic.

A row that fits in one block (``CHUNKS == 1``) is held in registers; a longer one is walked in chunks of
BLOCK: the forward's first pass writes the stream, the later ones read it back (so ``residual_out=residual``
in place stays right), the backward reads its inputs twice.

Under Triton's interpreter (``RNE``) float32 -> bfloat16 casts truncate; ``_to`` rounds to nearest-even
first, as the GPU's cast does, so interpreted results are the GPU's bit for bit in that respect.
"""

import triton
import triton.language as tl


@triton.jit
def _to(v, dtype: tl.constexpr, RNE: tl.constexpr):
    """v (float32) cast to dtype, rounding to nearest-even (the interpreter truncates to bfloat16)."""
    if RNE and dtype == tl.bfloat16:
        bits = v.to(tl.uint32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        v = tl.where(v != v, v, bits.to(tl.float32, bitcast=True))
    return v.to(dtype)


@triton.jit
def _stream(X, R, S, cols, mask, HAS_R: tl.constexpr, STORE_S: tl.constexpr, RNE: tl.constexpr):
    """The row's stream s in float32 (0 where masked): x + residual rounded to the stream's dtype, and
    written to S when it is returned."""
    s = tl.load(X + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_R:
        s += tl.load(R + cols, mask=mask, other=0.0).to(tl.float32)
    if STORE_S:
        sr = _to(s, S.dtype.element_ty, RNE)
        tl.store(S + cols, sr, mask=mask)
        s = sr.to(tl.float32)
    return s


@triton.jit
def _stream_again(X, S, cols, mask, STORE_S: tl.constexpr):
    """The stream of a chunk already passed: read back from S where it was written (the residual may be
    S itself, updated in place), else x."""
    if STORE_S:
        return tl.load(S + cols, mask=mask, other=0.0).to(tl.float32)
    return tl.load(X + cols, mask=mask, other=0.0).to(tl.float32)


@triton.jit
def _rstd(var, eps):
    return (1.0 / tl.sqrt(var.to(tl.float64) + eps)).to(tl.float32)


@triton.jit
def _affine(xhat, W, B, Y, cols, mask, weight_offset, HAS_W: tl.constexpr, HAS_B: tl.constexpr,
            CAST_BEFORE_W: tl.constexpr, RNE: tl.constexpr):
    """y = xhat * (weight + offset) + bias, stored in Y's dtype."""
    y = xhat
    if CAST_BEFORE_W:  # Llama's order: the normalized row in the output dtype, then the weight
        y = _to(y, Y.dtype.element_ty, RNE).to(tl.float32)
    if HAS_W:
        y = y * (tl.load(W + cols, mask=mask, other=0.0).to(tl.float32) + weight_offset)
    if HAS_B:
        y = y + tl.load(B + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(Y + cols, _to(y, Y.dtype.element_ty, RNE), mask=mask)


@triton.jit
def add_norm_fwd(X, R, W, B, Y, S, MEAN, RSTD, stride_x, stride_r, stride_y, stride_s, D, eps, weight_offset,
                 IS_LAYER: tl.constexpr, HAS_R: tl.constexpr, HAS_W: tl.constexpr, HAS_B: tl.constexpr,
                 STORE_S: tl.constexpr, STORE_STATS: tl.constexpr, CAST_BEFORE_W: tl.constexpr,
                 BLOCK: tl.constexpr, CHUNKS: tl.constexpr, RNE: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)  # int64 offsets: rows * stride may pass 2**31
    X += row * stride_x
    Y += row * stride_y
    if HAS_R:
        R += row * stride_r
    if STORE_S:
        S += row * stride_s
    cols = tl.arange(0, BLOCK)
    if CHUNKS == 1:
        mask = cols < D
        s = _stream(X, R, S, cols, mask, HAS_R, STORE_S, RNE)
        if IS_LAYER:
            mean = tl.sum(s, axis=0) / D
            xc = tl.where(mask, s - mean, 0.0)
        else:
            mean = 0.0
            xc = s
        rstd = _rstd(tl.sum(xc * xc, axis=0) / D, eps)
        _affine(xc * rstd, W, B, Y, cols, mask, weight_offset, HAS_W, HAS_B, CAST_BEFORE_W, RNE)
    else:
        acc = tl.zeros([BLOCK], dtype=tl.float32)
        for c in range(CHUNKS):  # pass 1: the stream (written once), and its sum or sum of squares
            offs = c * BLOCK + cols
            mask = offs < D
            s = _stream(X, R, S, offs, mask, HAS_R, STORE_S, RNE)
            if IS_LAYER:
                acc += s
            else:
                acc += s * s
        tl.debug_barrier()  # the stream written, before any thread reads it back
        mean = 0.0
        if IS_LAYER:  # pass 2: the centred sum of squares
            mean = tl.sum(acc, axis=0) / D
            acc = tl.zeros([BLOCK], dtype=tl.float32)
            for c in range(CHUNKS):
                offs = c * BLOCK + cols
                mask = offs < D
                xc = tl.where(mask, _stream_again(X, S, offs, mask, STORE_S) - mean, 0.0)
                acc += xc * xc
        rstd = _rstd(tl.sum(acc, axis=0) / D, eps)
        for c in range(CHUNKS):  # pass 3: normalize
            offs = c * BLOCK + cols
            mask = offs < D
            s = _stream_again(X, S, offs, mask, STORE_S)
            _affine((s - mean) * rstd, W, B, Y, offs, mask, weight_offset, HAS_W, HAS_B, CAST_BEFORE_W, RNE)
    if STORE_STATS:
        tl.store(RSTD + row, rstd)
        if IS_LAYER:
            tl.store(MEAN + row, mean)


@triton.jit
def _row_grad(DY, S, W, DRES, cols, mask, mean, rstd, weight_offset, HAS_W: tl.constexpr, HAS_DRES: tl.constexpr):
    """(dy, xhat, g = dy * (weight + offset)) of one block of a row, float32, 0 where masked."""
    dy = tl.load(DY + cols, mask=mask, other=0.0).to(tl.float32)
    xhat = tl.where(mask, (tl.load(S + cols, mask=mask, other=0.0).to(tl.float32) - mean) * rstd, 0.0)
    g = dy
    if HAS_W:
        g = dy * (tl.load(W + cols, mask=mask, other=0.0).to(tl.float32) + weight_offset)
    return dy, xhat, g


@triton.jit
def _store_ds(ds, DRES, DS, DX, cols, mask, HAS_DRES: tl.constexpr, STORE_DX: tl.constexpr, RNE: tl.constexpr):
    if HAS_DRES:
        ds += tl.load(DRES + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(DS + cols, _to(ds, DS.dtype.element_ty, RNE), mask=mask)
    if STORE_DX:  # x's gradient in x's dtype, from the same float32 value (one rounding each)
        tl.store(DX + cols, _to(ds, DX.dtype.element_ty, RNE), mask=mask)


@triton.jit
def add_norm_bwd(DY, DRES, S, MEAN, RSTD, W, DS, DX, DWP, DBP, stride_dy, stride_dres, stride_s, stride_ds,
                 stride_dx, N, D, rows_per_program, weight_offset,
                 IS_LAYER: tl.constexpr, HAS_DRES: tl.constexpr, HAS_W: tl.constexpr, WANT_DW: tl.constexpr,
                 WANT_DB: tl.constexpr, STORE_DX: tl.constexpr, BLOCK: tl.constexpr, CHUNKS: tl.constexpr,
                 RNE: tl.constexpr):
    pid = tl.program_id(0)
    first = pid.to(tl.int64) * rows_per_program  # int64 bounds: the row index (and offsets) in int64
    last = tl.minimum(first + rows_per_program, N)
    cols = tl.arange(0, BLOCK)
    DWP += pid.to(tl.int64) * D
    DBP += pid.to(tl.int64) * D
    dw = tl.zeros([BLOCK], dtype=tl.float32)
    db = tl.zeros([BLOCK], dtype=tl.float32)
    for r in range(first, last):
        dy_row, s_row, ds_row = DY + r * stride_dy, S + r * stride_s, DS + r * stride_ds
        dres_row, dx_row = DRES + r * stride_dres, DX + r * stride_dx
        rstd = tl.load(RSTD + r)
        mean = 0.0
        if IS_LAYER:
            mean = tl.load(MEAN + r)
        if CHUNKS == 1:
            mask = cols < D
            dy, xhat, g = _row_grad(dy_row, s_row, W, dres_row, cols, mask, mean, rstd, weight_offset, HAS_W,
                                    HAS_DRES)
            part = g - xhat * (tl.sum(g * xhat, axis=0) / D)
            if IS_LAYER:
                part -= tl.sum(g, axis=0) / D
            _store_ds(part * rstd, dres_row, ds_row, dx_row, cols, mask, HAS_DRES, STORE_DX, RNE)
            if WANT_DW:
                dw += dy * xhat
            if WANT_DB:
                db += dy
        else:
            c1 = tl.zeros([BLOCK], dtype=tl.float32)
            c2 = tl.zeros([BLOCK], dtype=tl.float32)
            for c in range(CHUNKS):  # pass 1: the row's two means
                offs = c * BLOCK + cols
                mask = offs < D
                dy, xhat, g = _row_grad(dy_row, s_row, W, dres_row, offs, mask, mean, rstd, weight_offset, HAS_W,
                                        HAS_DRES)
                c1 += g * xhat
                c2 += g
            m1 = tl.sum(c1, axis=0) / D
            m2 = tl.sum(c2, axis=0) / D
            for c in range(CHUNKS):  # pass 2: the gradient, and this program's partial sums (its own row)
                offs = c * BLOCK + cols
                mask = offs < D
                dy, xhat, g = _row_grad(dy_row, s_row, W, dres_row, offs, mask, mean, rstd, weight_offset, HAS_W,
                                        HAS_DRES)
                part = g - xhat * m1
                if IS_LAYER:
                    part -= m2
                _store_ds(part * rstd, dres_row, ds_row, dx_row, offs, mask, HAS_DRES, STORE_DX, RNE)
                if WANT_DW:
                    tl.store(DWP + offs, tl.load(DWP + offs, mask=mask, other=0.0) + dy * xhat, mask=mask)
                if WANT_DB:
                    tl.store(DBP + offs, tl.load(DBP + offs, mask=mask, other=0.0) + dy, mask=mask)
    if CHUNKS == 1:
        mask = cols < D
        if WANT_DW:
            tl.store(DWP + cols, dw, mask=mask)
        if WANT_DB:
            tl.store(DBP + cols, db, mask=mask)


@triton.jit
def reduce_partials(P, OUT, P_ROWS, D, BLOCK: tl.constexpr):
    """OUT[j] = sum over programs p, in order, of P[p, j], in float64 (OUT is float64: the host rounds it
    once to the parameter's dtype)."""
    cols = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < D
    acc = tl.zeros([BLOCK], dtype=tl.float64)
    ptrs = P + cols
    for _ in range(P_ROWS):
        acc += tl.load(ptrs, mask=mask, other=0.0).to(tl.float64)
        ptrs += D  # pointer arithmetic: 64-bit however many programs
    tl.store(OUT + cols, acc, mask=mask)
