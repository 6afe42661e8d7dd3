"""The model's norm slots use the fused forms: LayerNorm Scaling's 1/sqrt(l) folded into the norm's
parameters (no extra pass), sandwich / Peri-LN's output norm as norm-then-add."""

import pytest
import torch

import addnorm.functional.fused as FF
from addnorm.model import GPT, GPTConfig
from addnorm.nn import AddLayerNorm, AddRMSNorm
from addnorm.nn.factory import make_norm


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kind", ["layer", "rms", "rms-zero-centred", "dyt", "derf", "batch"])
def test_out_scale_is_the_scaled_norm_with_the_same_gradients(kind, dtype):
    torch.manual_seed(0)
    if kind == "rms-zero-centred":
        norm = AddRMSNorm(24, eps=1e-6, zero_centered=True)
        torch.nn.init.normal_(norm.weight, std=0.3)
    else:
        norm = make_norm(kind, 24)
        for p in norm.parameters():
            if p.dim():
                torch.nn.init.normal_(p, 1.0, 0.3)
    norm = norm.to(dtype)
    x, r = torch.randn(5, 7, 24, dtype=dtype), torch.randn(5, 7, 24, dtype=dtype)
    c = 1 / 3 ** 0.5
    y, s = norm(x, r, out_scale=c)
    y_ref, s_ref = norm(x, r)
    assert torch.equal(s, s_ref)
    tol = {torch.float32: 2e-6, torch.bfloat16: 1.6e-2}[dtype]
    torch.testing.assert_close(y.float(), (y_ref.float() * c), atol=tol, rtol=tol)
    up = torch.randn_like(y_ref, dtype=torch.float32)
    params = [p for p in norm.parameters()]
    g = torch.autograd.grad((y.float() * up).sum(), params)
    g_ref = torch.autograd.grad((y_ref.float() * c * up).sum(), params)
    for a, e in zip(g, g_ref, strict=True):
        torch.testing.assert_close(a.float(), e.float(), atol=tol * 20, rtol=tol * 4)


def test_lns_does_not_multiply_the_activations(monkeypatch):
    """The scale travels with the norm's parameters: no elementwise multiply of a (B, T, C) tensor by 1/sqrt(l)."""
    m = GPT(GPTConfig(vocab_size=32, block_size=8, n_layer=3, n_head=2, n_embd=16, placement="lns"))
    idx = torch.randint(0, 32, (2, 8))
    seen = []

    class Spy(torch.overrides.TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            if getattr(func, "__name__", "") in ("mul", "__mul__", "__rmul__", "mul_") and any(
                    isinstance(a, float) for a in args) and any(
                    isinstance(a, torch.Tensor) and a.dim() == 3 for a in args):
                seen.append(args)
            return func(*args, **(kwargs or {}))

    with Spy():
        m(idx)
    assert not seen, f"{len(seen)} activation-sized scalings by a constant"


def test_sandwich_output_norm_runs_as_norm_then_add(monkeypatch):
    calls = []
    real = FF.layer_norm_add

    def spy(*a, **k):
        calls.append(a[0].shape)
        return real(*a, **k)

    monkeypatch.setattr(FF, "layer_norm_add", spy)
    m = GPT(GPTConfig(vocab_size=32, block_size=8, n_layer=2, n_head=2, n_embd=16, placement="sandwich"))
    idx = torch.randint(0, 32, (2, 8))
    logits, loss = m(idx, idx)
    loss.backward()
    assert len(calls) == 4  # attention and MLP sub-layers of 2 blocks
    assert all(p.grad is not None for p in m.parameters())


def test_add_to_matches_the_unfused_order():
    torch.manual_seed(1)
    for norm in (AddLayerNorm(16), AddRMSNorm(16, eps=1e-6), make_norm("dyt", 16), make_norm("derf", 16)):
        f, x = torch.randn(3, 16), torch.randn(3, 16)
        torch.testing.assert_close(norm.add_to(f, x), x + norm(f)[0], atol=1e-6, rtol=1e-6)
