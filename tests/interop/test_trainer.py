"""One line in a Trainer script: a model patched (or loaded patched) before ``Trainer(...)`` trains as the
unpatched one does -- with gradient checkpointing on, which must really checkpoint -- and its saved
checkpoint is a plain HF checkpoint that loads without addnorm."""

import copy
import subprocess
import sys

import pytest
import torch

T = pytest.importorskip("transformers", reason="transformers not installed (pip install -e '.[hf]')")
pytest.importorskip("accelerate", reason="accelerate not installed (pip install -e '.[hf]'); HF Trainer needs it")

from addnorm.interop import AutoAddNormForCausalLM, patch_hf_model  # noqa: E402

V = 64


def tiny(family):
    torch.manual_seed(0)
    if family == "llama":
        return T.LlamaForCausalLM(T.LlamaConfig(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                                num_attention_heads=2, num_key_value_heads=1,
                                                max_position_embeddings=32, pad_token_id=0))
    return T.GPTNeoXForCausalLM(T.GPTNeoXConfig(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                                num_attention_heads=2, max_position_embeddings=32, pad_token_id=0))


def data(n=8, seq=16):
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(1, V, (n, seq), generator=g)
    return [{"input_ids": s, "labels": s} for s in ids]


def train(model, out, checkpointing):
    losses = []
    model.register_forward_hook(lambda m, i, o: losses.append(o.loss.item()) if m.training else None)
    args = T.TrainingArguments(output_dir=str(out), max_steps=4, per_device_train_batch_size=4, learning_rate=3e-3,
                               logging_strategy="no", save_strategy="no", report_to=[], seed=0, data_seed=0,
                               dataloader_num_workers=0, disable_tqdm=True, use_cpu=True,
                               gradient_checkpointing=checkpointing)
    trainer = T.Trainer(model=model, args=args, train_dataset=data())
    trainer.train()
    return trainer, losses


@pytest.mark.parametrize("family", ["llama", "neox"])
def test_patched_before_trainer_trains_as_unpatched_with_checkpointing(family, tmp_path):
    ref = tiny(family)
    m = patch_hf_model(copy.deepcopy(ref))
    calls = {}
    for name, model in (("hf", ref), ("ours", m)):  # attention runs again in backward where a layer is checkpointed
        for mod in model.modules():
            if type(mod).__name__.endswith("Attention"):
                mod.register_forward_hook(lambda *a, name=name: calls.__setitem__(name, calls.get(name, 0) + 1))
    _, hf_losses = train(ref, tmp_path / "hf", True)
    trainer, losses = train(m, tmp_path / "ours", True)
    assert calls["hf"] == 2 * 4 * 2 and calls["ours"] == calls["hf"]  # 4 steps, 2 layers, forward + recompute
    assert len(losses) == len(hf_losses) == 4
    for a, b in zip(losses, hf_losses):
        assert abs(a - b) <= 1e-5, (losses, hf_losses)
    assert m._addnorm_patched["fused_adds"] >= 2
    # save_model writes a plain HF checkpoint: it loads with transformers alone, addnorm not importable
    trainer.save_model(str(tmp_path / "saved"))
    code = ("import sys; sys.modules['addnorm'] = None\n"
            "import torch, transformers as T\n"
            f"m = T.AutoModelForCausalLM.from_pretrained({str(tmp_path / 'saved')!r}).eval()\n"
            "ids = torch.arange(1, 11).view(1, 10)\n"
            f"torch.save(m(ids).logits, {str(tmp_path / 'logits.pt')!r})\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    m.eval()
    with torch.no_grad():
        ours = m(torch.arange(1, 11).view(1, 10)).logits
    assert (torch.load(tmp_path / "logits.pt") - ours).abs().max() <= 1e-5  # HF eager vs addnorm: rounding only


def test_auto_class_loads_and_patches_in_one_call(tmp_path):
    ref = tiny("llama").eval()
    ref.save_pretrained(tmp_path)
    m = AutoAddNormForCausalLM.from_pretrained(tmp_path).eval()
    assert type(m) is type(ref) and m._addnorm_patched["fused_adds"] == 4
    ids = torch.arange(1, 11).view(1, 10)
    with torch.no_grad():
        assert (m(ids).logits - ref(ids).logits).abs().max() <= 1e-5
    m2 = AutoAddNormForCausalLM.from_config(ref.config)
    assert m2._addnorm_patched["layers"] == 2
    with pytest.raises(TypeError, match="from_pretrained"):
        AutoAddNormForCausalLM()
