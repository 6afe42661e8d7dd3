"""The tests behind the claims file: a paired-t interval, the exact paired sign-flip permutation test, Fisher's
exact test, Holm's step-down correction, the minimum detectable effect, and the verdict rule.

Every function is pure and computes in float64 (or exact integers). A claim compares an arm with its baseline
run for run, paired by seed (the same seed: the same initialisation stream and the same batch order), so the
loss claims are tests on the n paired differences d_i = arm_i - baseline_i.

- The interval is the paired-t 95 % interval  mean(d) +- t_{0.975, n-1} * s / sqrt(n),  s the sample standard
  deviation of d (ddof 1).
- The p-value is the exact sign-flip permutation test: under "the arm makes no difference" each d_i is as likely
  to be -d_i, so the 2^n sign vectors are equally likely and  p = #{s : |sum s_i d_i| >= |sum d_i|} / 2^n,  the
  observed vector counted (so p >= 2 / 2^n: with n = 3 seeds no difference can reach p < 0.25, with n = 5 none
  reaches 0.05). It assumes no normality, which three to five seeds cannot check.
- Failure-rate claims use Fisher's exact test (two-sided), which holds with the margins fixed.
- Holm's step-down correction controls the family-wise error of the whole claims file.
- The minimum detectable effect (mde) is the paired-t test's, at 80 % power and alpha 0.05.
- ``verdict``: ``supported`` or ``contradicted`` only where the Holm-adjusted p < 0.05 and the effect lies in
  the claim's direction (or against it); otherwise ``inconclusive``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import optimize, stats

ALPHA = 0.05
POWER = 0.80
LEVEL = 0.95
EXACT_MAX_N = 20  # the sign-flip test enumerates every sign vector up to here (2^20 sums, 8 MiB)
RESAMPLES = 200_000  # random sign vectors beyond EXACT_MAX_N
SEED = 0
SUPPORTED, CONTRADICTED, INCONCLUSIVE = "supported", "contradicted", "inconclusive"
LOWER, HIGHER = "lower", "higher"  # a claim's direction: the arm's value is lower (higher) than the baseline's
SAME = "same"  # a claim that the arm makes no difference: a difference test can contradict it, never support it


def _values(x, name: str) -> np.ndarray:
    a = np.asarray(x, dtype=np.float64)
    if a.ndim != 1 or len(a) == 0:
        raise ValueError(f"{name}: expected a non-empty 1-d list of numbers, got {x!r}")
    if not np.all(np.isfinite(a)):
        raise ValueError(f"{name}: expected finite numbers (a failed run has no loss; leave it out of both arms), "
                         f"got {x!r}")
    return a


def differences(arm, baseline) -> np.ndarray:
    """d_i = arm_i - baseline_i, pair by pair (both lists ordered by seed)."""
    a, b = _values(arm, "arm"), _values(baseline, "baseline")
    if len(a) != len(b):
        raise ValueError(f"arm and baseline: a paired test needs as many values in each, got {len(a)} and {len(b)}")
    return a - b


@dataclass(frozen=True)
class PairedInterval:
    """mean(d), the sample standard deviation s (ddof 1; None for one pair), n, and the interval (None below 2)."""

    mean: float
    sd: float | None
    n: int
    low: float | None
    high: float | None


def paired_t_interval(d, level: float = LEVEL) -> PairedInterval:
    """mean(d) +- t_{(1+level)/2, n-1} * s / sqrt(n): the paired-t interval of a mean difference.

    With n = 5 and s = sqrt(2.5) the half-width is 2.776 * 0.7071 = 1.963. Identical differences (s = 0) give a
    zero-width interval; one pair gives none."""
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level!r}")
    d = _values(d, "d")
    n, mean = len(d), float(d.mean())
    if n < 2:
        return PairedInterval(mean, None, n, None, None)
    sd = float(d.std(ddof=1))
    half = float(stats.t.ppf((1 + level) / 2, n - 1)) * sd / math.sqrt(n)
    return PairedInterval(mean, sd, n, mean - half, mean + half)


def sign_flip_p(d, max_exact: int = EXACT_MAX_N, resamples: int = RESAMPLES, seed: int = SEED) -> float:
    """The two-sided paired sign-flip permutation p-value of mean(d) = 0.

    n <= ``max_exact``: exact, every one of the 2^n sign vectors s enumerated,
        p = #{s : |sum_i s_i d_i| >= |sum_i d_i|} / 2^n   (the observed vector is one of them, so p >= 2^(1-n)).
    n > ``max_exact``: a Monte Carlo estimate from ``resamples`` random sign vectors drawn by a generator seeded with
        ``seed`` (reproducible), counting the observed one as in Phipson & Smyth (2010):
        p = (1 + #{draws at least as extreme}) / (1 + resamples), never 0.
    Sums equal to the observed one up to rounding (a relative 1e-9 of sum |d_i|) count as at least as extreme."""
    d = _values(d, "d")
    observed = abs(float(d.sum()))
    tol = 1e-9 * float(np.abs(d).sum())
    if len(d) <= max_exact:
        sums = np.zeros(1)
        for x in d:  # every signed sum: each value adds +x or -x to every sum so far (2^n of them at the end)
            sums = np.concatenate((sums + x, sums - x))
        return float(np.count_nonzero(np.abs(sums) >= observed - tol)) / len(sums)
    rng = np.random.default_rng(seed)
    hits = 0
    for start in range(0, resamples, 10_000):  # in chunks: 10,000 x n signs at a time
        k = min(10_000, resamples - start)
        signs = rng.integers(0, 2, size=(k, len(d))) * 2.0 - 1.0
        hits += int(np.count_nonzero(np.abs(signs @ d) >= observed - tol))
    return (1 + hits) / (1 + resamples)


def min_sign_flip_p(n: int) -> float:
    """The smallest p the exact two-sided sign-flip test can give with n pairs: 2 / 2^n (every d_i of one sign);
    no claim tested on n pairs can be decided at a level below it."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be an integer >= 1, got {n!r}")
    return min(1.0, 2.0 / 2 ** n)


