"""The two norms and the mistakes people make writing them, as float64 formulas, each mistake with its remedy.

``diagnose`` names the mistake whose formula the implementation's outputs match on every input it was given
(the closest one where several do); eps is tried at the implementation's own value, and at the values people
write where it declares none. Outputs are compared at unit scale and zero shift (the checks set them so).
"""

from __future__ import annotations

import numpy as np

from ..reference import oracle

# eps values people write, tried where an implementation declares none (its function hard-codes one)
CONVENTIONAL_EPS = (1e-5, 1e-6, float(np.finfo(np.float32).eps), 1e-8, 1e-12, 1e-3, 1e-4, 0.0)


def reference(kind: str, x, eps: float) -> np.ndarray:
    return oracle.rms_norm(x, None, eps) if kind == "rms" else oracle.layer_norm(x, None, None, eps)


def _over(axes):
    """LayerNorm's and RMSNorm's statistics over the given axes (the wrong ones: batch, sequence)."""
    def layer(x, eps):
        m = x.mean(axes, keepdims=True)
        return (x - m) / np.sqrt(x.var(axes, keepdims=True) + eps)

    def rms(x, eps):
        return x / np.sqrt((x * x).mean(axes, keepdims=True) + eps)

    return layer, rms


_BATCH_LAYER, _BATCH_RMS = _over((0, 1))
_SEQ_LAYER, _SEQ_RMS = _over(-2)
_DIM0_LAYER, _DIM0_RMS = _over(0)
BATCH_NORM = "statistics over the batch, per feature (BatchNorm, not LayerNorm)"
SEQUENCE_AXIS = "statistics over the sequence axis (dim -2), not the features"
BATCH_AXIS = "statistics over the batch axis (dim 0), not the features"
AXIS_FIX = "reduce over the last dim (the features) only: x.mean(-1, keepdim=True)"
RMS_UNDER_LAYER_NAME = "the mean is not subtracted (x / sqrt(mean(x^2) + eps) is an RMSNorm)"


def _ms(x):
    return (x * x).mean(-1, keepdims=True)


# LayerNorm's mistakes: name -> (formula(x, eps), remedy)
LAYER = {
    "unbiased std with eps outside the square root (the tutorial form)": (
        lambda x, e: (x - x.mean(-1, keepdims=True)) / (np.sqrt(x.var(-1, ddof=1, keepdims=True)) + e),
        "use the biased variance and put eps inside the root: "
        "(x - mean) / torch.sqrt(x.var(-1, unbiased=False, keepdim=True) + eps)"),
    "unbiased variance (divides by D-1)": (
        lambda x, e: (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, ddof=1, keepdims=True) + e),
        "use x.var(-1, unbiased=False) (LayerNorm divides by D, not D-1)"),
    "eps added outside the square root": (
        lambda x, e: (x - x.mean(-1, keepdims=True)) / (np.sqrt(x.var(-1, keepdims=True)) + e),
        "put eps inside the square root: / sqrt(var + eps)"),
    "no eps at all": (
        lambda x, e: (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True)),
        "add eps inside the square root: / sqrt(var + eps)"),
    RMS_UNDER_LAYER_NAME: (
        lambda x, e: x / np.sqrt(_ms(x) + e),
        "subtract the mean before dividing: (x - mean) / sqrt(var + eps)"),
    "the mean is not subtracted": (
        lambda x, e: x / np.sqrt(x.var(-1, keepdims=True) + e),
        "subtract the mean before dividing: (x - mean) / sqrt(var + eps)"),
    BATCH_NORM: (_BATCH_LAYER, AXIS_FIX),
    SEQUENCE_AXIS: (_SEQ_LAYER, AXIS_FIX),
    BATCH_AXIS: (_DIM0_LAYER, AXIS_FIX),
}

# RMSNorm's
RMS = {
    "no square root (divides by the mean square)": (
        lambda x, e: x / (_ms(x) + e), "divide by the root: x / sqrt(mean(x^2) + eps)"),
    "the sum of squares instead of their mean": (
        lambda x, e: x / np.sqrt((x * x).sum(-1, keepdims=True) + e),
        "take the mean of the squares: x.pow(2).mean(-1, keepdim=True)"),
    "eps added outside the square root": (
        lambda x, e: x / (np.sqrt(_ms(x)) + e), "put eps inside the square root: / sqrt(mean(x^2) + eps)"),
    "no eps at all": (lambda x, e: x / np.sqrt(_ms(x)), "add eps inside the square root: / sqrt(mean(x^2) + eps)"),
    "the mean is subtracted (a LayerNorm, not an RMSNorm)": (
        lambda x, e: (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + e),
        "RMSNorm does not center: x / sqrt(mean(x^2) + eps)"),
    BATCH_NORM: (_BATCH_RMS, AXIS_FIX),
    SEQUENCE_AXIS: (_SEQ_RMS, AXIS_FIX),
    BATCH_AXIS: (_DIM0_RMS, AXIS_FIX),
}

MISTAKES = {"layer": LAYER, "rms": RMS}


def _err(y, want) -> float:
    with np.errstate(invalid="ignore"):
        e = np.abs(y - want).max() / max(1.0, np.abs(want).max())
    return float(e) if np.isfinite(e) else np.inf


def matches(pairs, formula, eps, tol=1e-4) -> bool:
    """Does formula(x, eps) give y on every (y, x) pair?"""
    return all(_err(y, formula(x, eps)) < tol for y, x in pairs)


def fit_eps(kind: str, pairs_at, eps_values) -> float | None:
    """The first eps at which the correct formula gives the implementation's outputs; ``pairs_at(eps)`` gives the
    (y, x) pairs to compare on, rows of small variance included (where eps shows)."""
    for eps in eps_values:
        if matches(pairs_at(eps), lambda x, e: reference(kind, x, e), eps):
            return eps
    return None


def diagnose(kind: str, pairs, eps_values) -> tuple[str, str]:
    """(mistake, remedy) whose formula every (y, x) pair matches at one of the eps values, the closest one where
    several do; ("", "") if none."""
    best, best_err = ("", ""), np.inf
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        for name, (formula, fix) in MISTAKES[kind].items():
            for eps in eps_values:
                err = max(_err(y, formula(x, eps)) for y, x in pairs)
                if err < 1e-4 and err < best_err:
                    best, best_err = (name, fix), err
    return best
