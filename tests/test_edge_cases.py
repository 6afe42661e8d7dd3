"""Edge behaviour pinned for every backend: constant rows, zero rows, NaN/Inf, fp16 range."""

import pytest
import torch
import torch.nn.functional as F

import addnorm
import addnorm.functional as AF

from backends import BACKENDS
LOW = [torch.float32, torch.bfloat16, torch.float16]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", LOW)
def test_constant_rows_give_bias_and_finite_grads(backend, dtype):
    x = torch.full((3, 64), 7.25, dtype=dtype, requires_grad=True)
    w = torch.randn(64, dtype=dtype, requires_grad=True)
    b = torch.randn(64, dtype=dtype, requires_grad=True)
    y = addnorm.layer_norm(x, 64, w, b, backend=backend)
    torch.testing.assert_close(y, b.detach().expand(3, 64), atol=0, rtol=0)
    grads = torch.autograd.grad((y.float() * torch.randn(3, 64)).sum(), [x, w, b])
    assert all(torch.isfinite(g).all() for g in grads)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", LOW)
def test_all_zero_rows_rms_norm(backend, dtype):
    x = torch.zeros(4, 32, dtype=dtype, requires_grad=True)
    w = torch.ones(32, dtype=dtype, requires_grad=True)
    y = addnorm.rms_norm(x, 32, w, backend=backend)
    assert torch.equal(y, torch.zeros_like(y))
    gx, gw = torch.autograd.grad(y.float().sum(), [x, w])
    assert torch.isfinite(gx).all() and torch.isfinite(gw).all()
    ref = torch.autograd.grad(F.rms_norm(x.float(), (32,), w.float()).sum(), x)[0]
    torch.testing.assert_close(gx.float(), ref.float(), atol=0, rtol=1e-2)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", ["layer", "rms"])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_nan_and_inf_stay_in_their_row(backend, kind, bad):
    x = torch.randn(5, 40, requires_grad=True)
    r = torch.randn(5, 40)
    with torch.no_grad():
        x[2, 7] = bad
    fn = addnorm.add_layer_norm if kind == "layer" else addnorm.add_rms_norm
    y, s = fn(x, r, 40, backend=backend)
    assert not torch.isfinite(y[2]).all()
    good = torch.tensor([0, 1, 3, 4])
    assert torch.isfinite(y[good]).all()
    ref = (F.layer_norm if kind == "layer" else F.rms_norm)((x + r)[good], (40,))
    torch.testing.assert_close(y[good], ref, atol=1e-5, rtol=0)
    (gx,) = torch.autograd.grad(y[good].sum(), x)
    assert torch.isfinite(gx[good]).all()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", ["layer", "rms"])
def test_float16_large_values_do_not_overflow(backend, kind):
    # x² ≈ 1e6 is far beyond float16's max (65504): statistics must be float32
    x = (torch.randn(8, 256, dtype=torch.float64) * 300 + 1000).half()
    y = (addnorm.layer_norm if kind == "layer" else addnorm.rms_norm)(x, 256, backend=backend)
    assert torch.isfinite(y).all()
    ref = (F.layer_norm if kind == "layer" else F.rms_norm)(x.double(), (256,))
    assert (y.double() - ref).abs().max() < 1e-2


@pytest.mark.parametrize("backend", BACKENDS)
def test_zero_size_everything(backend):
    x = torch.randn(0, 8, requires_grad=True)
    r = torch.randn(0, 8, requires_grad=True)
    w = torch.randn(8, requires_grad=True)
    y, s = addnorm.add_layer_norm(x, r, 8, w, backend=backend)
    assert y.shape == (0, 8) and s.shape == (0, 8)
    gx, gw = torch.autograd.grad((y.sum() + s.sum()), [x, w])
    assert gx.shape == (0, 8) and torch.equal(gw, torch.zeros(8))
    y = addnorm.layer_norm(torch.randn(3, 0), 0, backend="torch")
    assert y.shape == (3, 0)


def test_empty_normalized_dim_matches_torch():
    x = torch.randn(3, 0)
    assert addnorm.layer_norm(x, 0).shape == F.layer_norm(x, (0,)).shape


def test_inference_tensors_outside_inference_mode_get_a_gradient_graph():
    """torch.nn.RMSNorm takes a tensor made under inference_mode, outside it, with a weight that wants a gradient
    (its composite saves only what it computed); the fused ops saved the input itself and raised 'Inference
    tensors cannot be saved for backward'. Each public op that saves an input is checked against the same call on
    a normal copy."""
    from addnorm.functional import add_derf, add_dyt, parallel_add_rms_norm, rms_norm_add
    from addnorm.functional import mhc_pre, stream_read, stream_write

    with torch.inference_mode():
        x, r, xs = torch.randn(3, 8), torch.randn(3, 8), torch.randn(3, 4, 8)
    w = torch.randn(8, requires_grad=True)
    hp, hr = torch.rand(3, 4, requires_grad=True), torch.rand(3, 4, 4, requires_grad=True)
    calls = {
        "rms_norm": lambda a, b, s: addnorm.rms_norm(a, 8, w),
        "layer_norm": lambda a, b, s: addnorm.layer_norm(a, 8, w),
        "rms_norm_add": lambda a, b, s: rms_norm_add(a, b, 8, w),
        "add_rms_norm": lambda a, b, s: addnorm.add_rms_norm(a, b, 8, w)[0],
        "add_layer_norm": lambda a, b, s: addnorm.add_layer_norm(a, b, 8, w)[0],
        "add_dyt": lambda a, b, s: add_dyt(a, None, torch.tensor([0.5]), w)[0],
        "add_derf": lambda a, b, s: add_derf(a, b, torch.tensor([0.5]), torch.tensor([0.1]), w)[0],
        "parallel_add_rms_norm": lambda a, b, s: parallel_add_rms_norm(a, b, b, 8, w)[0],
        "stream_read": lambda a, b, s: stream_read(s, hp),
        "stream_write": lambda a, b, s: stream_write(s, a, hp, hr)[0],
    }
    for name, f in calls.items():
        y = f(x, r, xs)
        assert y.requires_grad, name
        want = f(x.clone(), r.clone(), xs.clone())
        torch.testing.assert_close(y, want, msg=name)
        g, = torch.autograd.grad(y.sum(), w if "stream" not in name else hp)
        g0, = torch.autograd.grad(want.sum(), w if "stream" not in name else hp)
        torch.testing.assert_close(g, g0, msg=name)
    phi = torch.randn(32, 24, requires_grad=True)
    one = torch.ones(1)
    h = mhc_pre(xs, phi, one, one, one, torch.zeros(4), torch.zeros(4), torch.zeros(4, 4))[0]
    assert h.requires_grad
    with torch.no_grad():  # no gradient wanted: nothing to save, no copy (the tensor itself goes through)
        assert addnorm.rms_norm(x, 8, w).shape == x.shape
    assert AF.core.uninferred((x, r), (torch.ones(8),))[0] is x  # nothing requires grad: not copied
