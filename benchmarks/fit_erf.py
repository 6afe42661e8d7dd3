"""Derive the two polynomials of the CPU kernels' erf (``erf_v`` in ``src/addnorm/kernels/cpu/pointwise_rows.h``)
and measure the error of evaluating them in float32 as the kernels do.

    |u| < 1:   erf(u) = a + a S(a^2), a = |u|     S: degree 6, minimizing the relative error of erf
    |u| >= 1:  erf(u) = B(min(a, 3.92) - 2.46)    B: degree 14, minimizing the absolute error on [1, 3.92]

Each fit is a weighted least-squares fit on Chebyshev points, its weights updated by Lawson's rule (w <- w |r|)
until the largest residual stops falling: a linear minimax approximation without a Remez exchange. The
coefficients are then rounded to float32 and the polynomials evaluated in float32 with every product and sum
rounded separately, as the baseline build does (the AVX2 and AVX-512 builds fuse each step into one FMA, which
rounds once: tests/kernels/test_erf_ulp.py measures both), over a dense grid and the small numbers, against
math.erf. Run: ``python benchmarks/fit_erf.py`` (a few seconds; NumPy only).
"""

from __future__ import annotations

import math

import numpy as np

SPLIT, TOP, MID = 1.0, 3.92, 2.46
f32 = np.float32
erf = np.vectorize(math.erf, otypes=[np.float64])


def chebyshev_points(lo: float, hi: float, n: int = 6000) -> np.ndarray:
    return (lo + hi) / 2 + (hi - lo) / 2 * np.cos(np.pi * (np.arange(n) + 0.5) / n)


def lawson(t: np.ndarray, y: np.ndarray, scale: np.ndarray, degree: int, iters: int = 300) -> tuple[float, np.ndarray]:
    """Coefficients (lowest first) of the polynomial in t minimizing max |scale * (p(t) - y)|, and that max."""
    V = t[:, None] ** np.arange(degree + 1)
    w = np.full(len(t), 1.0 / len(t))
    best = (math.inf, None)
    for _ in range(iters):
        sw = np.sqrt(w) * scale
        c, *_ = np.linalg.lstsq(V * sw[:, None], y * sw, rcond=None)
        r = np.abs((V @ c - y) * scale)
        if r.max() < best[0]:
            best = (float(r.max()), c)
        w = w * r
        w /= w.sum()
    return best


def horner32(coef: np.ndarray, t: np.ndarray) -> np.ndarray:
    acc = np.full(t.shape, f32(coef[-1]))
    for c in coef[-2::-1]:
        acc = (acc * t).astype(f32) + f32(c)
    return acc


def evaluate(u: np.ndarray, s_coef: np.ndarray, b_coef: np.ndarray) -> np.ndarray:
    """The kernel's erf_v in float32, operation by operation, as the baseline build (no FMA) runs it."""
    a = np.abs(u).astype(f32)
    small = (a * horner32(s_coef, (u * u).astype(f32))).astype(f32) + a
    b = np.minimum(horner32(b_coef, (np.minimum(a, f32(TOP)) - f32(MID)).astype(f32)), f32(1))
    return np.copysign(np.where(a < f32(SPLIT), small, b), u).astype(f32)


def main() -> None:
    x = chebyshev_points(0.0, SPLIT)
    g = erf(x) / x
    err_s, s_coef = lawson(x * x, g - 1, 1 / g, 6)
    t = chebyshev_points(SPLIT, TOP)
    err_b, b_coef = lawson(t - MID, erf(t), np.ones_like(t), 14)
    s32, b32 = s_coef.astype(f32), b_coef.astype(f32)
    print(f"S (degree 6, relative error {err_s:.2e}):", ", ".join(f"{c:.9e}f" for c in s32))
    print(f"B (degree 14 in u - {MID}, absolute error {err_b:.2e}):", ", ".join(f"{c:.9e}f" for c in b32))
    rng = np.random.default_rng(0)
    u = np.concatenate([np.linspace(-4.5, 4.5, 4_000_001),
                        np.exp(rng.uniform(math.log(1e-38), math.log(4.5), 400_000))]).astype(f32)
    ref = erf(u.astype(np.float64))
    ulp = np.spacing(np.abs(ref).astype(f32)).astype(np.float64)
    e = np.abs(evaluate(u, s32, b32).astype(np.float64) - ref) / ulp
    print(f"float32 evaluation: max {e.max():.2f} ulp (at u = {u[e.argmax()]:.7g}), mean {e.mean():.3f} ulp")


if __name__ == "__main__":
    main()
