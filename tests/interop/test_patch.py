"""Patching HF GPT-2 and Llama with fused Add & Norm leaves outputs and gradients unchanged."""

import copy

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="transformers not installed (pip install -e '.[hf]')")
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM  # noqa: E402

import addnorm  # noqa: E402
from addnorm.interop import patch_hf_model  # noqa: E402


def _models():
    torch.manual_seed(0)
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=120, n_positions=32, n_layer=3, n_head=4, n_embd=64,
                                      bos_token_id=0, eos_token_id=0))
    llama = LlamaForCausalLM(LlamaConfig(vocab_size=120, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
                                         bos_token_id=0, eos_token_id=0, pad_token_id=0))
    return {"gpt2": gpt2, "llama": llama}


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_patched_outputs_and_gradients_unchanged(name):
    ref = _models()[name].eval()
    patched = patch_hf_model(copy.deepcopy(ref))
    assert patched._addnorm_patched["layers"] == 3
    idx = torch.randint(0, 120, (2, 16), generator=torch.Generator().manual_seed(0))
    out_ref = ref(idx, labels=idx)
    out = patched(idx, labels=idx)
    assert addnorm.last_backend() in ("cpu", "torch")
    assert (out.logits - out_ref.logits).abs().max() <= 1e-5
    g_ref = torch.autograd.grad(out_ref.loss, list(ref.parameters()))
    g = torch.autograd.grad(out.loss, list(patched.parameters()))
    for a, b in zip(g, g_ref):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


def test_patch_shares_parameters_and_state_dict_keys():
    m = _models()["gpt2"]
    keys = list(m.state_dict())
    w = m.transformer.h[0].ln_2.weight
    patch_hf_model(m)
    assert list(m.state_dict()) == keys
    assert m.transformer.h[0].ln_2.weight is w
    assert isinstance(m.transformer.ln_f, addnorm.nn.LayerNorm)


def test_patch_refuses_models_it_does_not_know():
    with pytest.raises(ValueError, match="has no GPT2Block or LlamaDecoderLayer"):
        patch_hf_model(torch.nn.Sequential(torch.nn.Linear(2, 2)))
