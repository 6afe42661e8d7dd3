"""Sweep the Triton kernels' launch parameters on the GPU at hand (``kernels.triton.norm.LAUNCH_PARAMS``).

Four sweeps, each over fused Add & Norm (the op every other fused form's launch follows), per norm x dtype x
shape, the settings of one sweep timed side by side (CUDA events, interleaved, as ``gpu_cells.cuda_interleaved``):

  * fwd  -- tile x elems_per_warp, timing the forward;
  * bwd  -- backward_rows x programs_per_sm x backward_elems_per_warp, timing the backward;
  * reduce -- reduce_block x reduce_rows (the weight-gradient reduction), timing the backward;
  * bwd_tile -- backward_tile (elements per backward tile: 2 to 8 rows of 4096 a step), timing the backward.

Every other parameter keeps the value in force when the sweep started (the defaults, or
ADDNORM_TRITON_LAUNCH's). Each cell's timings are appended to a JSON-lines journal as they are measured (an
interrupted sweep resumes from it); the summary ranks each sweep's settings by the geometric mean, over the
cells, of their time over the starting setting's, and prints the ADDNORM_TRITON_LAUNCH line of the best ones.

    python benchmarks/tune_gpu.py [--shapes 4096x4096,16384x8192,32768x2048] [--out benchmarks/results/gpu_tune]

Without a CUDA device it says so and measures nothing (exit 2).
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import sys
from pathlib import Path

import torch

SWEEPS = {
    "fwd": ("fwd", {"tile": [4096, 8192], "elems_per_warp": [256, 512, 1024]}),
    "bwd": ("bwd", {"backward_rows": [4, 16], "programs_per_sm": [1, 2, 4],
                    "backward_elems_per_warp": [256, 512, 1024]}),
    "reduce": ("bwd", {"reduce_block": [64, 256], "reduce_rows": [1, 8, 32]}),
    # rows per backward tile at wide rows: one 4096-element row a program step was the H200's bf16 weak side
    "bwd_tile": ("bwd", {"backward_tile": [4096, 8192, 16384, 32768]}),
}


_NAMES = [name for _, grid in SWEEPS.values() for name in grid]
assert len(_NAMES) == len(set(_NAMES)), "the sweeps' parameters must be disjoint: the best of each is merged"


def settings(sweep: str) -> list[dict[str, int]]:
    """Every setting of one sweep: the product of its parameters' values."""
    grid = SWEEPS[sweep][1]
    return [dict(zip(grid, vals, strict=True)) for vals in itertools.product(*grid.values())]


def label(setting: dict[str, int]) -> str:
    return ",".join(f"{k}={v}" for k, v in setting.items())


def geomean_ratios(cells: list[dict], base: str) -> dict[str, float]:
    """{setting label: geometric mean of its median time over ``base``'s} over the cells that timed ``base`` and
    every setting (so that every mean is over the same cells); empty when no cell has them all."""
    labels = set.intersection(*(set(c["ms"]) for c in cells)) if cells else set()
    common = [c["ms"] for c in cells if base in c["ms"]] if base in labels else []
    return {lab: math.exp(sum(math.log(t[lab] / t[base]) for t in common) / len(common))
            for lab in sorted(labels)} if common else {}


def run(shapes, dtypes, kinds, sweeps, out: Path, progress=None, *, timer=None, device="cuda") -> list[dict]:
    """Every sweep x norm x dtype x shape; returns the cells (each {"cell", "sweep", "start", "ms": {label: ms}})."""
    from ..harness.store import read_journal
    from ..kernels.triton import norm as triton_norm
    from .add_norm import make_step
    from .gpu import addnorm_method
    from .gpu_cells import cuda_interleaved

    timer = timer or (lambda fns: cuda_interleaved(fns, rounds=8, block=5, warmup=2))
    start = triton_norm.launch()
    journal = out / "gpu_tune.partial.jsonl"
    done = dict(read_journal(journal, lambda rec: (rec["cell"], rec)))
    cells = []
    total = len(sweeps) * len(kinds) * len(dtypes) * len(shapes)
    task = progress.add_task("launch sweep", total=total) if progress else None
    for sweep in sweeps:
        mode = SWEEPS[sweep][0]
        start_setting = {k: start[k] for k in SWEEPS[sweep][1]}
        start_label = label(start_setting)
        for kind, dt_name, (n, d) in itertools.product(kinds, dtypes, shapes):
            key = f"{sweep}|{kind}|{dt_name}|{n}x{d}|{start_label}"  # a new start (new defaults) times afresh
            if key in done:
                cells.append(done[key])
            else:
                if progress:
                    progress.update(task, description=f"{sweep} {kind} {dt_name} {n}x{d}")
                fns = {}
                with torch.set_grad_enabled(mode != "fwd"):
                    step = make_step(addnorm_method(kind), mode, n, d, getattr(torch, dt_name), kind, device)
                    for s in [start_setting, *settings(sweep)]:
                        def call(s=s):
                            old = triton_norm.set_launch(**s)
                            try:
                                return step()
                            finally:
                                triton_norm.set_launch(**old)

                        fns.setdefault(label(s), call)
                    timings = timer(fns)
                rec = {"cell": key, "sweep": sweep, "start": start_label,
                       "ms": {lab: t.median_s * 1e3 for lab, t in timings.items()}}
                cells.append(rec)
                with journal.open("a") as f:
                    f.write(json.dumps(rec) + "\n")
                del step, fns
                if device == "cuda":
                    torch.cuda.empty_cache()
            if progress:
                progress.advance(task)
    return cells


