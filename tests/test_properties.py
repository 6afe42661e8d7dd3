"""Property tests (hypothesis): invariances that hold for every input, on every backend."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import addnorm

from backends import BACKENDS
dims = st.integers(min_value=2, max_value=300)
rows = st.integers(min_value=1, max_value=6)
seeds = st.integers(min_value=0, max_value=2**31 - 1)


def _randn(shape, seed, dtype=torch.float64):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


@pytest.mark.parametrize("backend", BACKENDS)
@settings(max_examples=40, deadline=None)
@given(n=rows, d=dims, seed=seeds, c=st.floats(min_value=-1e4, max_value=1e4))
def test_layer_norm_shift_invariance(backend, n, d, seed, c):
    x = _randn((n, d), seed).float()
    y0 = addnorm.layer_norm(x, d, backend=backend)
    y1 = addnorm.layer_norm((x.double() + c).float(), d, backend=backend)
    # the shift is exact in float64 but rounding x + c to float32 loses ~|c|·2^-24 per element, and the
    # float32 mean of values near c as much again (torch's own layer_norm reached 4.1 of these units)
    tol = 1e-5 + 8 * (abs(c) + 10) * 2.0**-24 / x.std(-1, unbiased=False).min().item()
    torch.testing.assert_close(y1, y0, atol=tol, rtol=0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_shift_invariance_where_naive_variance_fails(backend):
    # x = 1e4 + N(0,1): E[x²]−E[x]² cancels catastrophically in float32; two-pass does not.
    # float32 statistics still cost ~ulp(1e4)/std ≈ 1e-3 (PyTorch's own error is the same).
    x = (1e4 + _randn((16, 768), 0)).float()
    exact = addnorm.layer_norm(x.double() - 1e4, 768, backend="torch")
    err = (addnorm.layer_norm(x, 768, backend=backend).double() - exact).abs().max().item()
    err_torch = (torch.nn.functional.layer_norm(x, (768,)).double() - exact).abs().max().item()
    assert err <= max(1.5 * err_torch, 1e-4)
    mean = x.mean(-1, keepdim=True)
    naive = (x - mean) / torch.sqrt((x * x).mean(-1, keepdim=True) - mean**2 + 1e-5)
    assert torch.nan_to_num((naive.double() - exact).abs(), nan=float("inf")).max() > 100 * err  # the trap is real (even NaN)


@pytest.mark.parametrize("backend", BACKENDS)
@settings(max_examples=40, deadline=None)
@given(n=rows, d=dims, seed=seeds, scale=st.floats(min_value=1e-2, max_value=1e3))
def test_rms_norm_scale_invariance(backend, n, d, seed, scale):
    x = _randn((n, d), seed).float()
    y0 = addnorm.rms_norm(x, d, eps=0.0, backend=backend)
    y1 = addnorm.rms_norm(x * scale, d, eps=0.0, backend=backend)
    torch.testing.assert_close(y1, y0, atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
@settings(max_examples=30, deadline=None)
@given(n=rows, d=dims, seed=seeds)
def test_layer_norm_dx_sums_to_zero_over_the_row(backend, n, d, seed):
    x = _randn((n, d), seed).float().requires_grad_()
    w = (1 + _randn((d,), seed + 1)).float()
    dy = _randn((n, d), seed + 2).float()
    (dx,) = torch.autograd.grad((addnorm.layer_norm(x, d, w, backend=backend) * dy).sum(), x)
    scale = (dy.abs() * w.abs()).sum(-1) / x.std(-1).clamp_min(1e-3)
    assert (dx.double().sum(-1).abs() <= 1e-5 * scale.double() + 1e-6).all()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", ["layer", "rms"])
@settings(max_examples=20, deadline=None)
@given(n=st.integers(2, 8), d=dims, seed=seeds, row=st.integers(0, 7))
def test_a_row_does_not_depend_on_other_rows(backend, kind, n, d, seed, row):
    row = row % n
    x = _randn((n, d), seed).float()
    r = _randn((n, d), seed + 1).float()
    fn = addnorm.add_layer_norm if kind == "layer" else addnorm.add_rms_norm
    y, _ = fn(x, r, d, backend=backend)
    x2, r2 = x.clone(), r.clone()
    others = torch.arange(n) != row
    x2[others] = _randn((int(others.sum()), d), seed + 2).float() * 100
    y2, _ = fn(x2, r2, d, backend=backend)
    assert torch.equal(y[row], y2[row])
    y_single, _ = fn(x[row:row + 1], r[row:row + 1], d, backend=backend)
    np.testing.assert_array_equal(y_single[0].numpy(), y[row].numpy())
