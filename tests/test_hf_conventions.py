"""HuggingFace conventions: Llama's cast order and Gemma's zero-centred weight, on every backend.

The reference formulas are HuggingFace's, written out; when ``transformers`` is installed the
real modules are compared too.
"""

import pytest
import torch

import addnorm

from backends import BACKENDS


def llama_rms_norm(x, weight, eps):
    """transformers' LlamaRMSNorm.forward: normalize in float32, cast, then multiply by the weight."""
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def gemma_rms_norm(x, weight, eps):
    """transformers' GemmaRMSNorm.forward: everything in float32 with scale 1 + w, cast once."""
    h = x.float()
    out = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return (out * (1.0 + weight.float())).type_as(x)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_llama_cast_order(backend, dtype):
    x = torch.randn(6, 96, dtype=dtype) * 3
    w = (1 + 0.3 * torch.randn(96)).to(dtype)
    ours = addnorm.rms_norm(x, 96, w, 1e-6, cast_before_weight=True, backend=backend)
    ref = llama_rms_norm(x, w, 1e-6)
    assert ours.dtype == ref.dtype
    # both round at the same points: at most one unit in the last place apart (a few for float32,
    # whose statistics are summed in a different order)
    torch.testing.assert_close(ours, ref, atol=0, rtol=torch.finfo(dtype).eps * (8 if dtype == torch.float32 else 1))
    if dtype != torch.float32:  # the convention matters: the other order differs somewhere
        other = addnorm.rms_norm(x, 96, w, 1e-6, backend=backend)
        assert not torch.equal(other, ref)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_gemma_zero_centred_weight(backend, dtype):
    x = torch.randn(6, 64, dtype=dtype)
    w = (0.1 * torch.randn(64)).to(dtype)
    ours = addnorm.rms_norm(x, 64, w, 1e-6, weight_offset=1.0, backend=backend)
    rtol = torch.finfo(dtype).eps * (8 if dtype == torch.float32 else 1)
    torch.testing.assert_close(ours, gemma_rms_norm(x, w, 1e-6), atol=0, rtol=rtol)
    xg = x.float().requires_grad_()
    wg = w.float().requires_grad_()
    gw = torch.autograd.grad(addnorm.rms_norm(xg, 64, wg, 1e-6, weight_offset=1.0, backend=backend).sum(), wg)[0]
    gw_ref = torch.autograd.grad(gemma_rms_norm(xg, wg, 1e-6).sum(), wg)[0]
    torch.testing.assert_close(gw, gw_ref)


def test_against_transformers_modules():
    tr = pytest.importorskip("transformers", reason="transformers not installed (pip install -e '.[hf]')")
    from transformers.models.gemma.modeling_gemma import GemmaRMSNorm
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    llama = LlamaRMSNorm(48, eps=1e-6).to(torch.bfloat16)
    gemma = GemmaRMSNorm(48, eps=1e-6).to(torch.bfloat16)
    with torch.no_grad():
        llama.weight.copy_(1 + 0.2 * torch.randn(48))
        gemma.weight.copy_(0.2 * torch.randn(48))
    x = torch.randn(4, 5, 48, dtype=torch.bfloat16)
    ours_l = addnorm.nn.RMSNorm(48, eps=1e-6, cast_before_weight=True, dtype=torch.bfloat16)
    ours_l.load_state_dict(llama.state_dict())
    ours_g = addnorm.nn.RMSNorm(48, eps=1e-6, zero_centered=True, dtype=torch.bfloat16)
    ours_g.load_state_dict(gemma.state_dict())
    assert tr is not None
    torch.testing.assert_close(ours_l(x), llama(x), atol=0, rtol=torch.finfo(torch.bfloat16).eps)
    torch.testing.assert_close(ours_g(x), gemma(x), atol=0, rtol=torch.finfo(torch.bfloat16).eps)
