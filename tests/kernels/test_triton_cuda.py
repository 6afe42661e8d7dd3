"""The Triton kernels on a real GPU (skipped without CUDA): what ``backend="auto"`` picks on CUDA tensors,
parity with torch and the float64 oracle, torch.compile, addnorm's GPT and a patched HF model."""

import copy

import pytest
import torch
import torch.nn.functional as F

import addnorm

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device (the interpreter tests in "
                                "test_triton.py cover the kernels on CPU)")
DEV = "cuda"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("shape", [(4, 1), (33, 123), (64, 768), (5, 4096), (3, 20000), (2, 3, 1000)], ids=str)
@pytest.mark.parametrize("kind", ["layer", "rms"])
def test_auto_runs_triton_on_cuda_and_matches_float64(kind, shape, dtype):
    g = torch.Generator().manual_seed(0)
    D = shape[-1]
    x, r, dy, ds = (torch.randn(shape, generator=g).to(DEV, dtype) for _ in range(4))
    w = (1 + 0.3 * torch.randn(D, generator=g)).to(DEV, dtype)
    b = (0.3 * torch.randn(D, generator=g)).to(DEV, dtype) if kind == "layer" else None
    ins = [t.requires_grad_() for t in (x, r, w, b) if t is not None]

    def run(fn_dtype, backend=None):
        xs = [t.detach().to(fn_dtype).requires_grad_() for t in ins]
        xx, rr, ww, bb = (xs + [None])[:4]
        kw = {} if backend is None else {"backend": backend}
        if kind == "layer":
            y, s = addnorm.add_layer_norm(xx, rr, D, ww, bb, **kw)
        else:
            y, s = addnorm.add_rms_norm(xx, rr, D, ww, **kw)
        return [y, s, *torch.autograd.grad([y, s], xs, [dy.to(fn_dtype), ds.to(fn_dtype)])]

    ours = run(dtype)
    assert addnorm.last_backend() == "triton"
    exact = run(torch.float64, "torch")
    eager = run(dtype, "torch")
    for o, e, ex in zip(ours, eager, exact):
        err_o, err_e = (o.double() - ex).abs().max().item(), (e.double() - ex).abs().max().item()
        atol = {torch.float32: 1e-5, torch.bfloat16: 1e-2, torch.float16: 1e-3}[dtype] * max(1, ex.abs().max().item())
        assert err_o <= 2 * err_e + atol, f"{err_o:.3g} vs torch {err_e:.3g}"


def test_compiled_fullgraph_calls_the_operator_on_cuda():
    w = torch.randn(256, device=DEV)

    def f(x, r):
        y, s = addnorm.add_rms_norm(x, r, 256, w)
        return y * 2, s

    x, r = torch.randn(8, 256, device=DEV), torch.randn(8, 256, device=DEV)
    yc, sc = torch.compile(f, fullgraph=True)(x, r)
    ye, se = f(x, r)
    torch.testing.assert_close(yc, ye)
    torch.testing.assert_close(sc, se)


def test_weight_gradient_is_deterministic_on_cuda():
    x = torch.randn(8192, 1024, device=DEV, requires_grad=True)
    w = torch.randn(1024, device=DEV, requires_grad=True)
    dy = torch.randn(8192, 1024, device=DEV)
    g1 = torch.autograd.grad(addnorm.rms_norm(x, 1024, w), w, dy)[0]
    g2 = torch.autograd.grad(addnorm.rms_norm(x, 1024, w), w, dy)[0]
    assert torch.equal(g1, g2)


def test_gpt_and_patched_hf_run_triton_on_cuda():
    from addnorm.model import GPT, GPTConfig

    torch.manual_seed(0)
    m = GPT(GPTConfig(vocab_size=64, block_size=16, n_layer=2, n_head=2, n_embd=64)).to(DEV)
    idx = torch.randint(0, 64, (2, 16), device=DEV)
    _, loss = m(idx, idx)
    assert addnorm.last_backend() == "triton"
    loss.backward()
    transformers = pytest.importorskip("transformers")
    from addnorm.interop import patch_hf_model

    ref = transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=64, n_positions=16, n_layer=2, n_head=2,
                                                               n_embd=64)).to(DEV).eval()
    patched = patch_hf_model(copy.deepcopy(ref))
    out = patched(idx)
    assert addnorm.last_backend() == "triton"
    torch.testing.assert_close(out.logits, ref(idx).logits, atol=1e-4, rtol=1e-4)
    assert F.mse_loss(out.logits, ref(idx).logits).item() < 1e-8
