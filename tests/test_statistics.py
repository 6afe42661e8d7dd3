"""The claims file's statistics against cases worked by hand (the arithmetic is written beside each) and against
scipy's own tests where scipy has the same one."""

import math

import numpy as np
import pytest
from scipy import stats

from addnorm.harness.statistics import (CONTRADICTED, HIGHER, INCONCLUSIVE, LOWER, SAME, SUPPORTED,
                                                  differences, fisher_exact, fisher_power, holm, mde_paired, mde_rate,
                                                  min_sign_flip_p, pairs_to_reach, paired_t_interval, paired_t_power,
                                                  rate_difference_interval, sign_flip_p, verdict, wilson_interval)


# ---- the paired-t interval ------------------------------------------------------------------------------------

def test_paired_t_interval_by_hand():
    # d = [1, 2, 3, 4, 5]: mean 3; squared deviations 4 + 1 + 0 + 1 + 4 = 10, s^2 = 10 / 4 = 2.5, s = 1.5811;
    # t_{0.975, 4} = 2.7764; half-width 2.7764 * 1.5811 / sqrt(5) = 2.7764 * 0.70711 = 1.9632
    iv = paired_t_interval([1, 2, 3, 4, 5])
    assert iv.n == 5 and iv.mean == 3.0
    assert iv.sd == pytest.approx(math.sqrt(2.5), rel=1e-15)
    assert iv.low == pytest.approx(3 - 1.9632, abs=1e-4) and iv.high == pytest.approx(3 + 1.9632, abs=1e-4)


def test_paired_t_interval_of_three_seeds_by_hand():
    # d = [-0.02, -0.05, -0.08]: mean -0.05, s = 0.03; t_{0.975, 2} = 4.3027; half 4.3027 * 0.03 / sqrt(3) = 0.074525
    iv = paired_t_interval([-0.02, -0.05, -0.08])
    assert iv.low == pytest.approx(-0.05 - 0.074525, abs=1e-6) and iv.high == pytest.approx(-0.05 + 0.074525, abs=1e-6)


def test_paired_t_interval_matches_scipy_ttest_rel():
    rng = np.random.default_rng(3)
    a, b = rng.normal(2.5, 0.1, 7), rng.normal(2.45, 0.1, 7)
    iv = paired_t_interval(differences(a, b))
    ci = stats.ttest_rel(a, b).confidence_interval(0.95)
    assert (iv.low, iv.high) == pytest.approx((ci.low, ci.high), rel=1e-12)


def test_paired_t_interval_edges():
    one = paired_t_interval([0.3])
    assert (one.mean, one.sd, one.low, one.high) == (0.3, None, None, None)
    flat = paired_t_interval([0.1, 0.1, 0.1])
    assert flat.low == pytest.approx(0.1) and flat.high == pytest.approx(0.1)


@pytest.mark.parametrize("bad", [[], [1.0, float("nan")], [[1.0, 2.0]]])
def test_paired_t_interval_refuses_bad_input(bad):
    with pytest.raises(ValueError, match="d: expected"):
        paired_t_interval(bad)


def test_differences_need_pairs():
    with pytest.raises(ValueError, match="as many values in each, got 3 and 2"):
        differences([1, 2, 3], [1, 2])
    assert list(differences([3.0, 2.0], [1.0, 2.5])) == [2.0, -0.5]


# ---- the sign-flip permutation test ---------------------------------------------------------------------------

def test_sign_flip_all_positive_by_hand():
    # n = 5, all positive and distinct: only the all-plus and all-minus of the 32 sign vectors reach |sum| = 15
    assert sign_flip_p([1, 2, 3, 4, 5]) == 2 / 32
    assert sign_flip_p([0.01, 0.02, 0.03]) == 2 / 8  # three seeds agreeing in sign: p = 0.25, never less


def test_sign_flip_mixed_signs_by_hand():
    # d = [3, -1, 2]: observed sum 4. The 8 signed sums: +3+1+2 = 6, 3+1-2 = 2, 3-1+2 = 4, 3-1-2 = 0, and their
    # negatives -6, -2, -4, 0. |sum| >= 4: 6, 4, -6, -4 -> p = 4/8
    assert sign_flip_p([3, -1, 2]) == 0.5


