"""Seed 003 says RMSNorm is faster than LayerNorm: one training step (forward, backward, AdamW, zero_grad) of the
same GPT with each norm kind, timed side by side.

    python benchmarks/bench_norm_step.py [--budget 4] [--norms layer,rms,dyt,batch]

Two shapes: the study's model (6 layers, d_model 64, batch 16 x 64 bytes) and a wider one (6 layers, d_model 256,
8 heads, batch 4 x 128 bytes), where the norms move more bytes per step. Per shape the models share seed, batch and placement (pre-norm);
the steps are interleaved in rounds (the starting model rotates) so that the machine's drift falls on all of
them alike; each step is timed on its own and the median is reported, with p10-p90. Writes
benchmarks/results/norm_step.json.
"""

import argparse
import json
import sys
from pathlib import Path

import torch

from addnorm.harness.timing import measure_interleaved
from addnorm.experiments.study import RunConfig
from addnorm.experiments.study.config import NORMS
from addnorm.experiments.study.data import load_split
from addnorm.experiments.study.runner import build_model

SHAPES = {"study (6 x 64)": dict(depth=6, d_model=64, heads=4, seq_len=64, batch=16),
          "wide (6 x 256)": dict(depth=6, d_model=256, heads=8, seq_len=128, batch=4)}


def step_fn(cfg: RunConfig, x, y):
    model = build_model(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.98), weight_decay=0.0)

    def step():
        _, loss = model(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--budget", type=float, default=4.0, help="seconds of timed steps per model (default %(default)s)")
    p.add_argument("--norms", default="layer,rms,dyt,batch", help="comma separated (default %(default)s)")
    p.add_argument("--out", default="benchmarks/results", help="directory for the JSON (default %(default)s)")
    a = p.parse_args()
    norms = [n for n in a.norms.split(",") if n]
    if not norms or any(n not in NORMS for n in norms):
        p.error(f"--norms must name some of {', '.join(NORMS)}, got {a.norms!r}")
    if not (a.budget > 0):
        p.error(f"--budget must be > 0, got {a.budget}")
    data = load_split(max_bytes=1 << 20)
    results = []
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; median ms per training step (p10-p90), "
          "interleaved")
    for shape, kw in SHAPES.items():
        x, y = data.batch(0, kw["batch"], kw["seq_len"], 0)
        fns = {n: step_fn(RunConfig(**kw, norm=n, placement="pre", lr=1e-3), x, y) for n in norms}
        t = measure_interleaved(fns, min_runs=10, max_runs=100_000, budget_s=a.budget, warmup_s=0.5, block=3)
        base = t[norms[0]].median_s
        for n in norms:
            r = t[n]
            results.append({"shape": shape, **kw, "norm": n, "median_ms": 1e3 * r.median_s, "p10_ms": 1e3 * r.p10_s,
                            "p90_ms": 1e3 * r.p90_s, "steps_timed": r.runs, f"vs_{norms[0]}": r.median_s / base})
            print(f"  {shape:28s} {n:6s} {1e3 * r.median_s:8.2f} ms ({1e3 * r.p10_s:.2f}-{1e3 * r.p90_s:.2f}), "
                  f"{r.median_s / base:.3f}x {norms[0]}, {r.runs} steps")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "norm_step.json").write_text(json.dumps(
        {"rows": results, "threads": torch.get_num_threads(), "torch": torch.__version__}, indent=1))
    print(f"-> {out / 'norm_step.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