def pairs_to_reach(level: float) -> int:
    """The fewest pairs with which the exact sign-flip test can give p < ``level`` at all (every difference of one
    sign): the least n with 2 / 2^n < level. 6 for 0.05; under Holm's correction over m tests the first rejection
    needs p < 0.05 / m, so 31 tests need 11 pairs."""
    if not 0 < level <= 1:
        raise ValueError(f"level must be in (0, 1], got {level!r}")
    n = 1
    while min_sign_flip_p(n) >= level:
        n += 1
    return n


def fisher_exact(failed_a: int, runs_a: int, failed_b: int, runs_b: int) -> float:
    """Fisher's exact test, two-sided, of the 2x2 table (failed, trained) x (a, b).

    With the margins fixed, the number of a's failures is hypergeometric: P(x) = C(runs_a, x) C(runs_b, f - x) /
    C(runs_a + runs_b, f), f = failed_a + failed_b. p is the sum of P(x) over every x with P(x) <= P(failed_a)
    (a relative 1e-9 so that tables exactly as likely count). 3/3 against 0/3: f = 3 of 6, P(3) = P(0) = 1/20, the
    other tables are likelier, p = 2/20 = 0.1."""
    for name, k, n in (("failed_a", failed_a, runs_a), ("failed_b", failed_b, runs_b)):
        if isinstance(k, bool) or isinstance(n, bool) or not isinstance(k, int) or not isinstance(n, int) \
                or not 0 <= k <= n:
            raise ValueError(f"{name}: a failure count must be an integer in [0, runs], got {k!r} of {n!r}")
    failed, total = failed_a + failed_b, runs_a + runs_b
    if total == 0:
        return 1.0
    ways = [math.comb(runs_a, x) * math.comb(runs_b, failed - x)
            for x in range(max(0, failed - runs_b), min(runs_a, failed) + 1)]
    seen = math.comb(runs_a, failed_a) * math.comb(runs_b, failed_b)
    return min(1.0, sum(w for w in ways if w <= seen * (1 + 1e-9)) / math.comb(total, failed))


def wilson_interval(k: int, n: int, level: float = LEVEL) -> tuple[float, float]:
    """Wilson's score interval of a proportion k/n: (p + z^2/2n -+ z sqrt(p(1-p)/n + z^2/4n^2)) / (1 + z^2/n),
    z = Phi^-1((1+level)/2). Unlike p -+ z sqrt(p(1-p)/n) it is not empty at 0/n: 0/3 gives [0, z^2/(3 + z^2)]
    = [0, 0.5615]."""
    if isinstance(k, bool) or not isinstance(k, int) or isinstance(n, bool) or not isinstance(n, int) \
            or n < 1 or not 0 <= k <= n:
        raise ValueError(f"k of n: expected integers with 0 <= k <= n and n >= 1, got {k!r} of {n!r}")
    z = float(stats.norm.ppf((1 + level) / 2))
    p, z2 = k / n, z * z
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    # at k = 0 (k = n) the bound is 0 (1) exactly; the formula leaves rounding there
    return (0.0 if k == 0 else centre - half), (1.0 if k == n else centre + half)


