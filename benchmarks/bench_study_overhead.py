"""What the study's training loop costs beyond a bare loop of the same model: per-step logging (loss, lr,
gradient norms per block, residual-stream RMS and max per block, update/weight ratio), validation every
``eval_every`` steps, checkpoints, failure checks -- against forward, backward and AdamW alone.

    python benchmarks/bench_study_overhead.py [--steps 100] [--repeats 3]

Both loops train the default preset's model (6 layers, d_model 64) on the same batches, the study's with the
default preset's cadence (validation every 100 steps, a checkpoint every 50); they alternate (bare, study, bare, ...) and the
median seconds per step of each are compared. Writes benchmarks/results/study_overhead.json. Target: the
study's loop at most 1.15x the bare one.
"""

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from addnorm.experiments.study import PRESETS, RunConfig, train_run
from addnorm.experiments.study.data import load_split, lr_at
from addnorm.experiments.study.runner import build_model


def bare(cfg, data) -> float:
    model = build_model(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.98), weight_decay=0.0)
    t0 = time.perf_counter()
    for step in range(cfg.steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(step, cfg.lr, cfg.warmup, cfg.steps)
        x, y = data.batch(step, cfg.batch, cfg.seq_len, cfg.seed)
        _, loss = model(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss.item()
    return (time.perf_counter() - t0) / cfg.steps


def study(cfg, data) -> tuple[float, float]:
    """(seconds per step of the training loop, of the whole run): the loop holds the steps, their logging,
    the validations every eval_every steps and the checkpoints; the whole run adds the setup and the final
    evaluation (validation, train-vs-eval gap, future leak)."""
    with tempfile.TemporaryDirectory() as d:
        t0 = time.perf_counter()
        s = train_run(cfg, data, Path(d))
        return s["loop_seconds_this_session"] / cfg.steps, (time.perf_counter() - t0) / cfg.steps


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=200, help="steps per loop (default %(default)s)")
    p.add_argument("--repeats", type=int, default=3, help="loops of each kind, alternating (default %(default)s)")
    p.add_argument("--out", default="benchmarks/results", help="directory for the JSON (default %(default)s)")
    a = p.parse_args()
    if a.steps < 1 or a.repeats < 1:
        p.error("--steps and --repeats must be >= 1")
    data = load_split(max_bytes=1 << 20)
    base = PRESETS["default"].base  # the default preset's model and cadence: evaluation every 100 steps,
    cfg = RunConfig(**{**base.__dict__, "steps": a.steps})  # a checkpoint every 50
    times = {"bare": [], "study": [], "study_whole_run": []}
    for _ in range(a.repeats):
        times["bare"].append(bare(cfg, data))
        loop, whole = study(cfg, data)
        times["study"].append(loop)
        times["study_whole_run"].append(whole)
    med = {k: statistics.median(v) for k, v in times.items()}
    ratio = med["study"] / med["bare"]
    print(f"bare loop {1e3 * med['bare']:.1f} ms/step, study loop {1e3 * med['study']:.1f} ms/step: "
          f"{ratio:.3f}x (target <= 1.15); the whole study run, setup and final evaluation included: "
          f"{med['study_whole_run'] / med['bare']:.3f}x")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "study_overhead.json").write_text(json.dumps(
        {"config": cfg.__dict__, "seconds_per_step": times, "median": med, "ratio": ratio,
         "ratio_whole_run": med["study_whole_run"] / med["bare"],
         "threads": torch.get_num_threads(), "torch": torch.__version__}, indent=1, default=list))
    return 0


if __name__ == "__main__":
    sys.exit(main())
