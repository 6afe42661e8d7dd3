"""Fine-tune tiny HuggingFace models (built offline) with HF Trainer on the embedded corpus, patched by
``patch_hf_model`` and not: per-step losses, step time and peak memory, side by side.

Each run is one process (``--one``), so its peak resident memory (``ru_maxrss``) is its own; every run
imports the same libraries, so the patched-vs-unpatched difference is the models'. Step time is the
median of the steps after the first two (Trainer's callbacks around each optimizer step). Losses are read
from the model's own output at every step (Trainer's log rounds them to 4 digits).

    python benchmarks/bench_hf_finetune.py [--steps 20] [--families llama,gpt2,neox,olmo2] [--hidden 768]

Writes benchmarks/results/hf_finetune.json.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

# a Llama-like, GPT-2, a parallel-residual family (GPT-NeoX) and a post-branch-norm one (OLMo 2)
FAMILIES = ("llama", "gpt2", "neox", "olmo2")


@dataclass(frozen=True)
class FinetuneConfig:
    family: str = "llama"  # llama | gpt2 | neox | olmo2
    steps: int = 20
    batch: int = 4
    seq_len: int = 128
    hidden: int = 768  # GPT-2-small's width
    layers: int = 2
    heads: int = 4
    lr: float = 1e-3
    warmup: int = 10  # linear warmup steps: without them GPT-2 spikes at this lr (see the README)
    seed: int = 0

    def __post_init__(self):
        if self.family not in FAMILIES:
            raise ValueError(f"family must be one of {FAMILIES}, got {self.family!r}")
        for name in ("steps", "batch", "seq_len", "hidden", "layers", "heads"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.warmup < 0:
            raise ValueError(f"warmup must be >= 0, got {self.warmup}")


def build_model(cfg: FinetuneConfig):
    import transformers as T

    torch.manual_seed(cfg.seed)
    if cfg.family == "gpt2":
        return T.GPT2LMHeadModel(T.GPT2Config(vocab_size=256, n_positions=cfg.seq_len, n_layer=cfg.layers,
                                              n_head=cfg.heads, n_embd=cfg.hidden, bos_token_id=0, eos_token_id=0))
    common = dict(vocab_size=256, hidden_size=cfg.hidden, intermediate_size=4 * cfg.hidden, num_hidden_layers=cfg.layers,
                  num_attention_heads=cfg.heads, max_position_embeddings=cfg.seq_len, bos_token_id=0, eos_token_id=0,
                  pad_token_id=0)
    if cfg.family == "neox":  # parallel residual: x + attn(ln1(x)) + mlp(ln2(x))
        return T.GPTNeoXForCausalLM(T.GPTNeoXConfig(**common, use_parallel_residual=True))
    if cfg.family == "olmo2":  # post-branch norms: x + norm(attn(x)), then h + norm(mlp(h))
        return T.Olmo2ForCausalLM(T.Olmo2Config(**common, num_key_value_heads=max(1, cfg.heads // 2)))
    return T.LlamaForCausalLM(T.LlamaConfig(**common, num_key_value_heads=max(1, cfg.heads // 2)))


def dataset(cfg: FinetuneConfig):
    """steps * batch byte sequences of seq_len from the embedded corpus (consecutive, non-overlapping)."""
    from ..harness.corpus import load_corpus

    data = load_corpus().data.long()
    n = cfg.steps * cfg.batch
    if len(data) < n * cfg.seq_len:
        raise ValueError(f"the corpus holds {len(data)} bytes; {n} sequences of {cfg.seq_len} need more")
    seqs = data[: n * cfg.seq_len].view(n, cfg.seq_len)
    return [{"input_ids": s, "labels": s} for s in seqs]


def run(cfg: FinetuneConfig, patched: bool) -> dict:
    """Train cfg.steps optimizer steps with HF Trainer; the per-step losses, step times and peak memory."""
    import transformers as T

    from ..interop import patch_hf_model

    model = build_model(cfg)
    if patched:
        patch_hf_model(model)
    losses, times = [], []

    def record(module, inputs, output):
        if module.training and getattr(output, "loss", None) is not None:
            losses.append(output.loss.item())

    model.register_forward_hook(record)

    class StepTimer(T.TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            self.t0 = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            times.append(time.perf_counter() - self.t0)

    with tempfile.TemporaryDirectory() as out:
        args = T.TrainingArguments(output_dir=out, max_steps=cfg.steps, per_device_train_batch_size=cfg.batch,
                                   learning_rate=cfg.lr, weight_decay=0.01, warmup_steps=cfg.warmup,
                                   lr_scheduler_type="linear",
                                   logging_strategy="no", save_strategy="no", report_to=[], seed=cfg.seed,
                                   data_seed=cfg.seed, dataloader_num_workers=0, disable_tqdm=True,
                                   use_cpu=not torch.cuda.is_available())
        trainer = T.Trainer(model=model, args=args, train_dataset=dataset(cfg), callbacks=[StepTimer()])
        trainer.train()
    steady = times[2:] or times
    return {"config": asdict(cfg), "patched": patched, "losses": losses,
            "fusions": model._addnorm_patched["fusions"] if patched else {},
            "step_ms": 1e3 * statistics.median(steady), "step_ms_p10_p90": _p10_p90(steady),
            "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "fused_adds": model._addnorm_patched["fused_adds"] if patched else 0}


def _p10_p90(ts):
    if len(ts) < 2:
        return [1e3 * ts[0]] * 2 if ts else [0.0, 0.0]
    q = statistics.quantiles(ts, n=10, method="inclusive")
    return [1e3 * q[0], 1e3 * q[-1]]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="bench_hf_finetune.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--families", default=",".join(FAMILIES), help="comma separated, of llama, gpt2 (default all)")
    p.add_argument("--steps", type=int, default=FinetuneConfig.steps, help="optimizer steps (default %(default)s)")
    p.add_argument("--hidden", type=int, default=FinetuneConfig.hidden, help="width (default %(default)s)")
    p.add_argument("--layers", type=int, default=FinetuneConfig.layers, help="layers (default %(default)s)")
    p.add_argument("--out", default="benchmarks/results", help="directory for the JSON (default %(default)s)")
    p.add_argument("--one", nargs=2, metavar=("FAMILY", "PATCHED"), help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.one:  # a single run, in its own process: JSON on stdout
        cfg = replace(FinetuneConfig(family=a.one[0]), steps=a.steps, hidden=a.hidden, layers=a.layers)
        print(json.dumps(run(cfg, a.one[1] == "1")))
        return 0
    families = [f for f in a.families.split(",") if f]
    bad = [f for f in families if f not in FAMILIES]
    if bad:
        p.error(f"--families: unknown {bad}; valid: {list(FAMILIES)}")
    if a.steps <= 2:
        p.error(f"--steps must be at least 3 (the first two are not timed), got {a.steps}")
    for name in ("hidden", "layers"):
        if getattr(a, name) <= 0:
            p.error(f"--{name} must be positive, got {getattr(a, name)}")
    if a.hidden % FinetuneConfig.heads:
        p.error(f"--hidden must be a multiple of the {FinetuneConfig.heads} heads, got {a.hidden}")
    results = []
    for fam in families:
        for patched in (False, True):
            out = subprocess.run([sys.executable, "-m", "addnorm.bench.hf_finetune", "--one", fam,
                                  str(int(patched)), "--steps", str(a.steps), "--hidden", str(a.hidden),
                                  "--layers", str(a.layers)], capture_output=True, text=True)
            if out.returncode:
                sys.stderr.write(out.stderr[-3000:])
                return out.returncode
            results.append(json.loads(out.stdout.strip().splitlines()[-1]))
            r = results[-1]
            print(f"{fam:6} {'patched' if patched else 'HF':8} final loss {r['losses'][-1]:.4f}  "
                  f"step {r['step_ms']:.1f} ms  peak RSS {r['peak_rss_mib']:.0f} MiB")
    for fam in families:
        hf, ours = [r for r in results if r["config"]["family"] == fam]
        diff = max(abs(x - y) for x, y in zip(hf["losses"], ours["losses"]))
        print(f"{fam:6} max |loss diff| over {len(hf['losses'])} steps {diff:.2e}; step time patched/HF "
              f"{ours['step_ms'] / hf['step_ms']:.3f}; peak RSS patched - HF {ours['peak_rss_mib'] - hf['peak_rss_mib']:+.0f} MiB")
    out_dir = Path(a.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    meta = {"torch": torch.__version__, "threads": torch.get_num_threads(),
            "device": "cuda" if torch.cuda.is_available() else "cpu"}
    (out_dir / "hf_finetune.json").write_text(json.dumps({"conditions": meta, "runs": results}, indent=1))
    print(f"results: {out_dir / 'hf_finetune.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
