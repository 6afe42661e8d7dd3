"""Gradient flow with and without residuals, post- vs pre-norm: measured with the diagnostics."""

from __future__ import annotations

from pathlib import Path

from ..gradflow import GradflowConfig, run_gradflow

TOUR_PLACEMENTS = ("no_residual", "none", "post", "pre", "sandwich", "deepnorm", "rezero")


def run(out_dir: Path, depth: int = 48, seed: int = 0) -> dict:
    cfg = GradflowConfig(placements=TOUR_PLACEMENTS, depth=depth, seed=seed)
    summary = run_gradflow(cfg, out_dir)
    return {"depth": depth, "corpus": summary["corpus"], "placements": summary["placements"],
            "figures": summary["figures"], "config": summary["config"]}
