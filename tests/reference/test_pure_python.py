"""The pure-Python backend (lists only) against the float64 oracle."""

import math
import random

import numpy as np
import pytest

from addnorm.reference import oracle
from addnorm.reference import pure_python as pp


def _vec(d, seed, scale=1.0, shift=0.0):
    rnd = random.Random(seed)
    return [rnd.gauss(shift, scale) for _ in range(d)]


@pytest.mark.parametrize("d", [1, 2, 16, 123])
def test_layer_norm_forward_backward_match_oracle(d):
    x, w, b, dy = _vec(d, 0, 3.0, 2.0), _vec(d, 1), _vec(d, 2), _vec(d, 3)
    y, cache = pp.layer_norm_forward(x, w, b, eps=1e-5)
    np.testing.assert_allclose(y, oracle.layer_norm(np.array(x), w, b, 1e-5), rtol=1e-12, atol=1e-12)
    assert cache.stats.mean == pytest.approx(float(np.mean(x)), abs=1e-12)
    assert cache.stats.variance == pytest.approx(float(np.var(x)), rel=1e-12, abs=1e-15)
    assert cache.stats.std == pytest.approx(math.sqrt(np.var(x) + 1e-5), rel=1e-12)
    dx, dw, db = pp.norm_backward(dy, cache)
    o_dx, o_dw, o_db = oracle.layer_norm_backward(np.array(dy), np.array(x), w, 1e-5)
    np.testing.assert_allclose(dx, o_dx, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(dw, o_dw, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(db, o_db, rtol=1e-12)


@pytest.mark.parametrize("d", [1, 7, 64])
def test_rms_norm_forward_backward_match_oracle(d):
    x, w, dy = _vec(d, 4, 2.0), _vec(d, 5), _vec(d, 6)
    y, cache = pp.rms_norm_forward(x, w, eps=1e-6)
    np.testing.assert_allclose(y, oracle.rms_norm(np.array(x), w, 1e-6), rtol=1e-12)
    dx, dw, db = pp.norm_backward(dy, cache)
    assert db is None
    o_dx, o_dw = oracle.rms_norm_backward(np.array(dy), np.array(x), w, 1e-6)
    np.testing.assert_allclose(dx, o_dx, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(dw, o_dw, rtol=1e-9, atol=1e-12)


def test_add_norm_forward_backward():
    x, r, dy, dres = _vec(10, 7), _vec(10, 8), _vec(10, 9), _vec(10, 10)
    y, s, cache = pp.add_layer_norm_forward(x, r)
    assert s == [a + b for a, b in zip(x, r)]
    dx, dr, dw, db = pp.add_norm_backward(dy, cache, dres)
    o_dx, _, _ = oracle.layer_norm_backward(np.array(dy), np.array(s))
    np.testing.assert_allclose(dx, o_dx + np.array(dres), rtol=1e-9, atol=1e-12)
    assert dx == dr
    _, _, cache = pp.add_rms_norm_forward(x, r)
    assert cache.kind == "rms"


def test_rows_and_verification_stats():
    rows = [_vec(16, i, 5.0, 3.0) for i in range(5)]
    outs, caches = pp.layer_norm_rows(rows)
    for o in outs:
        mean, var = pp.row_mean_variance(o)
        assert abs(mean) < 1e-12
        assert var == pytest.approx(1.0, abs=1e-4)
    outs, _ = pp.rms_norm_rows(rows)
    assert len(outs) == 5


def test_bad_input_named():
    with pytest.raises(ValueError, match="weight must have length 3"):
        pp.layer_norm_forward([1.0, 2.0, 3.0], weight=[1.0])
    with pytest.raises(ValueError, match="x must be a non-empty list"):
        pp.rms_norm_forward([])
    with pytest.raises(ValueError, match="residual must have length 2"):
        pp.add([1.0, 2.0], [1.0])
