"""Post- vs pre-norm, with and without warmup, trained for real: the tour's training section.

Four short runs of ``addnorm study`` (6 layers, d_model 64, lr 3e-3, 100 steps) on the standard library's
source split by file; finished runs are reused (content-keyed), so a second tour costs nothing here."""

from __future__ import annotations

from pathlib import Path

from ..study import RunConfig, StudyGrid
from ..study.data import load_split
from ..study.grid import run_dir
from ..study.runner import read_metrics, train_run

GRID = StudyGrid(placements=("post", "pre"), lrs=(3e-3,), warmups=(0, 50), seeds=(0,),
                 base=RunConfig(depth=6, steps=100, eval_every=50, eval_batches=2, checkpoint_every=100))


def run(out_dir: Path, seed: int = 0) -> dict:
    data = load_split(max_bytes=1 << 20)
    runs = []
    for cfg in GRID.runs():
        cfg = RunConfig(**{**cfg.__dict__, "seed": seed})
        d = run_dir(out_dir, cfg, data)
        s = train_run(cfg, data, d)
        losses = [m["loss"] for m in read_metrics(d)]
        runs.append({"placement": cfg.placement_name, "warmup": cfg.warmup, "lr": cfg.lr, "failed": s["failed"],
                     "failure": s["failure"], "steps_done": s["steps_done"], "final_val_loss": s["final_val_loss"],
                     "train_loss": losses})
    return {"depth": GRID.base.depth, "d_model": GRID.base.d_model, "steps": GRID.base.steps, "corpus": data.source,
            "unigram_nats": data.unigram_nats, "runs": runs,
            "command": "addnorm study --preset quick (longer: 400 steps)"}