def summary(cells: list[dict]) -> tuple[str, dict[str, int]]:
    """A markdown table per sweep (each setting's geometric-mean time over the starting one's, best first, and
    its best and worst cell) and the best setting of every sweep merged."""
    lines, best = [], {}
    for sweep in SWEEPS:
        cs = [c for c in cells if c["sweep"] == sweep]
        if not cs:
            continue
        base = cs[0]["start"]
        cs = [c for c in cs if c["start"] == base]
        g = geomean_ratios(cs, base)
        if not g:
            continue
        cs = [c for c in cs if set(g) <= set(c["ms"])]  # the cells the means are over
        ranked = sorted(g.items(), key=lambda kv: kv[1])
        lines += [f"### {sweep} ({SWEEPS[sweep][0]}; {len(cs)} cells; time over `{base}`, geometric mean)", "",
                  "| setting | geomean | best cell | worst cell |", "|---|---|---|---|"]
        for lab, r in ranked:
            per = [c["ms"][lab] / c["ms"][base] for c in cs]
            lines.append(f"| `{lab}` | {r:.3f} | {min(per):.3f} | {max(per):.3f} |")
        lines.append("")
        best |= {k: int(v) for k, v in (item.split("=") for item in ranked[0][0].split(","))}
    return "\n".join(lines), best


def pair_table(cells: list[dict], sweep: str, setting: str, floor_gbps: float) -> str:
    """A markdown table, one line per cell of ``sweep``: the starting setting's time, ``setting``'s, their ratio,
    and each one's Add & Norm minimum bytes over ``floor_gbps`` (a copy bandwidth measured on the same GPU)."""
    from .add_norm import min_bytes

    cs = [c for c in cells if c["sweep"] == sweep and setting in c["ms"]]
    start = cs[0]["start"] if cs else ""
    out = [f"| cell | `{start}` ms | of floor | `{setting}` ms | of floor | ratio |", "|---|---|---|---|---|---|"]
    for c in cs:
        a, b = c["ms"][c["start"]], c["ms"][setting]
        kind, dt, shape = c["cell"].split("|")[1:4]
        n, d = (int(v) for v in shape.split("x"))
        mb = min_bytes(SWEEPS[sweep][0], n, d, torch.tensor([], dtype=getattr(torch, dt)).element_size())
        frac = lambda ms: mb / (ms * 1e-3) / (floor_gbps * 1e9)  # noqa: E731
        out.append(f"| {kind} {dt} {shape.replace('x', '×')} | {a:.3f} | {frac(a):.2f} | {b:.3f} | {frac(b):.2f} | "
                   f"{b / a:.2f} |")
    return "\n".join(out)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--shapes", default="4096x4096,16384x8192,32768x2048", help="rows x hidden, comma separated")
    p.add_argument("--dtypes", default="float32,bfloat16")
    p.add_argument("--kinds", default="layer,rms")
    p.add_argument("--sweeps", default=",".join(SWEEPS), help="comma separated, of " + ", ".join(SWEEPS))
    p.add_argument("--out", default="benchmarks/results/gpu_tune")


def main_from_args(args) -> int:
    from .add_norm import parse_options

    try:
        opts = parse_options(argparse.Namespace(shapes=args.shapes, dtypes=args.dtypes, kinds=args.kinds,
                                                modes="fwd", methods="addnorm", out=args.out), ["addnorm"])
        sweeps = list(dict.fromkeys(t for t in args.sweeps.split(",") if t))
        bad = [s for s in sweeps if s not in SWEEPS]
        if bad or not sweeps:
            raise ValueError(f"--sweeps: unknown or empty {bad}; valid: {', '.join(SWEEPS)}")
    except ValueError as e:
        print(f"tune_gpu: error: {e}", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("no CUDA device here: the launch sweep measures nothing (GPU numbers are not measured, never "
              "estimated).", file=sys.stderr)
        return 2
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from ..harness.store import atomic_write_text
    from .gpu_cells import conditions

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()) as pr:
        cells = run(opts["shapes"], opts["dtypes"], opts["kinds"], sweeps, out, pr)
    table, best = summary(cells)
    cond = conditions("cuda", {}) | {"timing": "CUDA events around blocks of 5 calls, settings interleaved, 8 rounds; "
                                               "median per call"}
    atomic_write_text(out / "gpu_tune.json", json.dumps({"conditions": cond, "best": best, "cells": cells}, indent=1))
    atomic_write_text(out / "gpu_tune.md", table + "\n")
    (out / "gpu_tune.partial.jsonl").unlink(missing_ok=True)
    print(table)
    print("ADDNORM_TRITON_LAUNCH=" + ",".join(f"{k}={v}" for k, v in best.items()))
    return 0
