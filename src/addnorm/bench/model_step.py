"""One training step of a GPT-2-small-shaped model: fused Add & Norm vs eager add + LayerNorm.

Both variants are the same ``addnorm.model.GPT`` (12 layers, 768 wide, 12 heads, GPT-2's
vocabulary), the same weights and the same batch; they differ only in the backend of the Add &
Norm units: ``cpu`` (fused kernels, the add folded into the next norm) or ``torch`` (``x + f``
then ``F.layer_norm``, which is what ``nn.LayerNorm`` runs). Each variant runs in its own child
process so that its peak resident memory (ru_maxrss) is its own.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import torch

from .cpu_cells import TUNED_MALLOC
from ..harness.timing import measure


def one_variant(backend: str, batch: int, seq: int, steps: int) -> dict:
    import addnorm
    from addnorm.model import GPT, GPTConfig

    torch.manual_seed(0)
    model = GPT(GPTConfig(backend=backend))
    idx = torch.randint(0, model.config.vocab_size, (batch, seq), generator=torch.Generator().manual_seed(0))

    def step():
        model.zero_grad(set_to_none=True)
        _, loss = model(idx, idx)
        loss.backward()
        return loss

    loss = step().item()
    used = addnorm.last_backend()
    t = measure(step, min_runs=steps, max_runs=steps, budget_s=0.0, warmup=1)
    return {"backend": backend, "ran": used, "median_s": t.median_s, "p10_s": t.p10_s, "p90_s": t.p90_s,
            "runs": t.runs, "loss": loss, "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "params": model.num_parameters(), "tokens": batch * seq, "threads": torch.get_num_threads()}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m addnorm.bench.model_step")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--out", default="benchmarks/results")
    p.add_argument("--variant", choices=["cpu", "torch"], help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    for name, v, hi in (("--batch", args.batch, None), ("--seq", args.seq, 1024), ("--steps", args.steps, None)):
        if v < 1 or (hi is not None and v > hi):  # checked before any child process or measurement
            p.error(f"{name} must be an integer in [1, {hi}], got {v}" if hi else f"{name} must be >= 1, got {v}")
    if args.variant:
        print(json.dumps(one_variant(args.variant, args.batch, args.seq, args.steps)))
        return 0
    results = []
    env = dict(os.environ, **TUNED_MALLOC)
    for variant in ("torch", "cpu"):
        out = subprocess.run([sys.executable, "-m", "addnorm.bench.model_step", "--variant", variant,
                              "--batch", str(args.batch), "--seq", str(args.seq), "--steps", str(args.steps)],
                             env=env, check=True, capture_output=True, text=True).stdout
        results.append(json.loads(out.strip().splitlines()[-1]))
    eager, fused = results
    summary = {"eager": eager, "fused": fused, "speedup": eager["median_s"] / fused["median_s"],
               "peak_rss_saved_mb": eager["peak_rss_mb"] - fused["peak_rss_mb"],
               "same_loss": abs(eager["loss"] - fused["loss"]) < 1e-4}
    d = Path(args.out)
    d.mkdir(parents=True, exist_ok=True)
    (d / "model_step.json").write_text(json.dumps(summary, indent=1))
    print(f"GPT-2-small shape, {eager['params'] / 1e6:.1f} M parameters, {eager['tokens']} tokens/step, "
          f"{eager['threads']} threads")
    for name, r in (("eager add + LayerNorm", eager), ("fused Add & Norm", fused)):
        print(f"  {name:22s} {r['median_s'] * 1e3:8.1f} ms/step (p10 {r['p10_s'] * 1e3:.1f}, p90 {r['p90_s'] * 1e3:.1f}), "
              f"peak RSS {r['peak_rss_mb']:.0f} MB, loss {r['loss']:.5f}")
    print(f"  speedup {summary['speedup']:.3f}x, peak memory saved {summary['peak_rss_saved_mb']:.0f} MB -> {d / 'model_step.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
