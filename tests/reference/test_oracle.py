"""The oracle itself, checked against torch float64 autograd (an independent derivation)."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from addnorm.reference import oracle


@pytest.mark.parametrize("shape,n_norm", [((4, 7), 1), ((2, 3, 5), 2), ((1, 1), 1)])
@pytest.mark.parametrize("kind", ["layer", "rms"])
def test_oracle_forward_and_backward_match_float64_autograd(shape, n_norm, kind):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(shape, dtype=torch.float64, generator=g, requires_grad=True)
    ns = shape[len(shape) - n_norm:]
    w = torch.randn(ns, dtype=torch.float64, generator=g, requires_grad=True)
    b = torch.randn(ns, dtype=torch.float64, generator=g, requires_grad=True)
    dy = torch.randn(shape, dtype=torch.float64, generator=g)
    if kind == "layer":
        y = F.layer_norm(x, ns, w, b, 1e-5)
        dx, dw, db = torch.autograd.grad((y * dy).sum(), [x, w, b])
        np.testing.assert_allclose(oracle.layer_norm(x, w, b, 1e-5, n_norm), y.detach().numpy(), rtol=1e-12, atol=1e-12)
        o = oracle.layer_norm_backward(dy, x, w, 1e-5, n_norm)
        for got, want in zip(o, (dx, dw, db)):
            np.testing.assert_allclose(got, want.numpy(), rtol=1e-10, atol=1e-10)
    else:
        y = F.rms_norm(x, ns, w, 1e-6)
        dx, dw = torch.autograd.grad((y * dy).sum(), [x, w])
        np.testing.assert_allclose(oracle.rms_norm(x, w, 1e-6, n_norm), y.detach().numpy(), rtol=1e-12, atol=1e-12)
        o = oracle.rms_norm_backward(dy, x, w, 1e-6, n_norm)
        for got, want in zip(o, (dx, dw)):
            np.testing.assert_allclose(got, want.numpy(), rtol=1e-10, atol=1e-10)


def test_oracle_add_norm_returns_sum_and_shared_gradient():
    x, r = np.arange(6.0).reshape(2, 3), np.ones((2, 3))
    y, s = oracle.add_layer_norm(x, r)
    np.testing.assert_array_equal(s, x + r)
    np.testing.assert_allclose(y, oracle.layer_norm(x + r))
    dx, dr = oracle.add_norm_backward(np.ones((2, 3)), np.full((2, 3), 2.0))
    np.testing.assert_array_equal(dx, np.full((2, 3), 3.0))
    np.testing.assert_array_equal(dr, dx)


def test_oracle_gemma_weight_offset():
    x = np.random.default_rng(0).normal(size=(3, 8))
    w = np.random.default_rng(1).normal(size=8)
    np.testing.assert_allclose(oracle.rms_norm(x, w, weight_offset=1.0), oracle.rms_norm(x, 1 + w))
