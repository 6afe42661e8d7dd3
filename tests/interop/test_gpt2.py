"""Exact HuggingFace GPT-2: load, export, save, generate -- on models built offline with GPT2Config."""

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="transformers not installed (pip install -e '.[hf]')")
from transformers import GPT2Config, GPT2LMHeadModel  # noqa: E402

from addnorm.interop import config_from_hf, export_gpt2, load_gpt2, save_gpt2, to_hf_state_dict  # noqa: E402
from addnorm.model import GPT, GPTConfig  # noqa: E402

CONFIGS = [
    dict(vocab_size=101, n_positions=64, n_layer=2, n_head=4, n_embd=32),
    dict(vocab_size=257, n_positions=32, n_layer=4, n_head=2, n_embd=48, activation_function="gelu"),
    dict(vocab_size=64, n_positions=16, n_layer=3, n_head=3, n_embd=24, n_inner=40, layer_norm_epsilon=1e-6),
    dict(vocab_size=80, n_positions=24, n_layer=1, n_head=1, n_embd=16, activation_function="relu",
         tie_word_embeddings=False),
]


def _hf(cfg, seed=0):
    torch.manual_seed(seed)
    return GPT2LMHeadModel(GPT2Config(**cfg, bos_token_id=0, eos_token_id=0)).eval()


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: f"L{c['n_layer']}-d{c['n_embd']}")
def test_logits_and_greedy_generation_match(cfg):
    hf = _hf(cfg)
    ours = load_gpt2(hf.state_dict(), hf.config.to_dict()).eval()
    idx = torch.randint(0, cfg["vocab_size"], (3, min(12, cfg["n_positions"])), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        diff = (hf(idx).logits - ours(idx)).abs().max().item()
    assert diff <= 1e-5
    prompt = idx[:, :4]
    n = min(8, cfg["n_positions"] - 4)
    want = hf.generate(prompt, max_new_tokens=n, do_sample=False, pad_token_id=0)
    assert torch.equal(ours.generate(prompt, n), want)


def test_padding_mask_matches_hf():
    cfg = CONFIGS[0]
    hf = _hf(cfg)
    ours = load_gpt2(hf.state_dict(), hf.config.to_dict()).eval()
    idx = torch.randint(0, 101, (2, 10))
    mask = torch.ones(2, 10, dtype=torch.long)
    mask[1, 7:] = 0  # right padding
    with torch.no_grad():
        a = hf(idx, attention_mask=mask).logits
        b = ours(idx, attention_mask=mask)
    torch.testing.assert_close(b[mask.bool()], a[mask.bool()], atol=1e-5, rtol=0)


def test_export_round_trip_and_save_pretrained(tmp_path):
    torch.manual_seed(3)
    ours = GPT(GPTConfig(vocab_size=90, block_size=32, n_layer=2, n_head=2, n_embd=32)).eval()
    sd, cfg = export_gpt2(ours)
    hf = GPT2LMHeadModel(GPT2Config(**cfg)).eval()
    hf.load_state_dict(sd)
    idx = torch.randint(0, 90, (2, 16))
    with torch.no_grad():
        assert (hf(idx).logits - ours(idx)).abs().max() <= 1e-5
    d = save_gpt2(ours, tmp_path / "ckpt")
    hf2 = GPT2LMHeadModel.from_pretrained(d).eval()
    back = load_gpt2(d).eval()  # directory: config.json + model.safetensors
    back_file = load_gpt2(d / "model.safetensors", cfg)
    with torch.no_grad():
        ref = ours(idx)
        assert (hf2(idx).logits - ref).abs().max() <= 1e-5
        assert torch.equal(back(idx), ref) and torch.equal(back_file.eval()(idx), ref)


def test_hf_save_pretrained_directory_loads(tmp_path):
    hf = _hf(CONFIGS[1])
    hf.save_pretrained(tmp_path / "hf")
    ours = load_gpt2(tmp_path / "hf").eval()
    idx = torch.randint(0, 257, (1, 9))
    with torch.no_grad():
        assert (hf(idx).logits - ours(idx)).abs().max() <= 1e-5


def test_unsupported_and_bad_inputs():
    with pytest.raises(ValueError, match="scale_attn_by_inverse_layer_idx"):
        config_from_hf(dict(CONFIGS[0], scale_attn_by_inverse_layer_idx=True))
    with pytest.raises(ValueError, match="only pre-norm LayerNorm models"):
        to_hf_state_dict(GPT(GPTConfig(vocab_size=8, block_size=4, n_layer=1, n_head=1, n_embd=4, placement="post")))
    with pytest.raises(ValueError, match="config is required"):
        load_gpt2({"wte.weight": torch.zeros(2, 2)})
    hf = _hf(CONFIGS[0])
    with pytest.raises(ValueError, match="checkpoint does not match the config"):
        load_gpt2(hf.state_dict(), CONFIGS[2])
