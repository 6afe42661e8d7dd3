"""A float32 residual stream beside float16/bfloat16 branch outputs (flash-attention's residual_in_fp32),
explicit output dtypes, and torch.autocast on the CPU: one pass each way in the kernels, the same answers
on both backends, each output in its own dtype."""

import pytest
import torch

import addnorm

D = 48
HALF = [torch.bfloat16, torch.float16]
from backends import BACKENDS


def _ulp(dtype, ref):
    return torch.finfo(dtype).eps * ref.abs().max().item()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", ["layer", "rms"])
@pytest.mark.parametrize("dtype", HALF, ids=str)
def test_float32_stream_beside_half_branch(dtype, kind, backend):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(6, 5, D, generator=g).to(dtype).requires_grad_()
    r = torch.randn(6, 5, D, generator=g).requires_grad_()
    w = torch.randn(D, generator=g).to(dtype).requires_grad_()
    fn = addnorm.add_layer_norm if kind == "layer" else addnorm.add_rms_norm
    y, s = fn(x, r, D, w, eps=1e-5, backend=backend)
    assert (y.dtype, s.dtype) == (dtype, torch.float32)
    assert torch.equal(s, x.float() + r)  # the sum is formed in float32, exactly
    s64 = s.double()
    if kind == "layer":
        ref = torch.nn.functional.layer_norm(s64, (D,), w.double(), eps=1e-5)
    else:
        ref = s64 * torch.rsqrt(s64.pow(2).mean(-1, keepdim=True) + 1e-5) * w.double()
    assert (y.double() - ref).abs().max() <= _ulp(dtype, ref)  # one rounding, to the branch dtype
    gy, gs = torch.randn(y.shape, generator=g).to(dtype), torch.randn(s.shape, generator=g)
    gx, gr, gw = torch.autograd.grad((y, s), (x, r, w), (gy, gs))
    assert (gx.dtype, gr.dtype, gw.dtype) == (dtype, torch.float32, dtype)
    torch.testing.assert_close(gx, gr.to(dtype))  # d(x + r)/dx = d(x + r)/dr = 1
    x2, r2, w2 = (t.detach().double().requires_grad_() for t in (x, r, w))
    y2, s2 = fn(x2, r2, D, w2, eps=1e-5, backend="torch")
    gx2, gr2, gw2 = torch.autograd.grad((y2, s2), (x2, r2, w2), (gy.double(), gs.double()))
    torch.testing.assert_close(gr, gr2.float(), atol=2e-4, rtol=2e-4)
    torch.testing.assert_close(gw.float(), gw2.float(), atol=0.05, rtol=0.02)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", HALF, ids=str)
def test_residual_in_fp32_starts_a_float32_stream(dtype, backend):
    x = torch.randn(4, D).to(dtype).requires_grad_()
    y, s = addnorm.add_rms_norm(x, None, D, residual_in_fp32=True, backend=backend)
    assert s.dtype == torch.float32 and torch.equal(s, x.float()) and y.dtype == dtype
    (gx,) = torch.autograd.grad(s.sum() + y.float().sum(), x)
    assert gx.dtype == dtype
    y32, s32 = addnorm.add_rms_norm(x.float(), None, D, residual_in_fp32=True, backend=backend)
    assert s32.dtype == torch.float32


@pytest.mark.parametrize("backend", BACKENDS)
def test_out_dtype(backend):
    x = torch.randn(4, D).bfloat16()
    y = addnorm.layer_norm(x, D, out_dtype=torch.float32, backend=backend)
    assert y.dtype == torch.float32
    ref = torch.nn.functional.layer_norm(x.double(), (D,))
    assert (y.double() - ref).abs().max() < 1e-5


def test_mixed_precision_into_buffers_in_place():
    x, r = torch.randn(8, D).bfloat16(), torch.randn(8, D)
    expect_s = x.float() + r
    out = torch.empty(8, D, dtype=torch.bfloat16)
    y, s = addnorm.add_rms_norm(x, r, D, out=out, residual_out=r)
    assert y is out and s is r and torch.equal(r, expect_s)
    with pytest.raises(ValueError, match="residual_out must have shape .* dtype torch.float32"):
        addnorm.add_rms_norm(x, torch.randn(8, D), D, residual_out=torch.empty(8, D, dtype=torch.bfloat16))


def test_wrong_pairings_are_refused():
    with pytest.raises(TypeError, match="residual dtype torch.bfloat16 must equal x dtype torch.float32"):
        addnorm.add_rms_norm(torch.randn(2, D), torch.randn(2, D).bfloat16(), D)
    with pytest.raises(TypeError, match="out_dtype"):
        addnorm.rms_norm(torch.randn(2, D), D, out_dtype=torch.int32)


def test_autocast_on_cpu_trains_a_float32_stream():
    torch.manual_seed(0)
    lin = torch.nn.Linear(D, D)
    w = torch.ones(D, requires_grad=True)
    stream = torch.randn(4, D)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        h = lin(stream)  # bfloat16 under autocast
        y, s = addnorm.add_rms_norm(h, stream, D, w)
        loss = y.float().pow(2).mean() + s.pow(2).mean()
    assert h.dtype == torch.bfloat16 and s.dtype == torch.float32 and y.dtype == torch.bfloat16
    loss.backward()
    assert lin.weight.grad is not None and torch.isfinite(lin.weight.grad).all() and w.grad.dtype == torch.float32
