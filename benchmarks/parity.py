"""Measure exactness against HuggingFace: GPT-2 load (logits, greedy generation) and HF patching.

    python benchmarks/parity.py      -> prints a table, writes benchmarks/results/parity.json

Models are built offline from GPT2Config / LlamaConfig with random weights (no hub downloads).
"""

import copy
import json
import sys
from pathlib import Path

import torch
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

from addnorm.interop import load_gpt2, patch_hf_model

CONFIGS = {
    "gpt2-small-shape (12L, 768)": dict(vocab_size=50257, n_positions=1024, n_layer=12, n_head=12, n_embd=768),
    "4L, 256, gelu": dict(vocab_size=1000, n_positions=128, n_layer=4, n_head=4, n_embd=256, activation_function="gelu"),
    "2L, 48, n_inner 40, eps 1e-6": dict(vocab_size=257, n_positions=64, n_layer=2, n_head=3, n_embd=48, n_inner=40,
                                         layer_norm_epsilon=1e-6),
}


def main() -> int:
    out = {"gpt2_load": {}, "patch": {}}
    g = torch.Generator().manual_seed(0)
    for name, cfg in CONFIGS.items():
        torch.manual_seed(0)
        hf = GPT2LMHeadModel(GPT2Config(**cfg, bos_token_id=0, eos_token_id=0)).eval()
        ours = load_gpt2(hf.state_dict(), hf.config.to_dict()).eval()
        idx = torch.randint(0, cfg["vocab_size"], (2, 64), generator=g)
        with torch.no_grad():
            diff = (hf(idx).logits - ours(idx)).abs().max().item()
        gen_hf = hf.generate(idx[:, :8], max_new_tokens=24, do_sample=False, pad_token_id=0)
        same = bool(torch.equal(ours.generate(idx[:, :8], 24), gen_hf))
        out["gpt2_load"][name] = {"max_abs_logit_diff": diff, "greedy_24_tokens_identical": same}
        print(f"GPT-2 {name:32s} max |logits - HF| = {diff:.2e}   greedy generation identical: {same}")
    torch.manual_seed(0)
    models = {
        "GPT-2 (6L, 256)": GPT2LMHeadModel(GPT2Config(vocab_size=1000, n_positions=128, n_layer=6, n_head=4, n_embd=256,
                                                      bos_token_id=0, eos_token_id=0)),
        "Llama (4L, 256, GQA)": LlamaForCausalLM(LlamaConfig(vocab_size=1000, hidden_size=256, intermediate_size=512,
                                                             num_hidden_layers=4, num_attention_heads=8,
                                                             num_key_value_heads=2, max_position_embeddings=128,
                                                             bos_token_id=0, eos_token_id=0, pad_token_id=0)),
    }
    for name, ref in models.items():
        ref.eval()
        patched = patch_hf_model(copy.deepcopy(ref))
        idx = torch.randint(0, 1000, (2, 64), generator=g)
        o_ref, o = ref(idx, labels=idx), patched(idx, labels=idx)
        gr = torch.autograd.grad(o_ref.loss, list(ref.parameters()))
        gp = torch.autograd.grad(o.loss, list(patched.parameters()))
        gdiff = max((a - b).abs().max().item() for a, b in zip(gp, gr))
        ldiff = (o.logits - o_ref.logits).abs().max().item()
        out["patch"][name] = {"max_abs_logit_diff": ldiff, "max_abs_grad_diff": gdiff, **patched._addnorm_patched}
        print(f"patched {name:22s} max |logits diff| = {ldiff:.2e}, max |grad diff| = {gdiff:.2e}, "
              f"{patched._addnorm_patched['fused_adds']} adds fused ({', '.join(patched._addnorm_patched['structures'])})")
    d = Path(__file__).resolve().parent / "results"
    d.mkdir(exist_ok=True)
    (d / "parity.json").write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