def test_sign_flip_counts_ties_with_the_observed_sum():
    # d = [1, 1]: signed sums 2, 0, 0, -2; |sum| >= 2 twice -> 2/4, with 0.1 + 0.2 rounding kept as a tie
    assert sign_flip_p([1, 1]) == 0.5
    assert sign_flip_p([0.1 + 0.2, 0.3]) == 0.5


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_sign_flip_matches_scipy_exact_permutation_test(seed):
    rng = np.random.default_rng(seed)
    a, b = rng.normal(0.0, 1.0, 9), rng.normal(0.4, 1.0, 9)
    ref = stats.permutation_test((a, b), lambda x, y: np.mean(x - y), permutation_type="samples",
                                 n_resamples=np.inf, alternative="two-sided")
    assert sign_flip_p(differences(a, b)) == pytest.approx(ref.pvalue, rel=1e-12)


def test_sign_flip_beyond_exact_is_a_seeded_monte_carlo_estimate():
    d = np.linspace(-0.5, 1.5, 22)
    exact = sign_flip_p(d, max_exact=22)  # 4.2M sums: the reference the estimate is judged against
    est = sign_flip_p(d, resamples=40_000)
    assert est == sign_flip_p(d, resamples=40_000)  # reproducible
    assert abs(est - exact) < 4 * math.sqrt(exact * (1 - exact) / 40_000) + 1 / 40_000
    assert sign_flip_p([1.0] * 25, resamples=1000) == pytest.approx(1 / 1001)  # never 0: (1 + 0) / (1 + R)


def test_pairs_to_reach():
    # 2/2^5 = 0.0625 >= 0.05 > 2/2^6 = 0.03125; Holm over 31 tests: 0.05/31 = 0.00161 > 2/2^11 = 0.00098, while
    # 2/2^10 = 0.00195 is not below it
    assert pairs_to_reach(0.05) == 6 and pairs_to_reach(0.05 / 31) == 11 and pairs_to_reach(1.0) == 2
    with pytest.raises(ValueError, match="level must be in"):
        pairs_to_reach(0)


def test_min_sign_flip_p():
    assert [min_sign_flip_p(n) for n in (1, 3, 5, 6, 11)] == [1.0, 0.25, 0.0625, 0.03125, 2 / 2048]
    with pytest.raises(ValueError, match="n must be an integer >= 1"):
        min_sign_flip_p(0)


# ---- Fisher's exact test --------------------------------------------------------------------------------------

def test_fisher_three_of_three_against_none_by_hand():
    # 3 of 6 runs failed. P(a has x failures) = C(3, x) C(3, 3 - x) / C(6, 3) = 1, 9, 9, 1 (/ 20) for x = 0..3;
    # tables at most as likely as x = 3 (1/20): x = 0 and x = 3 -> p = 2/20 = 0.1
    assert fisher_exact(3, 3, 0, 3) == pytest.approx(0.1, rel=1e-12)
    # 5/5 against 0/5: C(10, 5) = 252, the two extreme tables -> 2/252
    assert fisher_exact(5, 5, 0, 5) == pytest.approx(2 / 252, rel=1e-12)
    assert fisher_exact(0, 3, 0, 3) == 1.0 and fisher_exact(0, 0, 0, 0) == 1.0


@pytest.mark.parametrize("table", [(3, 3, 0, 3), (1, 5, 4, 5), (2, 9, 7, 8), (0, 4, 6, 12), (10, 30, 2, 30)])
def test_fisher_matches_scipy(table):
    ka, na, kb, nb = table
    _, ref = stats.fisher_exact([[ka, na - ka], [kb, nb - kb]], alternative="two-sided")
    assert fisher_exact(ka, na, kb, nb) == pytest.approx(ref, rel=1e-9)


@pytest.mark.parametrize("bad", [(4, 3, 0, 3), (-1, 3, 0, 3), (1.0, 3, 0, 3), (True, 3, 0, 3)])
def test_fisher_refuses_bad_counts(bad):
    with pytest.raises(ValueError, match="failed_a: a failure count"):
        fisher_exact(*bad)


