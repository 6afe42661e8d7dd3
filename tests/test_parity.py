"""Parity of every backend with torch.nn.functional (outputs and all gradients) and the float64 oracle."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import addnorm
from addnorm.reference import oracle
from samples import SAMPLES, make, params, upstream

from backends import BACKENDS
KINDS = ["layer", "rms"]


def _run(kind, backend, x, r, w, b, eps):
    n = len(x.shape) - len(lead_of(x, w))
    ns = w.shape if w is not None else None
    if r is None:
        if kind == "layer":
            return addnorm.layer_norm(x, ns, w, b, eps, backend=backend), None
        return addnorm.rms_norm(x, ns, w, eps, backend=backend), None
    if kind == "layer":
        return addnorm.add_layer_norm(x, r, ns, w, b, eps, backend=backend)
    return addnorm.add_rms_norm(x, r, ns, w, eps, backend=backend)


def _close_to_torch(got, want, exact):
    """assert_close defaults against PyTorch; where PyTorch itself is further than that from the
    float64 answer (normalized size 1, where LayerNorm's dx is exactly 0), ours must be at least as
    close to the exact answer as PyTorch is."""
    try:
        torch.testing.assert_close(got, want)
    except AssertionError:
        if exact is None:
            raise
        exact = torch.as_tensor(exact)
        err_ours = (got.double() - exact).abs().max()
        err_torch = (want.double() - exact).abs().max()
        assert err_ours <= err_torch + 1e-6, f"ours {err_ours:.3g} vs PyTorch's own {err_torch:.3g} from float64"


def lead_of(x, w):
    return x.shape[: x.dim() - w.dim()]


def _eager(kind, x, r, w, b, eps):
    s = x if r is None else x + r
    if kind == "layer":
        return F.layer_norm(s, w.shape, w, b, eps), (None if r is None else s)
    return F.rms_norm(s, w.shape, w, eps), (None if r is None else s)


def _grads(y, s, dy, ds, inputs):
    loss = (y * dy).sum()
    if s is not None:
        loss = loss + (s * ds).sum()
    if not any(t.requires_grad for t in inputs) or y.numel() == 0:
        return [torch.zeros_like(t) for t in inputs]
    return torch.autograd.grad(loss, inputs, allow_unused=True)


@pytest.mark.parametrize("sample", SAMPLES, ids=str)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("with_residual", [False, True], ids=["norm", "add_norm"])
@pytest.mark.parametrize("expanded_grad", [False, True], ids=["dy", "dy_expanded"])
def test_matches_torch_and_oracle_float32(sample, kind, backend, with_residual, expanded_grad):
    eps = 1e-5
    x = make(sample, seed=0, requires_grad=True)
    r = make(sample, seed=5, requires_grad=True) if with_residual else None
    w, b = params(sample)
    w.requires_grad_(True)
    b = b.requires_grad_(True) if kind == "layer" else None
    dy = upstream(sample, expanded=expanded_grad)
    ds = upstream(sample, seed=7) if with_residual else None
    inputs = [t for t in (x, r, w, b) if t is not None]

    y, s = _run(kind, backend, x, r, w, b, eps)
    assert addnorm.last_backend() == backend
    y_ref, s_ref = _eager(kind, x, r, w, b, eps)
    assert y.shape == y_ref.shape and y.dtype == y_ref.dtype
    torch.testing.assert_close(y, y_ref, atol=1e-5, rtol=0)
    if with_residual:
        torch.testing.assert_close(s, s_ref, atol=0, rtol=0)  # the residual sum is exact

    g = _grads(y, s, dy, ds, inputs)
    g_ref = _grads(y_ref, s_ref, dy, ds, inputs)

    # ... and the float64 oracle
    n_norm = w.dim()
    if kind == "layer":
        o_y, o_s = oracle.add_layer_norm(x, r if r is not None else torch.zeros_like(x), w, b, eps, n_norm)
    else:
        o_y, o_s = oracle.add_rms_norm(x, r if r is not None else torch.zeros_like(x), w, eps, n_norm)
    np.testing.assert_allclose(y.detach().double().numpy(), o_y, atol=1e-5, rtol=0)
    if x.numel():
        if kind == "layer":
            o_dx, o_dw, o_db = oracle.layer_norm_backward(dy, o_s, w, eps, n_norm)
        else:
            (o_dx, o_dw), o_db = oracle.rms_norm_backward(dy, o_s, w, eps, n_norm), None
        o_dx, _ = oracle.add_norm_backward(o_dx, ds)
        exact = [o_dx] + ([o_dx] if with_residual else []) + [o_dw] + ([o_db] if kind == "layer" else [])
        for got, want, ex in zip(g, g_ref, exact):
            _close_to_torch(got, want, ex)
        np.testing.assert_allclose(g[0].double().numpy(), o_dx, atol=2e-5, rtol=1e-4)
        np.testing.assert_allclose(g[1 + with_residual].double().numpy(), o_dw, atol=2e-4, rtol=1e-4)
        if with_residual:
            np.testing.assert_allclose(g[1].double().numpy(), o_dx, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("backend", BACKENDS)
def test_no_affine_and_no_bias(kind, backend):
    sample = SAMPLES[4]
    x = make(sample, requires_grad=True)
    dy = upstream(sample)
    if kind == "layer":
        for w, b in ((None, None), (params(sample)[0].requires_grad_(), None)):
            y = addnorm.layer_norm(x, sample.normalized_shape, w, b, backend=backend)
            y_ref = F.layer_norm(x, sample.normalized_shape, w, b)
            torch.testing.assert_close(y, y_ref, atol=1e-5, rtol=0)
            ins = [x] + ([w] if w is not None else [])
            for got, want in zip(torch.autograd.grad((y * dy).sum(), ins), torch.autograd.grad((y_ref * dy).sum(), ins)):
                torch.testing.assert_close(got, want)
    else:
        y = addnorm.rms_norm(x, sample.normalized_shape, None, backend=backend)
        y_ref = F.rms_norm(x, sample.normalized_shape, None)
        torch.testing.assert_close(y, y_ref, atol=1e-5, rtol=0)
        torch.testing.assert_close(torch.autograd.grad((y * dy).sum(), x)[0], torch.autograd.grad((y_ref * dy).sum(), x)[0])


@pytest.mark.parametrize("backend", BACKENDS)
def test_grads_of_x_and_residual_do_not_share_storage(backend):
    x = torch.randn(4, 16, requires_grad=True)
    r = torch.randn(4, 16, requires_grad=True)
    for _ in range(2):  # the second backward accumulates in place into .grad
        y, s = addnorm.add_layer_norm(x, r, 16, backend=backend)
        (y.sum() + s.pow(2).sum()).backward()
    assert x.grad.data_ptr() != r.grad.data_ptr()
    torch.testing.assert_close(x.grad, r.grad)


@pytest.mark.parametrize("backend", BACKENDS)
def test_only_residual_output_used(backend):
    x = torch.randn(3, 10, requires_grad=True)
    r = torch.randn(3, 10, requires_grad=True)
    w = torch.randn(10, requires_grad=True)
    y, s = addnorm.add_rms_norm(x, r, 10, w, backend=backend)
    gx, gw = torch.autograd.grad((2 * s).sum(), [x, w], allow_unused=True)
    torch.testing.assert_close(gx, torch.full_like(x, 2.0))
    assert gw is None or torch.count_nonzero(gw) == 0


def test_auto_picks_cpu_kernel_for_float32_and_torch_for_float64():
    x = torch.randn(2, 8)
    addnorm.layer_norm(x, 8)
    assert addnorm.last_backend() == ("cpu" if addnorm.cpu_kernel_availability().available else "torch")
    addnorm.layer_norm(x.double(), 8)
    assert addnorm.last_backend() == "torch"
    with addnorm.use_backend("torch"):
        addnorm.layer_norm(x, 8)
    assert addnorm.last_backend() == "torch"


def test_cpu_backend_refuses_what_it_cannot_run():
    with pytest.raises(RuntimeError, match="backend='cpu' cannot run this call: x has dtype torch.float64"):
        addnorm.layer_norm(torch.randn(2, 3, dtype=torch.float64), 3, backend="cpu")


@pytest.mark.parametrize("backend", ["torch", "cpu"])
def test_cast_before_weight_with_a_float32_weight_rounds_once(backend):
    """Llama order with a float32 weight beside bfloat16 activations: the product rounded once, as HF's
    ``weight * h.to(bf16)`` cast to bf16 gives -- the torch backend had rounded the weight to bf16 first
    (4001 of 16384 values one bf16 ulp away from the kernels')."""
    if backend == "cpu" and not addnorm.cpu_kernel_availability().available:
        pytest.skip("the compiled CPU kernels are not built")
    g = torch.Generator().manual_seed(0)
    xb = torch.randn(64, 256, generator=g).bfloat16()
    wf = torch.randn(256, generator=g) * 0.1 + 1
    h = xb.float() * torch.rsqrt(xb.float().pow(2).mean(-1, keepdim=True) + 1e-6)
    want = (wf * h.to(torch.bfloat16)).to(torch.bfloat16)
    assert torch.equal(addnorm.rms_norm(xb, 256, wf, 1e-6, cast_before_weight=True, backend=backend), want)


@pytest.mark.parametrize("backend", ["torch", "cpu", "triton"])
def test_cast_before_weight_rounds_to_the_inputs_dtype_not_the_outputs(backend, monkeypatch):
    """HF's Llama/Qwen3 RMSNorm returns ``weight * h.to(input_dtype)``: with a float32 weight beside bfloat16
    activations (autocast, float32 master weights) the output is float32 and h is still rounded to bfloat16 first.
    With out_dtype=float32 the kernels and formulas rounded h to the output's dtype (no rounding at all): Qwen3's
    q_norm/k_norm came out 2-4e-3 off HF's logits under autocast. The add + norm form rounds h to the stream's
    dtype (what the norm reads)."""
    if backend == "triton":
        pytest.importorskip("triton", reason="Triton is not installed (pip install -e '.[gpu]'; CI installs it)")
        monkeypatch.setenv("TRITON_INTERPRET", "1")
    elif backend == "cpu" and not addnorm.cpu_kernel_availability().available:
        pytest.skip("the compiled CPU kernels are not built")
    g = torch.Generator().manual_seed(1)
    xb, rb = torch.randn(16, 64, generator=g).bfloat16(), torch.randn(16, 64, generator=g).bfloat16()
    wf = torch.randn(64, generator=g) * 0.1 + 1

    def hf(hs):
        h = hs.float() * torch.rsqrt(hs.float().pow(2).mean(-1, keepdim=True) + 1e-6)
        return wf * h.to(hs.dtype)  # float32: the weight's dtype wins the promotion

    y = addnorm.rms_norm(xb, 64, wf, 1e-6, cast_before_weight=True, out_dtype=torch.float32, backend=backend)
    assert y.dtype == torch.float32 and torch.equal(y, hf(xb))
    y, s = addnorm.add_rms_norm(xb, rb, 64, wf, 1e-6, cast_before_weight=True, out_dtype=torch.float32,
                                backend=backend)
    assert torch.equal(s, xb + rb) and torch.equal(y, hf(xb + rb))
