"""Derive the rational tanh and erf of the CPU kernels' bfloat16 loops (``tanh_bf`` / ``erf_bf`` in
``src/addnorm/kernels/cpu/pointwise_rows.h``) and measure the error of evaluating them in float32.

    f(u) = sign(u) min(a P(z) / Q(z), 1),  a = min(|u|, top),  z = a^2,  Q(0) = 1
    tanh: P, Q of degree 4 in z, top = 9.0195 (tanh rounds to 1 in float from 9.011)
    erf:  P, Q of degree 5 in z, top = 3.92   (erf rounds to 1 from 3.918)

Each is a linearized rational fit of g(z) = f(a) / a (Loeb's iteration: P - g Q = 0 weighted by 1 / (g Q) of
the previous step, so that the residual is the relative error), its weights updated by Lawson's rule (w <- w
|r|) toward the minimax relative error, on Chebyshev points in a, with z scaled to [0, 1] while fitting. Then
the coefficients are rounded to float32 and the function evaluated in float32 with every product and sum
rounded separately (as the baseline build runs it; the AVX2 and AVX-512 builds fuse each Horner step), over
a dense grid and numbers spread log-uniformly from 1e-38, against math.tanh / math.erf.
Run: ``python benchmarks/fit_pointwise_rational.py`` (a few seconds; NumPy only).
"""

from __future__ import annotations

import math

import numpy as np

from fit_erf import chebyshev_points, horner32

f32 = np.float32
FORMS = {"tanh": (math.tanh, 9.01953125, 4, 4), "erf": (math.erf, 3.92, 5, 5)}


def fit_rational(z: np.ndarray, g: np.ndarray, m: int, n: int, iters: int = 400):
    """(max relative error, P lowest first, Q lowest first with Q[0] = 1) of P / Q ~ g on the points z."""
    vp, vq = z[:, None] ** np.arange(m + 1), z[:, None] ** np.arange(1, n + 1)
    w, q_prev = np.full(len(z), 1.0 / len(z)), np.ones(len(z))
    best = (math.inf, None, None)
    for _ in range(iters):
        s = np.sqrt(w) / (np.abs(g) * np.abs(q_prev))
        c, *_ = np.linalg.lstsq(np.hstack([vp, -g[:, None] * vq]) * s[:, None], g * s, rcond=None)
        p, q = c[:m + 1], np.concatenate([[1.0], c[m + 1:]])
        pz, qz = np.polyval(p[::-1], z), np.polyval(q[::-1], z)
        r = np.abs(pz / qz - g) / np.abs(g)
        if r.max() < best[0] and np.all(qz > 0):
            best = (float(r.max()), p, q)
        q_prev = qz
        w = w * r
        w /= w.sum()
    return best


def evaluate(u: np.ndarray, p: np.ndarray, q: np.ndarray, top: float) -> np.ndarray:
    """The kernels' rational_odd in float32, operation by operation, as the baseline build (no FMA) runs it."""
    a = np.minimum(np.abs(u), f32(top)).astype(f32)
    z = (a * a).astype(f32)
    r = np.minimum(((a * horner32(p, z)).astype(f32) / horner32(q, z)).astype(f32), f32(1))
    return np.copysign(r, u).astype(f32)


def main() -> None:
    rng = np.random.default_rng(0)
    for name, (fn, top, m, n) in FORMS.items():
        a = chebyshev_points(0.0, top, 12000)
        g = np.vectorize(fn, otypes=[np.float64])(a) / a
        err, p, q = fit_rational(a * a / top ** 2, g, m, n)
        p, q = p / top ** (2 * np.arange(m + 1)), q / top ** (2 * np.arange(n + 1))
        p32, q32 = p.astype(f32), q.astype(f32)
        print(f"{name}: relative error of the fit {err:.2e}")
        print("  P:", ", ".join(f"{c:.9e}f" for c in p32))
        print("  Q:", ", ".join(f"{c:.9e}f" for c in q32))
        u = np.concatenate([np.linspace(-top - 0.5, top + 0.5, 4_000_001),
                            np.exp(rng.uniform(math.log(1e-38), math.log(top), 400_000))]).astype(f32)
        ref = np.vectorize(fn, otypes=[np.float64])(u.astype(np.float64))
        ulp = np.spacing(np.abs(ref).astype(f32)).astype(np.float64)
        e = np.abs(evaluate(u, p32, q32, top).astype(np.float64) - ref) / ulp
        print(f"  float32 evaluation: max {e.max():.2f} ulp (at u = {u[e.argmax()]:.7g}), mean {e.mean():.3f} ulp")


if __name__ == "__main__":
    main()
