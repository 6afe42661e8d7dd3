"""The @triton.jit helpers every family's kernels share: casts that round as the GPU does, float32 loads, the
inverse standard deviation, LayerNorm's centring, a variance that overflows to NaN, compensated summation.

Each family's kernels import them under the short private names their bodies use (``_to``, ``_load``, ...).
Under Triton's interpreter (``RNE``) float32 -> bfloat16 casts truncate; ``cast_rne`` rounds to nearest-even
first, as the GPU's cast does, so interpreted results are the GPU's bit for bit in that respect.
"""

import triton
import triton.language as tl


@triton.jit
def cast_rne(v, dtype: tl.constexpr, RNE: tl.constexpr):
    """v (float32) cast to dtype, rounding to nearest-even (the interpreter truncates to bfloat16)."""
    if RNE and dtype == tl.bfloat16:
        bits = v.to(tl.uint32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        v = tl.where(v != v, v, bits.to(tl.float32, bitcast=True))
    return v.to(dtype)


@triton.jit
def load_f32(P, offs, mask):
    return tl.load(P + offs, mask=mask, other=0.0).to(tl.float32)


@triton.jit
def inv_std(var, eps):
    return (1.0 / tl.sqrt(var.to(tl.float64) + eps)).to(tl.float32)


@triton.jit
def centred(s, mask, D):
    """LayerNorm's mean of rows in registers and the rows centred on it: sum / D, then corrected by the mean of
    the deviations from it (0 but for rounding), so that a constant row gets its value as its mean exactly and
    centres to 0 (as torch's Welford moments do), where the rounded sum / D alone left it a few ulps off."""
    mean = tl.sum(s, axis=1) / D
    mean += tl.sum(tl.where(mask, s - mean[:, None], 0.0), axis=1) / D
    return mean, tl.where(mask, s - mean[:, None], 0.0)


@triton.jit
def variance(ss, D):
    """A sum of squares over D as a variance; an overflowed sum (a row with an inf) is NaN, not inf (which made
    every output 0). Rows of huge finite values do not overflow it: they are scaled first (row_scale)."""
    var = ss / D
    return tl.where(var == float("inf"), float("nan"), var)


@triton.jit
def kahan_add(total, carry, v):
    """total + v with the rounding error carried (compensated summation)."""
    y = v - carry
    t = total + y
    return t, (t - total) - y


@triton.jit
def row_scale(amax):
    """2^-k per row from its largest magnitude, k = max(exponent - 48, 0): 1 for rows up to 2^48 and for rows with an
    inf or NaN (the same bits as unscaled). Values above ~1.8e19 overflow a float32 sum of squares, and near float32's
    largest the sum and x - mean themselves; scaled by a power of two (exactly) a row's largest is below 2^49.
    Normalizing is scale-free but for eps, which rstd_scaled scales with the row."""
    e = (amax.to(tl.int32, bitcast=True) >> 23) & 0xFF
    k = tl.where((e > 127 + 48) & (e < 255), e - (127 + 48), 0)
    return ((127 - k) << 23).to(tl.float32, bitcast=True)


@triton.jit
def rstd_scaled(var, eps, c):
    """(rstd of the row scaled by c, rstd of the row itself), from the scaled row's variance, in float64 as inv_std:
    1 / sqrt(var + eps c^2). Where c < 1 the first is capped at float32's largest: a constant row of huge values
    (variance 0, eps c^2 below float32's range) has xhat = 0 * that = 0. c = 1: inv_std's value twice."""
    c64 = c.to(tl.float64)
    r = 1.0 / tl.sqrt(var.to(tl.float64) + eps * c64 * c64)
    rs = tl.where(c < 1.0, tl.minimum(r, 3.4028234663852886e38), r)
    return rs.to(tl.float32), (r * c64).to(tl.float32)


@triton.jit
def xhat_from_stats(s, mean, rstd):
    """(s - mean) * rstd of a tile from the saved statistics; a row whose rstd is below 2^-96 (a standard deviation
    beyond 2^96: s - mean may overflow float32) scaled by 2^-64 first, exactly. Other rows: the same bits."""
    c = tl.where(rstd < 1.2621774483536189e-29, 5.421010862427522e-20, 1.0)
    return (s * c[:, None] - (mean * c)[:, None]) * (rstd / c)[:, None]
