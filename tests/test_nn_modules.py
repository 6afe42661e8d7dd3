"""addnorm.nn modules are drop-ins for torch.nn.LayerNorm / torch.nn.RMSNorm."""

import io

import pytest
import torch
from torch import nn

import addnorm
from addnorm import nn as ann

LN_CONFIGS = [
    dict(normalized_shape=16),
    dict(normalized_shape=(3, 5), eps=1e-6),
    dict(normalized_shape=[7], elementwise_affine=False),
    dict(normalized_shape=9, bias=False),
    dict(normalized_shape=4, dtype=torch.float64),
    dict(normalized_shape=4, dtype=torch.bfloat16),
]
RMS_CONFIGS = [
    dict(normalized_shape=16),
    dict(normalized_shape=(3, 5), eps=1e-6),
    dict(normalized_shape=7, elementwise_affine=False),
    dict(normalized_shape=4, dtype=torch.float64),
]


def _x(shape, dtype):
    return torch.randn((5,) + tuple(shape), dtype=dtype)


@pytest.mark.parametrize("cfg", LN_CONFIGS, ids=str)
def test_layer_norm_is_a_drop_in(cfg):
    ours, theirs = ann.LayerNorm(**cfg), nn.LayerNorm(**cfg)
    assert ours.normalized_shape == theirs.normalized_shape and ours.eps == theirs.eps
    assert ours.elementwise_affine == theirs.elementwise_affine
    assert list(ours.state_dict()) == list(theirs.state_dict())
    assert [n for n, _ in ours.named_parameters()] == [n for n, _ in theirs.named_parameters()]
    assert (ours.bias is None) == (theirs.bias is None)
    assert repr(ours) == repr(theirs)
    if theirs.weight is not None:  # give them non-trivial parameters, then move them across
        with torch.no_grad():
            for p in theirs.parameters():
                p.copy_(torch.randn_like(p))
    ours.load_state_dict(theirs.state_dict())
    theirs.load_state_dict(ours.state_dict())
    dtype = cfg.get("dtype", torch.float32)
    x = _x(ours.normalized_shape, dtype).requires_grad_()
    y, y_ref = ours(x), theirs(x)
    tol = dict(atol=1e-5, rtol=0) if dtype != torch.bfloat16 else dict(atol=2e-2, rtol=0)
    torch.testing.assert_close(y, y_ref, **tol)
    dy = torch.randn_like(y)
    ins = [x] + list(theirs.parameters())
    g = torch.autograd.grad((y * dy).sum(), [x] + list(ours.parameters()))
    g_ref = torch.autograd.grad((y_ref * dy).sum(), ins)
    for a, b in zip(g, g_ref):
        if dtype == torch.bfloat16:
            torch.testing.assert_close(a.float(), b.float(), atol=0.5, rtol=5e-2)
        else:
            torch.testing.assert_close(a, b)


@pytest.mark.parametrize("cfg", RMS_CONFIGS, ids=str)
def test_rms_norm_is_a_drop_in(cfg):
    ours, theirs = ann.RMSNorm(**cfg), nn.RMSNorm(**cfg)
    assert ours.normalized_shape == theirs.normalized_shape and ours.eps == theirs.eps
    assert list(ours.state_dict()) == list(theirs.state_dict())
    assert repr(ours) == repr(theirs)
    if theirs.weight is not None:
        with torch.no_grad():
            theirs.weight.copy_(torch.randn_like(theirs.weight))
    ours.load_state_dict(theirs.state_dict())
    x = _x(ours.normalized_shape, cfg.get("dtype", torch.float32)).requires_grad_()
    y, y_ref = ours(x), theirs(x)
    torch.testing.assert_close(y, y_ref, atol=1e-5, rtol=0)
    dy = torch.randn_like(y)
    g = torch.autograd.grad((y * dy).sum(), [x] + list(ours.parameters()))
    g_ref = torch.autograd.grad((y_ref * dy).sum(), [x] + list(theirs.parameters()))
    for a, b in zip(g, g_ref):
        torch.testing.assert_close(a, b)


def test_bias_false_creates_no_bias():
    m = ann.LayerNorm(8, bias=False)
    assert m.bias is None and "bias" not in m.state_dict()


def test_state_dict_round_trips_through_torch_save():
    m = ann.AddLayerNorm(12)
    with torch.no_grad():
        m.weight.uniform_()
    buf = io.BytesIO()
    torch.save(m.state_dict(), buf)
    buf.seek(0)
    plain = nn.LayerNorm(12)
    plain.load_state_dict(torch.load(buf))
    torch.testing.assert_close(plain.weight, m.weight)


@pytest.mark.parametrize("cls,plain,fn", [(ann.AddLayerNorm, nn.LayerNorm, torch.nn.functional.layer_norm),
                                          (ann.AddRMSNorm, nn.RMSNorm, torch.nn.functional.rms_norm)])
def test_add_norm_modules(cls, plain, fn):
    m = cls(32)
    x, r = torch.randn(4, 6, 32), torch.randn(4, 6, 32)
    y, s = m(x, r)
    torch.testing.assert_close(s, x + r, atol=0, rtol=0)
    torch.testing.assert_close(y, plain(32)(x + r), atol=1e-5, rtol=0)
    y0, s0 = m(x)  # first block: no residual yet
    assert s0 is x
    torch.testing.assert_close(y0, plain(32)(x), atol=1e-5, rtol=0)


def test_zero_centered_rms_norm_starts_as_identity_scale():
    m = ann.RMSNorm(10, zero_centered=True)
    assert torch.equal(m.weight, torch.zeros(10))
    x = torch.randn(3, 10)
    torch.testing.assert_close(m(x), nn.RMSNorm(10)(x), atol=1e-6, rtol=0)
    assert "zero_centered=True" in repr(m)


def test_module_backend_is_honoured():
    m = ann.LayerNorm(8, backend="torch")
    m(torch.randn(2, 8))
    assert addnorm.last_backend() == "torch"


def test_tutorial_layer_norm_module():
    m = ann.TutorialLayerNorm(8)
    assert [n for n, _ in m.named_parameters()] == ["weight", "bias"]
    x = torch.randn(2, 8)
    torch.testing.assert_close(m(x), addnorm.tutorial_layer_norm(x, m.weight, m.bias, 1e-6))