def test_wilson_by_hand():
    # 0/3: centre = (0 + z^2/6) / (1 + z^2/3), half = z sqrt(z^2/36) / (1 + z^2/3) = (z^2/6) / (1 + z^2/3):
    # [0, (z^2/3) / (1 + z^2/3)] = [0, z^2 / (3 + z^2)] = [0, 3.8415 / 6.8415] = [0, 0.56149]
    assert wilson_interval(0, 3) == pytest.approx((0.0, 0.56149), abs=1e-5)
    assert wilson_interval(3, 3) == pytest.approx((1 - 0.56149, 1.0), abs=1e-5)
    # 5/10: centre 0.5, half = 1.959964 sqrt(0.025 + 3.841459/400) / 1.3841459 = 1.959964 * 0.186020 / 1.3841459
    # = 0.263407
    assert wilson_interval(5, 10) == pytest.approx((0.5 - 0.263407, 0.5 + 0.263407), abs=1e-6)
    for k, n in ((0, 3), (2, 7), (5, 10), (12, 12)):
        ci = stats.binomtest(k, n).proportion_ci(0.95, method="wilson")
        assert wilson_interval(k, n) == pytest.approx((ci.low, ci.high), abs=1e-12)
    with pytest.raises(ValueError, match="k of n"):
        wilson_interval(4, 3)


def test_rate_difference_interval_by_hand():
    # 3/3 against 0/3: d = 1; low = 1 - sqrt((1 - 0.43851)^2 + (0.56149 - 0)^2) = 1 - 0.56149 sqrt(2) = 0.20593;
    # high = 1 + sqrt(0 + 0) = 1
    low, high = rate_difference_interval(3, 3, 0, 3)
    assert low == pytest.approx(0.20593, abs=1e-5) and high == 1.0
    low, high = rate_difference_interval(1, 3, 1, 3)
    assert low == pytest.approx(-high) and 0 < high < 1


# ---- Holm -----------------------------------------------------------------------------------------------------

def test_holm_by_hand():
    # p = [0.01, 0.04, 0.03, 0.005], m = 4. Sorted: 0.005 (x4 = 0.02), 0.01 (x3 = 0.03), 0.03 (x2 = 0.06),
    # 0.04 (x1 = 0.04 -> raised to the running maximum 0.06). Back in the given order: 0.03, 0.06, 0.06, 0.02
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02], rel=1e-12)


def test_holm_caps_at_one_and_keeps_ties():
    # m = 3: 0.5 x 3 = 1.5 -> 1; 0.6 x 2 = 1.2 -> 1; 0.9 x 1 -> the running maximum 1
    assert holm([0.5, 0.9, 0.6]) == [1.0, 1.0, 1.0]
    assert holm([0.02, 0.02]) == [0.04, 0.04]
    assert holm([]) == []


def test_holm_against_its_definition():
    # scipy has no Holm (false_discovery_control is Benjamini-Hochberg): the definition, term by term
    rng = np.random.default_rng(5)
    p = rng.uniform(0, 0.2, 12)
    adj = np.array(holm(p))
    order = np.argsort(p)
    assert np.all(np.diff(adj[order]) >= 0)  # monotone in the sorted order
    assert np.all(adj >= p) and np.all(adj <= 1)
    m = len(p)
    for i, k in enumerate(order):
        assert adj[k] == pytest.approx(min(1.0, max((m - j) * p[order[j]] for j in range(i + 1))))


def test_holm_refuses_bad_p():
    with pytest.raises(ValueError, match=r"p_values: expected numbers in \[0, 1\]"):
        holm([0.2, 1.5])


# ---- power and the minimum detectable effect ------------------------------------------------------------------

def test_mde_paired_reaches_the_power():
    # by definition the t-test detects the mde 80 % of the time: the noncentral t's two tails past t_{0.975, n-1}
    for n in (3, 5, 10):
        mde = mde_paired(0.02, n)
        assert paired_t_power(mde, 0.02, n) == pytest.approx(0.8, abs=1e-9)
        assert paired_t_power(0.9 * mde, 0.02, n) < 0.8


