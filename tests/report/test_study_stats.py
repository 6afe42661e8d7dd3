"""The bootstrap of report/study_stats.py against cases computed by hand, and the rule that calls a difference."""

import itertools

import numpy as np
import pytest

from addnorm.report.study_stats import (BETTER, UNDECIDED, WORSE, Interval, bootstrap_mean, call,
                                        paired_difference, percentile, unpaired_difference)


def test_three_values_give_the_min_max_range():
    # 27 equally likely resamples; the smallest mean (all 0s) has weight 1/27 > 2.5 %, and so has the largest
    ci = bootstrap_mean([0.0, 1.0, 2.0])
    assert (ci.mean, ci.low, ci.high, ci.n, ci.exact) == (1.0, 0.0, 2.0, 3, True)


def test_four_values_by_hand():
    # [0, 0, 0, 1]: a resample's mean is k/4 with k ~ Binomial(4, 1/4): P(k <= 2) = 243/256 = 0.949 < 0.975,
    # P(k <= 3) = 255/256 >= 0.975, so the interval is [0, 0.75] -- the largest mean 1.0 (weight 1/256) is cut
    ci = bootstrap_mean([0.0, 0.0, 1.0, 0.0])
    assert (ci.mean, ci.low, ci.high, ci.exact) == (0.25, 0.0, 0.75, True)
    # at 50 %: the 25th percentile is 0 (P(k = 0) = 81/256 = 0.316), the 75th is 1/4 (P(k <= 1) = 0.738 < 0.75,
    # so it is 2/4)
    half = bootstrap_mean([0.0, 0.0, 1.0, 0.0], level=0.5)
    assert (half.low, half.high) == (0.0, 0.5)


def test_a_constant_sample_and_a_single_value():
    assert bootstrap_mean([2.5] * 7) == Interval(2.5, 2.5, 2.5, 7, False)
    one = bootstrap_mean([3.0])
    assert one.mean == 3.0 and not one.has_interval and call(one) == UNDECIDED


def test_percentile_is_the_inverted_cdf_without_interpolation():
    means, w = np.array([3.0, 1.0, 2.0, 4.0]), np.full(4, 0.25)
    assert [percentile(means, w, q) for q in (0.1, 0.25, 0.26, 0.5, 0.75, 0.76, 1.0)] == [1, 1, 2, 2, 3, 4, 4]


def test_the_drawn_bootstrap_is_reproducible_and_near_the_exact_one():
    x = [2.41, 2.55, 2.47, 2.62, 2.50, 2.44]  # 6^6 = 46656 resamples: drawn, not enumerated
    a, b = bootstrap_mean(x), bootstrap_mean(x)
    assert a == b and not a.exact
    exact = bootstrap_mean(x, resamples=50_000)  # now enumerated (462 multisets with their weights)
    assert exact.exact and abs(a.low - exact.low) < 0.01 and abs(a.high - exact.high) < 0.01
    # the enumeration's weights: every one of the 6^6 ordered resamples, counted by brute force
    brute = np.sort([np.mean(c) for c in itertools.product(x, repeat=6)])
    assert exact.low == pytest.approx(brute[int(np.ceil(0.025 * len(brute))) - 1])
    assert exact.high == pytest.approx(brute[int(np.ceil(0.975 * len(brute))) - 1])


def test_paired_resamples_pairs_and_unpaired_each_side():
    a, b = [2.0, 3.0, 4.0], [1.9, 2.9, 3.9]  # one seed-to-seed spread, a constant 0.1 apart
    paired = paired_difference(a, b)
    assert paired.low == pytest.approx(0.1) and paired.high == pytest.approx(0.1) and call(paired) == WORSE
    loose = unpaired_difference(a, b)  # the spread between seeds swamps the 0.1
    assert loose.mean == pytest.approx(0.1) and loose.low < 0 < loose.high and call(loose) == UNDECIDED
    # by brute force: 27 x 27 equally likely ordered resamples of the two sides, the inverted CDF at 2.5 %, 97.5 %
    diffs = np.sort([np.mean(p) - np.mean(q) for p in itertools.product(a, repeat=3)
                     for q in itertools.product(b, repeat=3)])
    assert loose.exact and loose.low == pytest.approx(diffs[int(np.ceil(0.025 * 729)) - 1])
    assert loose.high == pytest.approx(diffs[int(np.ceil(0.975 * 729)) - 1])
    with pytest.raises(ValueError, match="as many values in a as in b, got 3 and 2"):
        paired_difference(a, b[:2])


@pytest.mark.parametrize("low, high, expected", [(-0.3, -0.1, BETTER), (0.1, 0.3, WORSE), (-0.1, 0.2, UNDECIDED),
                                                 (0.0, 0.2, UNDECIDED), (-0.2, 0.0, UNDECIDED)])
def test_a_difference_is_called_only_where_its_interval_excludes_zero(low, high, expected):
    ci = Interval((low + high) / 2, low, high, 3, True)
    assert call(ci) == expected
    flipped = {BETTER: WORSE, WORSE: BETTER, UNDECIDED: UNDECIDED}[expected]
    assert call(ci, lower_is_better=False) == flipped


@pytest.mark.parametrize("bad", [[], [1.0, float("nan")], [[1.0, 2.0]]])
def test_bad_samples_are_named(bad):
    with pytest.raises(ValueError, match="values: expected"):
        bootstrap_mean(bad)


def test_fishers_exact_test_against_hand_computed_tables():
    from addnorm.report.study_stats import failure_call, fisher_exact

    # 3/3 vs 0/3: the two extreme tables, each C(3,3)C(3,0)/C(6,3) = 1/20
    assert fisher_exact(3, 3, 0, 3) == pytest.approx(0.1)
    assert failure_call(3, 3, 0, 3) == (pytest.approx(0.1), "not distinguishable")
    assert fisher_exact(5, 5, 0, 5) == pytest.approx(2 / 252)
    assert failure_call(0, 5, 5, 5)[1] == "fails less" and failure_call(5, 5, 0, 5)[1] == "fails more"
    # 11/12 vs 0/12: tables x = 11 (12 * 1 ways) and x = 0 (1 * 12 ways) of C(24, 11) = 2496144
    assert fisher_exact(11, 12, 0, 12) == pytest.approx(24 / 2496144)
    assert fisher_exact(1, 3, 1, 3) == 1.0 and fisher_exact(0, 3, 0, 3) == 1.0
    with pytest.raises(ValueError):
        fisher_exact(4, 3, 0, 3)
