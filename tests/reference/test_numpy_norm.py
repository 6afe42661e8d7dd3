"""The NumPy backend: (out, cache) / backward(dout, cache), against the oracle."""

import numpy as np
import pytest

from addnorm.reference import numpy_norm as nn_np
from addnorm.reference import oracle


@pytest.mark.parametrize("dtype,tol", [(np.float64, 1e-12), (np.float32, 2e-5)])
@pytest.mark.parametrize("shape,n_norm", [((4, 8), 1), ((2, 3, 17), 1), ((5, 2, 6), 2), ((0, 4), 1), ((7,), 1)])
@pytest.mark.parametrize("kind", ["layer", "rms"])
def test_add_norm_forward_backward_match_oracle(dtype, tol, shape, n_norm, kind):
    rng = np.random.default_rng(0)
    x = rng.normal(1.0, 2.0, size=shape).astype(dtype)
    r = rng.normal(size=shape).astype(dtype)
    ns = shape[len(shape) - n_norm:]
    w, b = rng.normal(size=ns).astype(dtype), rng.normal(size=ns).astype(dtype)
    dy, dres = rng.normal(size=shape).astype(dtype), rng.normal(size=shape).astype(dtype)
    if kind == "layer":
        (y, s), cache = nn_np.add_layer_norm_forward(x, r, w, b, 1e-5, n_norm)
        o_y, o_s = oracle.add_layer_norm(x, r, w, b, 1e-5, n_norm)
    else:
        (y, s), cache = nn_np.add_rms_norm_forward(x, r, w, 1e-5, n_norm)
        o_y, o_s = oracle.add_rms_norm(x, r, w, 1e-5, n_norm)
    assert y.dtype == dtype and s.dtype == dtype and y.shape == shape
    np.testing.assert_allclose(y, o_y, atol=tol * 10, rtol=tol)
    g = nn_np.add_norm_backward(dy, cache, dres)
    if kind == "layer":
        o_dx, o_dw, o_db = oracle.layer_norm_backward(dy, s, w, 1e-5, n_norm)
        np.testing.assert_allclose(g.dbias, o_db, atol=tol * 100, rtol=tol * 10)
    else:
        (o_dx, o_dw), o_db = oracle.rms_norm_backward(dy, s, w, 1e-5, n_norm), None
        assert g.dbias is None
    o_dx = o_dx + dres
    assert g.dx.dtype == dtype
    np.testing.assert_allclose(g.dx, o_dx, atol=tol * 100, rtol=tol * 10)
    np.testing.assert_allclose(g.dresidual, o_dx, atol=tol * 100, rtol=tol * 10)
    np.testing.assert_allclose(g.dweight, o_dw, atol=tol * 100, rtol=tol * 10)


def test_plain_forms_and_float16():
    x = np.random.default_rng(1).normal(size=(3, 9)).astype(np.float16)
    y, cache = nn_np.layer_norm_forward(x)
    assert y.dtype == np.float16
    np.testing.assert_allclose(y.astype(np.float64), oracle.layer_norm(x), atol=2e-3)
    g = nn_np.layer_norm_backward(np.ones_like(x), cache)
    assert g.dweight is None and g.dbias is None
    y, cache = nn_np.rms_norm_forward(x.astype(np.float32))
    g = nn_np.rms_norm_backward(np.ones((3, 9), np.float32), cache)
    assert g.dx.shape == (3, 9)


def test_errors_name_the_argument():
    x = np.zeros((2, 4), np.float32)
    with pytest.raises(TypeError, match="x must be a float16/float32/float64 array"):
        nn_np.layer_norm_forward(np.zeros((2, 4), np.int64))
    with pytest.raises(ValueError, match=r"weight must have shape \(4,\)"):
        nn_np.layer_norm_forward(x, np.ones(3, np.float32))
    with pytest.raises(ValueError, match="eps must be >= 0"):
        nn_np.rms_norm_forward(x, eps=-1.0)
    with pytest.raises(ValueError, match="residual must be an array of x's shape"):
        nn_np.add_layer_norm_forward(x, np.zeros((2, 3), np.float32))
    with pytest.raises(TypeError, match="residual dtype float64 must equal x dtype float32"):
        nn_np.add_rms_norm_forward(x, np.zeros((2, 4)))
