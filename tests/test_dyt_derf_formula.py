"""DyT and Derf against their papers' formulas, transcribed here in plain NumPy (no torch on the reference side):

    DyT(x)  = gamma * tanh(alpha * x) + beta            Zhu et al. 2025, arXiv:2503.10622, eq. 1 / Algorithm 1;
                                                         alpha one scalar, alpha0 = 0.5, gamma = 1, beta = 0 at init
    Derf(x) = gamma * erf(alpha * x + s) + beta          Chen et al. 2025, arXiv:2512.10938; alpha, s scalars

and the gradients the formulas imply (d tanh z = 1 - tanh^2 z, d erf z = 2/sqrt(pi) exp(-z^2)); and the DyT paper's
per-slot alpha0 for LLaMA-2 7B (attention 0.8, FFN 0.2, final 0.2) landing in those slots of a model."""

import math

import numpy as np
import pytest
import torch

from addnorm.model import GPT, GPTConfig
from addnorm.model.errors import ConfigError
from addnorm.nn import Derf, DyT

SHAPES = [(5,), (3, 7), (2, 5, 123), (1, 1, 1)]
_erf = np.vectorize(math.erf)


def dyt_np(x, alpha, gamma, beta):
    return gamma * np.tanh(alpha * x) + beta


def derf_np(x, alpha, shift, gamma, beta):
    return gamma * _erf(alpha * x + shift) + beta


def dyt_grads_np(x, alpha, gamma, dy):
    """(dL/dx, dL/dalpha, dL/dgamma, dL/dbeta) for upstream dy, summed over every leading axis."""
    t = np.tanh(alpha * x)
    d = dy * gamma * (1 - t ** 2)
    lead = tuple(range(x.ndim - 1))
    return d * alpha, (d * x).sum(), (dy * t).sum(axis=lead), dy.sum(axis=lead)


def derf_grads_np(x, alpha, shift, gamma, dy):
    z = alpha * x + shift
    d = dy * gamma * 2 / math.sqrt(math.pi) * np.exp(-z ** 2)
    lead = tuple(range(x.ndim - 1))
    return d * alpha, (d * x).sum(), d.sum(), (dy * _erf(z)).sum(axis=lead), dy.sum(axis=lead)


def _params(rng, c):
    return rng.uniform(0.3, 2.0), rng.normal(size=c), rng.normal(size=c)


def test_the_initial_values_are_the_papers():
    d, e = DyT(8), Derf(8)
    # (1,) as the papers' code keeps them (and FSDP2 needs: it shards no 0-d parameter)
    assert d.alpha.shape == e.alpha.shape == e.shift.shape == (1,)
    assert d.alpha.item() == 0.5 and e.alpha.item() == 0.5 and e.shift.item() == 0.0
    for m in (d, e):
        assert torch.equal(m.weight, torch.ones(8)) and torch.equal(m.bias, torch.zeros(8))


