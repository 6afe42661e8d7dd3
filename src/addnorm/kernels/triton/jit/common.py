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
    """A sum of squares over D as a variance; an overflowed sum (finite inputs) is NaN, as torch's is, not inf
    (which made every output 0)."""
    var = ss / D
    return tl.where(var == float("inf"), float("nan"), var)


@triton.jit
def kahan_add(total, carry, v):
    """total + v with the rounding error carried (compensated summation)."""
    y = v - carry
    t = total + y
    return t, (t - total) - y