def rate_difference_interval(failed_a: int, runs_a: int, failed_b: int, runs_b: int,
                             level: float = LEVEL) -> tuple[float, float]:
    """Newcombe's (1998, method 10) interval of the difference of two rates d = k_a/n_a - k_b/n_b, from the Wilson
    intervals [l_a, u_a] and [l_b, u_b] of each: [d - sqrt((p_a - l_a)^2 + (u_b - p_b)^2),
    d + sqrt((u_a - p_a)^2 + (p_b - l_b)^2)]. It is a score interval, not the inversion of Fisher's test: the two
    can disagree at a few runs (3/3 against 0/3 gives [0.21, 1] while Fisher's p = 0.1), and the verdict follows
    the test."""
    la, ua = wilson_interval(failed_a, runs_a, level)
    lb, ub = wilson_interval(failed_b, runs_b, level)
    pa, pb = failed_a / runs_a, failed_b / runs_b
    d = pa - pb
    return d - math.sqrt((pa - la) ** 2 + (ub - pb) ** 2), d + math.sqrt((ua - pa) ** 2 + (pb - lb) ** 2)


def holm(p_values) -> list[float]:
    """Holm's (1979) step-down adjusted p-values, in the order given.

    Sort the m p-values ascending, p_(1) <= ... <= p_(m); the adjusted value of the i-th is
    max_{j <= i} min(1, (m - j + 1) p_(j)): monotone in the sorted order and capped at 1. Rejecting where the
    adjusted value is below alpha controls the family-wise error rate at alpha, under any dependence."""
    p = np.asarray(p_values, dtype=np.float64)
    if p.ndim != 1:
        raise ValueError(f"p_values: expected a 1-d list, got shape {p.shape}")
    if np.any(~np.isfinite(p)) or np.any((p < 0) | (p > 1)):
        raise ValueError(f"p_values: expected numbers in [0, 1], got {list(p_values)!r}")
    m = len(p)
    order = np.argsort(p, kind="stable")
    scaled = np.minimum(1.0, (m - np.arange(m)) * p[order])
    adjusted = np.empty(m)
    adjusted[order] = np.maximum.accumulate(scaled)
    return [float(x) for x in adjusted]


def paired_t_power(effect: float, sd: float, n: int, alpha: float = ALPHA) -> float:
    """The two-sided paired t-test's power against a true mean difference ``effect`` with spread ``sd``:
    P(|T| > t_{1-alpha/2, n-1}), T noncentral t with n - 1 degrees of freedom and noncentrality effect sqrt(n) / sd."""
    crit = float(stats.t.ppf(1 - alpha / 2, n - 1))
    nc = abs(effect) * math.sqrt(n) / sd
    far = float(stats.nct.cdf(-crit, n - 1, nc))  # the tail against the effect: scipy gives nan where it
    return float(stats.nct.sf(crit, n - 1, nc)) + (0.0 if math.isnan(far) else far)  # underflows


