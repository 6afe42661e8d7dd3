"""`addnorm tour`: every demonstration of the seeds, computed, written as a report directory.

    <out>/index.html       the report (figures beside it in figures/)
    <out>/tour.json        every number the page shows, plus the data behind the figures
    <out>/figures/*.png    the figures (and one SVG diagram)
    <out>/gradflow/        the gradient-flow runs (reused on a re-run with the same settings)
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import torch

from .. import functional as AF
from ..reference import pure_python as pp
from . import seed001
from .sections import batchnorm, block, pipeline, pitfall, residual_flow, rms_vs_layer, training

SECTIONS = ("pipeline", "seed001", "batchnorm", "rms_vs_layer", "gradient_flow", "training", "block", "pitfall",
            "report")


def _seed001_section(position: int = 0) -> dict:
    run = seed001.run_seed001()
    rows = []
    for i, (res, out) in enumerate(zip(run.residual, run.layer_norm_output)):
        m_in, v_in = pp.row_mean_variance(res)
        m_out, v_out = pp.row_mean_variance(out)
        rows.append({"position": i, "token": seed001.TOKEN_NAMES[run.config.tokens[i]], "input_mean": m_in,
                     "input_variance": v_in, "output_mean": m_out, "output_variance": v_out})
    return {"position": position, "trace": seed001.trace_position(run, position), "verification": rows,
            "cross_check": seed001.cross_check(run)}


def _parts(out_dir: Path, seed: int, depth: int) -> list[tuple[str, str, object]]:
    """(key in the tour's data, what the progress bar says, the computation) of each part, in the tour's order."""
    return [
        ("pipeline", "Add & Norm pipeline", lambda: pipeline.run(seed)),
        ("seed001", "seed 001 in pure Python", _seed001_section),
        ("batchnorm", "LayerNorm vs BatchNorm", lambda: batchnorm.run(seed)),
        ("rms_vs_layer", "LayerNorm vs RMSNorm", lambda: rms_vs_layer.run(seed)),
        ("gradient_flow", f"gradient flow, {depth} blocks",
         lambda: residual_flow.run(out_dir / "gradflow", depth=depth, seed=seed)),
        ("training", "training: post vs pre, with and without warmup",
         lambda: training.run(out_dir / "training", seed=seed)),
        ("block", "transformer block", lambda: block.run(seed)),
        ("pitfall", "tutorial pitfall", pitfall.run),
    ]


def _figures(data: dict, out_dir: Path, fig_dir: Path) -> dict[str, str]:
    """{name: file in fig_dir} of every figure the page shows: drawn from ``data``, or copied from the
    gradient-flow runs' own directory."""
    from ..report import figures as figs
    from ..report.frontier_diagrams import frontier_diagrams

    f = {
        "pipeline": figs.pipeline(data["pipeline"], fig_dir),
        "wild": figs.wild(data["pipeline"], fig_dir),
        "seed001": figs.seed001(data["seed001"], fig_dir),
        "batchnorm": figs.batchnorm(data["batchnorm"], fig_dir),
        "rms_vs_layer": figs.rms_vs_layer(data["rms_vs_layer"], fig_dir),
        "pitfall": figs.pitfall(data["pitfall"], fig_dir),
        "diagrams": figs.placement_diagrams(fig_dir),
        "frontier_diagrams": frontier_diagrams(fig_dir),
        "training": figs.training(data["training"], fig_dir),
    }
    for name in ("grad_norm_vs_depth.png", "stream_rms_vs_depth.png", "norm_output_stats.png"):
        src = out_dir / "gradflow" / name
        if src.exists():
            shutil.copy(src, fig_dir / name)
    f["grad_norm"], f["stream_rms"] = "grad_norm_vs_depth.png", "stream_rms_vs_depth.png"
    for name in data["gradient_flow"]["training_figures"]:
        shutil.copy(out_dir / "gradflow" / "training" / name, fig_dir / name)
        f[name.removesuffix(".png")] = name
    return f


def run_tour(out_dir: Path, seed: int = 0, depth: int = 48, progress=None) -> dict:
    """Compute every part of the tour (each timed: ``meta.section_seconds``), draw its figures, write index.html
    and tour.json into ``out_dir``; returns the page's path, the numbers it shows and the data."""
    from ..report import html

    t0 = time.perf_counter()
    out_dir = Path(out_dir)
    fig_dir = out_dir / "figures"
    if fig_dir.exists():
        shutil.rmtree(fig_dir)
    fig_dir.mkdir(parents=True)
    task = progress.add_task("tour", total=len(SECTIONS)) if progress else None

    def step(name):
        if progress:
            progress.update(task, description=f"tour: {name}")
        return time.perf_counter()

    section_seconds: dict[str, float] = {}  # where the tour's time goes (its budget is 90 s on 2 cores)
    data: dict = {}
    torch.manual_seed(seed)
    for key, name, compute in _parts(out_dir, seed, depth):
        start = step(name)
        data[key] = compute()
        section_seconds[name] = time.perf_counter() - start
        if progress:
            progress.advance(task)

    start = step("report")
    f = _figures(data, out_dir, fig_dir)
    section_seconds["figures"] = time.perf_counter() - start
    data["meta"] = {"seed": seed, "torch": torch.__version__, "threads": torch.get_num_threads(),
                    "backend": AF.last_backend() or "cpu", "seconds": time.perf_counter() - t0, "figures": f,
                    "section_seconds": section_seconds}
    page, shown = html.write(data, f, out_dir)
    (out_dir / "tour.json").write_text(json.dumps({"shown": shown, "data": data}, indent=1, default=float))
    if progress:
        progress.advance(task)
    return {"index": page, "shown": shown, "data": data}
