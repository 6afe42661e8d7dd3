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
    with pytest.raises(ValueError, match="the state_dict does not match the config: shapes .*transformer.wte.weight"):
        load_gpt2(hf.state_dict(), CONFIGS[2])


def test_loads_an_in_memory_model_and_says_what_else_to_pass():
    hf = _hf(CONFIGS[1])
    ours = load_gpt2(hf).eval()  # the model itself: weights and config
    idx = torch.randint(0, 257, (1, 7))
    with torch.no_grad():
        assert (hf(idx).logits - ours(idx)).abs().max() <= 1e-5
    with pytest.raises(TypeError, match="already an addnorm GPT"):
        load_gpt2(ours)
    with pytest.raises(TypeError, match="pass a GPT2LMHeadModel / GPT2Model, its state_dict"):
        load_gpt2(torch.nn.Linear(2, 2))


def test_untied_checkpoint_without_its_head_is_refused():
    hf = _hf(CONFIGS[3])  # tie_word_embeddings=False
    sd = {k: v for k, v in hf.state_dict().items() if k != "lm_head.weight"}
    with pytest.raises(ValueError, match="no lm_head.weight but the config is untied"):
        load_gpt2(sd, hf.config.to_dict())


def test_errors_name_the_checkpoints_keys_and_file(tmp_path):
    hf = _hf(CONFIGS[0])
    sd = {k: v for k, v in hf.state_dict().items() if k != "transformer.h.1.ln_2.bias"}
    sd["transformer.h.0.extra.weight"] = torch.zeros(3)
    with pytest.raises(ValueError, match=r"missing \['transformer.h.1.ln_2.bias'\].*unexpected "
                                         r"\['transformer.h.0.extra.weight'\]"):
        load_gpt2(sd, hf.config.to_dict())
    hf.save_pretrained(tmp_path / "m")
    (tmp_path / "m" / "model.safetensors").write_bytes(b"not a checkpoint at all")
    with pytest.raises(ValueError, match=r"could not read .*model.safetensors: .*corrupt"):
        load_gpt2(tmp_path / "m")
    bin_path = tmp_path / "w.bin"
    bin_path.write_bytes(b"\x80\x02garbage")
    with pytest.raises(ValueError, match=r"could not read .*w.bin"):
        load_gpt2(bin_path, hf.config.to_dict())


def test_incomplete_or_foreign_configs_are_named():
    hf = _hf(CONFIGS[0])
    cfg = {k: v for k, v in hf.config.to_dict().items() if k not in ("n_embd", "n_head")}
    with pytest.raises(ValueError, match=r"GPT-2 config is missing \['n_head', 'n_embd'\]"):
        load_gpt2(hf.state_dict(), cfg)
    with pytest.raises(ValueError, match="model_type 'llama'"):
        config_from_hf(dict(CONFIGS[0], model_type="llama"))


def test_sharded_save_pretrained_directory(tmp_path):
    hf = _hf(CONFIGS[1])
    hf.save_pretrained(tmp_path / "sharded", max_shard_size="20KB")
    assert (tmp_path / "sharded" / "model.safetensors.index.json").exists()
    ours = load_gpt2(tmp_path / "sharded").eval()
    idx = torch.randint(0, 257, (2, 9))
    with torch.no_grad():
        assert (hf(idx).logits - ours(idx)).abs().max() <= 1e-5


def test_bias_free_model_round_trips_through_save_gpt2(tmp_path):
    torch.manual_seed(4)
    ours = GPT(GPTConfig(vocab_size=70, block_size=16, n_layer=2, n_head=2, n_embd=32, bias=False)).eval()
    d = save_gpt2(ours, tmp_path / "nobias")
    back = load_gpt2(d).eval()
    assert not back.config.bias and all(not n.endswith(".bias") for n, _ in back.named_parameters())
    hf = GPT2LMHeadModel.from_pretrained(d).eval()  # a complete GPT-2 checkpoint: zero biases
    idx = torch.randint(0, 70, (2, 12))
    with torch.no_grad():
        ref = ours(idx)
        assert torch.equal(back(idx), ref)
        assert (hf(idx).logits - ref).abs().max() <= 1e-5
