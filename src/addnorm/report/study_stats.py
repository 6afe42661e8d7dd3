"""Intervals over seeds: a 95 % percentile bootstrap of a mean, of a difference of means (paired by seed or
not), and the rule by which a report calls a difference.

The bootstrap (Efron & Tibshirani 1993, ch. 13) resamples the n values with replacement and reads the interval
off the distribution of the resampled means: its 2.5th and 97.5th percentiles, taken as the smallest resampled
mean whose cumulative share reaches 2.5 % and 97.5 % (the inverted empirical CDF, no interpolation). Where the
n^n resamples are at most ``RESAMPLES`` (n <= 5: 3125) every one is enumerated with its weight, so the interval
is exact and has no randomness; beyond that, ``RESAMPLES`` resamples are drawn by a generator seeded with
``SEED``, so a report is reproducible.

With 3 seeds the exact interval is the min-max range (the smallest mean has weight 1/27 > 2.5 %): a
bootstrap cannot say more than 3 runs do. Five seeds narrow it.

Failure counts are not bootstrapped: resampling 0/1 outcomes of 3/3 against 0/3 gives the zero-width interval
[1, 1], a "difference" that 3 seeds cannot establish. They are compared with Fisher's exact test (two-sided,
``fisher_exact``), and a difference is called only where p < ``ALPHA``: 3/3 against 0/3 gives p = 0.1 and is not
called; 5/5 against 0/5 gives p = 0.008.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np

from ..harness.statistics import fisher_exact

LEVEL = 0.95
ALPHA = 0.05  # the level at which a failure-count difference is called (Fisher's exact test)
RESAMPLES = 10_000
SEED = 0


@dataclass(frozen=True)
class Interval:
    """A mean and its percentile bootstrap interval; ``low``/``high`` are None for fewer than 2 values."""

    mean: float
    low: float | None
    high: float | None
    n: int  # values (pairs, for a paired difference) it is computed from
    exact: bool  # every resample enumerated (True) or RESAMPLES drawn (False)

    @property
    def has_interval(self) -> bool:
        return self.low is not None


def _resampled_means(values: np.ndarray, resamples: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(means, weights) of the bootstrap distribution of the mean of ``values``: every resample enumerated
    when there are at most ``resamples`` of them, else ``resamples`` draws of equal weight."""
    n = len(values)
    if n ** n <= resamples:
        # enumerate multisets (order does not change a mean): weight = multinomial count / n^n
        means, weights = [], []
        for combo in itertools.combinations_with_replacement(range(n), n):
            counts = np.bincount(combo, minlength=n)
            weights.append(math.factorial(n) / math.prod(math.factorial(c) for c in counts))
            means.append(float(values[list(combo)].mean()))
        w = np.array(weights)
        return np.array(means), w / w.sum()
    idx = rng.integers(0, n, size=(resamples, n))
    return values[idx].mean(axis=1), np.full(resamples, 1.0 / resamples)


def percentile(means: np.ndarray, weights: np.ndarray, q: float) -> float:
    """The smallest value whose cumulative weight reaches q (the inverted CDF; q in (0, 1])."""
    order = np.argsort(means, kind="stable")
    cdf = np.cumsum(weights[order])
    i = int(np.searchsorted(cdf, q - 1e-12))  # a tolerance so that an exact 1/40 reaches 0.025
    return float(means[order][min(i, len(means) - 1)])


def _interval(draws: tuple[np.ndarray, np.ndarray], level: float) -> tuple[float, float]:
    tail = (1.0 - level) / 2.0
    return percentile(*draws, tail), percentile(*draws, 1.0 - tail)


def _check(values, name: str) -> np.ndarray:
    a = np.asarray(values, dtype=np.float64)
    if a.ndim != 1 or len(a) == 0:
        raise ValueError(f"{name}: expected a non-empty list of numbers, got {values!r}")
    if not np.all(np.isfinite(a)):
        raise ValueError(f"{name}: expected finite numbers (leave failed runs out), got {values!r}")
    return a


def bootstrap_mean(values, level: float = LEVEL, resamples: int = RESAMPLES, seed: int = SEED) -> Interval:
    """The mean of ``values`` and its percentile bootstrap interval (None-bounded for a single value)."""
    a = _check(values, "values")
    if len(a) < 2:
        return Interval(float(a.mean()), None, None, len(a), True)
    draws = _resampled_means(a, resamples, np.random.default_rng(seed))
    low, high = _interval(draws, level)
    return Interval(float(a.mean()), low, high, len(a), len(a) ** len(a) <= resamples)


def paired_difference(a, b, level: float = LEVEL, resamples: int = RESAMPLES, seed: int = SEED) -> Interval:
    """mean(a - b) over pairs (the same seed: the same initialisation stream and batch order) and its interval:
    the pairs are resampled together."""
    x, y = _check(a, "a"), _check(b, "b")
    if len(x) != len(y):
        raise ValueError(f"a paired difference needs as many values in a as in b, got {len(x)} and {len(y)}")
    return bootstrap_mean(x - y, level, resamples, seed)


def unpaired_difference(a, b, level: float = LEVEL, resamples: int = RESAMPLES, seed: int = SEED) -> Interval:
    """mean(a) - mean(b) of independent samples and its interval: each side resampled on its own (every
    combination of the two enumerated where their product is at most ``resamples``)."""
    x, y = _check(a, "a"), _check(b, "b")
    diff = float(x.mean() - y.mean())
    if len(x) < 2 or len(y) < 2:
        return Interval(diff, None, None, min(len(x), len(y)), True)
    exact = len(x) ** len(x) * len(y) ** len(y) <= resamples
    if exact:
        (ma, wa), (mb, wb) = _resampled_means(x, resamples, None), _resampled_means(y, resamples, None)
        draws = ((ma[:, None] - mb[None, :]).ravel(), (wa[:, None] * wb[None, :]).ravel())
    else:
        rng = np.random.default_rng(seed)
        draws = (x[rng.integers(0, len(x), (resamples, len(x)))].mean(axis=1)
                 - y[rng.integers(0, len(y), (resamples, len(y)))].mean(axis=1), np.full(resamples, 1.0 / resamples))
    low, high = _interval(draws, level)
    return Interval(diff, low, high, min(len(x), len(y)), exact)


BETTER, WORSE, UNDECIDED = "better", "worse", "not distinguishable"


def call(diff: Interval, lower_is_better: bool = True) -> str:
    """'better' or 'worse' only where the interval of (setting - baseline) excludes 0; otherwise (the interval
    holds 0, or there is none) 'not distinguishable'."""
    if not diff.has_interval:
        return UNDECIDED
    if diff.high < 0:
        return BETTER if lower_is_better else WORSE
    if diff.low > 0:
        return WORSE if lower_is_better else BETTER
    return UNDECIDED



def failure_call(failed_a: int, runs_a: int, failed_b: int, runs_b: int, alpha: float = ALPHA) -> tuple[float, str]:
    """(Fisher's p, the call): 'fails more' / 'fails less' (a against b) only where p < ``alpha``."""
    p = fisher_exact(failed_a, runs_a, failed_b, runs_b)
    if p >= alpha or runs_a == 0 or runs_b == 0:
        return p, UNDECIDED
    return p, "fails more" if failed_a / runs_a > failed_b / runs_b else "fails less"