def mde_paired(sd: float, n: int, alpha: float = ALPHA, power: float = POWER) -> float | None:
    """The minimum detectable effect: the smallest |mean difference| that the two-sided paired t-test at ``alpha``
    detects with probability ``power``, when the differences' true spread is ``sd``.

    Solved on the noncentral t (``paired_t_power`` = power, both tails), not by the shortcut
    (q_{1-alpha/2} + q_power) sd / sqrt(n): with normal quantiles q it understates the mde 2.0-fold at n = 3,
    with t quantiles by 5 % (3.10 sd against 3.26 sd). Two approximations
    remain, and both make the mde smaller than the truth: the seeds' sample sd stands in for the true spread,
    and the t-test's power stands in for the exact sign-flip test's, which the claims use and which is weaker
    -- below 6 pairs it cannot reach p < 0.05 at all (``min_sign_flip_p``), whatever the effect. None for
    fewer than 2 pairs; 0 where the differences have no spread."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be an integer >= 1, got {n!r}")
    if not (math.isfinite(sd) and sd >= 0):
        raise ValueError(f"sd must be a finite number >= 0, got {sd!r}")
    if not (0 < alpha < 1 and 0 < power < 1):
        raise ValueError(f"alpha and power must be in (0, 1), got {alpha!r} and {power!r}")
    if n < 2:
        return None
    if sd == 0:
        return 0.0
    hi = sd
    while paired_t_power(hi, sd, n, alpha) < power:
        hi *= 2
    return float(optimize.brentq(lambda e: paired_t_power(e, sd, n, alpha) - power, 0.0, hi, xtol=1e-12 * sd))


def _fisher_region(runs_a: int, runs_b: int, alpha: float) -> np.ndarray:
    """(runs_a + 1, runs_b + 1) booleans: does the table (x of runs_a failed, y of runs_b) give p < alpha?"""
    return np.array([[fisher_exact(x, runs_a, y, runs_b) < alpha for y in range(runs_b + 1)]
                     for x in range(runs_a + 1)])


def fisher_power(rate_a: float, runs_a: int, rate_b: float, runs_b: int, alpha: float = ALPHA) -> float:
    """Fisher's exact test's power: the probability, when a fails at ``rate_a`` and b at ``rate_b`` (independent
    binomials), of a table with p < ``alpha`` -- summed exactly over every (x, y) outcome."""
    region = _fisher_region(runs_a, runs_b, alpha)
    return _power(region, rate_a, runs_a, rate_b, runs_b)


def _power(region: np.ndarray, rate_a: float, runs_a: int, rate_b: float, runs_b: int) -> float:
    pa = stats.binom.pmf(np.arange(runs_a + 1), runs_a, rate_a)
    pb = stats.binom.pmf(np.arange(runs_b + 1), runs_b, rate_b)
    return float(pa @ region.astype(np.float64) @ pb)


def mde_rate(base_rate: float, runs_a: int, runs_b: int, alpha: float = ALPHA, power: float = POWER,
             direction: str = HIGHER) -> float | None:
    """The smallest change in failure rate from ``base_rate`` (the baseline's), in the claim's ``direction``, that
    Fisher's exact test detects with probability ``power``: for ``higher`` the least rise rate_a - base_rate, for
    ``lower`` the least drop base_rate - rate_a, for ``same`` the smaller of the two (either would contradict it),
    each with ``fisher_power`` >= power, found on a 1/1000 grid of rate_a (power is not smooth in it). Returned as
    a magnitude. None where no rate that way is detected that often: 3 runs against 3 can never reach p < 0.05
    (3/3 against 0/3 gives p = 0.1), and nothing can drop below a baseline that never fails."""
    if not 0 <= base_rate <= 1:
        raise ValueError(f"base_rate must be in [0, 1], got {base_rate!r}")
    if direction not in (LOWER, HIGHER, SAME):
        raise ValueError(f"direction must be {LOWER!r}, {HIGHER!r} or {SAME!r}, got {direction!r}")
    region = _fisher_region(runs_a, runs_b, alpha)

    def first(grid):
        for i in grid:
            if _power(region, i / 1000, runs_a, base_rate, runs_b) >= power:
                return round(abs(i / 1000 - base_rate), 12)
        return None

    rise = first(range(int(math.ceil(base_rate * 1000)), 1001)) if direction != LOWER else None
    drop = first(range(int(math.floor(base_rate * 1000)), -1, -1)) if direction != HIGHER else None
    found = [d for d in (rise, drop) if d is not None]
    return min(found) if found else None


def verdict(effect: float | None, p_holm: float | None, direction: str, alpha: float = ALPHA) -> str:
    """``supported`` where p_holm < alpha and the effect has the claim's sign (``direction``: ``lower``, the arm's
    value below the baseline's -- a negative effect; ``higher``, a positive one), ``contradicted`` where p_holm <
    alpha and it has the other sign, else ``inconclusive`` (no test, a zero effect, or p_holm >= alpha).
    A ``same`` claim (no difference) is ``contradicted`` by a difference at p_holm < alpha and otherwise
    ``inconclusive``: failing to find a difference is not evidence of its absence (the record's mde says how
    large a difference could have gone unseen)."""
    if direction not in (LOWER, HIGHER, SAME):
        raise ValueError(f"direction must be {LOWER!r}, {HIGHER!r} or {SAME!r}, got {direction!r}")
    if effect is None or p_holm is None or effect == 0 or not p_holm < alpha:
        return INCONCLUSIVE
    if direction == SAME:
        return CONTRADICTED
    return SUPPORTED if (effect < 0) == (direction == LOWER) else CONTRADICTED
