"""Gradient flow with and without residuals, post- vs pre-norm: measured with the diagnostics."""

from __future__ import annotations

import json
from pathlib import Path

from ..gradflow import GradflowConfig, PlacementResult, run_gradflow

TOUR_PLACEMENTS = ("no_residual", "none", "post", "pre", "sandwich", "deepnorm", "rezero")


TRAINING_STEPS = 10


def run(out_dir: Path, depth: int = 48, seed: int = 0) -> dict:
    cfg = GradflowConfig(placements=TOUR_PLACEMENTS, depth=depth, seed=seed)
    summary = run_gradflow(cfg, out_dir)
    # post- vs pre-norm after a few real training steps (AdamW), where Xiong et al.'s profile appears
    train_cfg = GradflowConfig(placements=("post", "pre"), depth=depth, seed=seed, steps=TRAINING_STEPS)
    train = run_gradflow(train_cfg, out_dir / "training")
    trained = []
    for p in train_cfg.placements:
        run_file = out_dir / "training" / "runs" / train["run_files"][p]
        d = json.loads(run_file.read_text())
        g = PlacementResult(p, d["records"], d["losses"], d["seconds"]).profile("grad_norm", TRAINING_STEPS)
        inner = g[1:]
        k = min(range(len(inner)), key=inner.__getitem__) + 1
        trained.append({"placement": p, "steps": TRAINING_STEPS, "block1_over_last": g[1] / g[-1],
                        "last_over_min": g[-1] / min(inner), "min_block": k,
                        "loss_start": d["losses"][0], "loss_end": d["losses"][-1]})
    return {"depth": depth, "corpus": summary["corpus"], "placements": summary["placements"],
            "figures": summary["figures"], "config": summary["config"], "trained": trained,
            "training_figures": [f for f in train["figures"] if "over_steps" in f and f.startswith("grad_norm")]}