def test_mde_paired_against_the_t_shortcut_by_hand():
    # n = 5, sd = 1: (t_{0.975, 4} + t_{0.8, 4}) / sqrt(5) = (2.7764 + 0.9410) / 2.2361 = 1.6625 -- the shortcut
    # ignores the noncentral t's extra spread; the exact value is a little larger (1.682)
    assert mde_paired(1.0, 5) == pytest.approx(1.682, abs=1e-3)
    assert 1.6625 < mde_paired(1.0, 5) < 1.6625 * 1.05
    # it scales with sd, and falls as 1 / sqrt(n) for large n: (1.96 + 0.8416) / sqrt(400) = 0.14008
    assert mde_paired(2.0, 5) == pytest.approx(2 * mde_paired(1.0, 5), rel=1e-9)
    assert mde_paired(1.0, 400) == pytest.approx(0.14008, rel=3e-3)


def test_mde_paired_edges():
    assert mde_paired(0.05, 1) is None and mde_paired(0.0, 4) == 0.0
    with pytest.raises(ValueError, match="sd must be a finite number >= 0"):
        mde_paired(-1.0, 3)


def test_fisher_power_by_hand():
    # 3 runs against 3: no table reaches p < 0.05 (the most extreme gives 0.1), so the power is 0 at every rate
    assert fisher_power(1.0, 3, 0.0, 3) == 0.0
    # 5 against 5, baseline never failing (y = 0 always): 5/5 vs 0/5 (p = 2/252) and 4/5 vs 0/5 (4 of 10 failed,
    # P(x) = C(5, x) C(5, 4 - x) / 210 = 5, 50, 100, 50, 5 / 210 -> p = 10/210 = 0.0476) reach p < 0.05, 3/5 vs 0/5
    # does not (p = 0.167): the power at rate r is P(x >= 4) = r^5 + 5 r^4 (1 - r)
    r = 0.9
    assert fisher_power(r, 5, 0.0, 5) == pytest.approx(r ** 5 + 5 * r ** 4 * (1 - r), rel=1e-12)


def test_mde_rate():
    assert mde_rate(0.0, 3, 3) is None  # undetectable at any rate
    # 5 against 5 from 0: the least r on the grid with r^5 + 5 r^4 (1 - r) >= 0.8 (that is, 0.832)
    r = mde_rate(0.0, 5, 5)
    assert r ** 5 + 5 * r ** 4 * (1 - r) >= 0.8 > (r - 0.001) ** 5 + 5 * (r - 0.001) ** 4 * (1 - r + 0.001)


def test_mde_rate_looks_the_claims_way():
    # a claim of fewer failures against a baseline that always fails (5 of 5): the mirror of the rise from 0 --
    # rate_a = 1 - r fails 0 or 1 of 5 with the probability the rise's r succeeds 5 or 4 times
    rise = mde_rate(0.0, 5, 5)
    assert mde_rate(1.0, 5, 5, direction=LOWER) == pytest.approx(rise)
    assert mde_rate(1.0, 5, 5) is None  # no rise above 1: the old answer for every claim, whatever its direction
    assert mde_rate(0.0, 5, 5, direction=LOWER) is None  # nothing drops below a baseline that never fails
    assert mde_rate(1.0, 5, 5, direction=SAME) == mde_rate(0.0, 5, 5, direction=SAME) == pytest.approx(rise)
    assert mde_rate(0.0, 3, 3, direction=SAME) is None
    with pytest.raises(ValueError, match="direction"):
        mde_rate(0.5, 5, 5, direction="down")


# ---- the verdict rule -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("effect, p_holm, direction, want", [
    (-0.1, 0.01, LOWER, SUPPORTED), (-0.1, 0.01, HIGHER, CONTRADICTED), (0.1, 0.01, HIGHER, SUPPORTED),
    (0.1, 0.01, LOWER, CONTRADICTED), (-0.1, 0.05, LOWER, INCONCLUSIVE), (-0.1, 0.25, LOWER, INCONCLUSIVE),
    (0.0, 0.001, LOWER, INCONCLUSIVE), (None, None, LOWER, INCONCLUSIVE), (-0.1, None, LOWER, INCONCLUSIVE),
    (0.1, 0.01, SAME, CONTRADICTED), (-0.1, 0.01, SAME, CONTRADICTED), (0.1, 0.2, SAME, INCONCLUSIVE),
])
def test_verdict(effect, p_holm, direction, want):
    assert verdict(effect, p_holm, direction) == want


def test_verdict_refuses_an_unknown_direction():
    with pytest.raises(ValueError, match="direction must be 'lower', 'higher' or 'same', got 'down'"):
        verdict(-0.1, 0.01, "down")