@pytest.mark.parametrize("shape", SHAPES)
def test_dyt_forward_and_backward_are_the_formula(shape):
    rng = np.random.default_rng(sum(shape))
    x = rng.normal(scale=3.0, size=shape)  # reaches well into the saturated range
    alpha, gamma, beta = _params(rng, shape[-1])
    m = DyT(shape[-1]).double()
    with torch.no_grad():  # set in float64 (an alpha_init passes through a float32 parameter first)
        m.alpha.fill_(alpha)
        m.weight.copy_(torch.from_numpy(gamma))
        m.bias.copy_(torch.from_numpy(beta))
    xt = torch.from_numpy(x).requires_grad_()
    y, s = m(xt)
    np.testing.assert_allclose(y.detach().numpy(), dyt_np(x, alpha, gamma, beta), rtol=1e-13, atol=1e-14)
    assert s is xt
    dy = rng.normal(size=shape)
    y.backward(torch.from_numpy(dy))
    want = dyt_grads_np(x, alpha, gamma, dy)
    for got, w in zip((xt.grad, m.alpha.grad, m.weight.grad, m.bias.grad), want):
        np.testing.assert_allclose(got.numpy(), w, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("shape", SHAPES)
def test_derf_forward_and_backward_are_the_formula(shape):
    rng = np.random.default_rng(1 + sum(shape))
    x = rng.normal(scale=3.0, size=shape)
    alpha, gamma, beta = _params(rng, shape[-1])
    shift = rng.uniform(-0.5, 0.5)
    m = Derf(shape[-1]).double()
    with torch.no_grad():
        m.alpha.fill_(alpha)
        m.shift.fill_(shift)
        m.weight.copy_(torch.from_numpy(gamma))
        m.bias.copy_(torch.from_numpy(beta))
    xt = torch.from_numpy(x).requires_grad_()
    y, _ = m(xt)
    np.testing.assert_allclose(y.detach().numpy(), derf_np(x, alpha, shift, gamma, beta), rtol=1e-13, atol=1e-14)
    dy = rng.normal(size=shape)
    y.backward(torch.from_numpy(dy))
    want = derf_grads_np(x, alpha, shift, gamma, dy)
    for got, w in zip((xt.grad, m.alpha.grad, m.shift.grad, m.weight.grad, m.bias.grad), want):
        np.testing.assert_allclose(got.numpy(), w, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("cls", [DyT, Derf])
def test_the_residual_form_applies_the_formula_to_the_sum(cls):
    rng = np.random.default_rng(7)
    x, r = rng.normal(size=(4, 6)), rng.normal(size=(4, 6))
    m = cls(6).double()
    with torch.no_grad():
        m.alpha.fill_(1.3)
    y, s = m(torch.from_numpy(x), torch.from_numpy(r))
    want = dyt_np(x + r, 1.3, 1.0, 0.0) if cls is DyT else derf_np(x + r, 1.3, 0.0, 1.0, 0.0)
    np.testing.assert_allclose(y.detach().numpy(), want, rtol=1e-13)
    np.testing.assert_allclose(s.numpy(), x + r, rtol=0)


@pytest.mark.parametrize("norm", ["dyt", "derf"])
@pytest.mark.parametrize("placement", ["pre", "sandwich", "post"])
def test_the_per_slot_alpha_lands_in_its_slot(norm, placement):
    final = 0.5 if placement == "post" else 0.2  # post-norm has no final norm: an alpha for it is refused
    if placement == "post":
        with pytest.raises(ConfigError, match="final"):
            GPTConfig(vocab_size=256, block_size=16, n_layer=2, n_head=2, n_embd=16, norm=norm,
                      placement=placement, dyt_alpha=(0.8, 0.2, 0.2))
    model = GPT(GPTConfig(vocab_size=256, block_size=16, n_layer=2, n_head=2, n_embd=16, norm=norm,
                          placement=placement, dyt_alpha=(0.8, 0.2, final)))
    seen = {}
    for name, m in model.named_modules():
        if isinstance(m, DyT | Derf):
            slot = "attn" if ".attn." in name else "mlp" if ".mlp." in name else "final"
            seen.setdefault(slot, set()).add(round(m.alpha.item(), 6))
    assert seen["attn"] == {0.8} and seen["mlp"] == {0.2}
    assert seen.get("final", {0.2}) == {0.2}  # post-norm has no final norm


@pytest.mark.parametrize("backend, dtype", [("cpu", torch.float32), ("torch", torch.float32), (None, torch.float64)])
def test_alpha_and_shift_may_be_numbers_or_tensors(backend, dtype):
    """add_dyt / add_derf take alpha (and shift) as a number as well as a one-element tensor: the same result,
    and the formula's (a number was refused: 'alpha must be a one-element torch.Tensor')."""
    from addnorm import add_derf, add_dyt

    torch.manual_seed(0)
    x, r = torch.randn(4, 33, dtype=dtype), torch.randn(4, 33, dtype=dtype)
    w, b = torch.randn(33, dtype=dtype), torch.randn(33, dtype=dtype)
    as_tensor = torch.tensor(0.7, dtype=torch.float64 if dtype == torch.float64 else torch.float32)
    y, s = add_dyt(x, r, 0.7, w, b, backend=backend)
    y_t, s_t = add_dyt(x, r, as_tensor, w, b, backend=backend)
    assert torch.equal(y, y_t) and torch.equal(s, s_t)
    tol = 1e-12 if dtype == torch.float64 else 1e-5
    want = dyt_np((x + r).double().numpy(), 0.7, w.double().numpy(), b.double().numpy())
    np.testing.assert_allclose(y.double().numpy(), want, atol=tol, rtol=tol)
    y, _ = add_derf(x, r, 0.7, -0.2, w, b, backend=backend)
    y_t, _ = add_derf(x, r, as_tensor, torch.tensor(-0.2, dtype=as_tensor.dtype), w, b, backend=backend)
    assert torch.equal(y, y_t)
    want = derf_np((x + r).double().numpy(), 0.7, -0.2, w.double().numpy(), b.double().numpy())
    np.testing.assert_allclose(y.double().numpy(), want, atol=tol, rtol=tol)
    xg = x.clone().requires_grad_()
    add_dyt(xg, None, 2, backend=backend)[0].sum().backward()  # an int is a number too; x still gets its gradient
    np.testing.assert_allclose(xg.grad.double().numpy(), 2 * (1 - np.tanh(2 * x.double().numpy()) ** 2),
                               atol=tol, rtol=tol)
