"""The time of a study preset, computed from measured per-step times (the whole preset is not run).

For each distinct model of the preset (placement, norm, depth, width and the frontier options: the learning rate,
warmup and seed do not change a step's cost) a short run of the study's own loop (``train_run``: every per-step
metric, the probes) is timed step by step with one thread; the median of the steps after the first three (and
before the last, which evaluates) is its per-step time, and one validation (``evaluate`` + the probe) is timed
too. The preset's time is then  sum over runs of  steps x per-step + evaluations x per-evaluation,  for the
``long`` preset an upper bound (its runs stop when the validation curve flattens, at most at ``steps``).

    OMP_NUM_THREADS=1 python benchmarks/bench_study_presets.py frontier depth long wide mixing dyt

writes benchmarks/results/study_presets.json (one entry per preset, merged with what is there). With ``--reuse``
the per-step times recorded there for a preset's models are kept and only models new to the preset are timed.

    OMP_NUM_THREADS=1 python benchmarks/bench_study_presets.py --final-eval

times what a run does after its last step (the test and dev splits read whole, the gap measures, the summary) on
GPT-2-init pre-LN at 24 and at 6 layers, in training steps of the same model measured in the same process, and
writes it as ``final_eval``: experiments/study/budget.py prices every run's end by it.
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch

from addnorm.experiments.study import PRESETS, RunConfig, train_run
from addnorm.experiments.study.budget import form
from addnorm.experiments.study.data import load_split
from addnorm.experiments.study.probe import probe
from addnorm.experiments.study.runner import build_model, evaluate

OUT = Path(__file__).resolve().parent / "results" / "study_presets.json"
STEPS = 12


def cost_key(r) -> tuple:
    return (r.placement, r.norm, r.depth, r.d_model, r.heads, r.seq_len, r.batch, r.n_streams, r.value_residual)


def measure(cfg, data, final: bool = False) -> dict:
    """Per-step and per-evaluation seconds; with ``final`` also what the run did after its last step (``final_s``)
    and the test split's evaluation within it (``test_eval_s``)."""
    stamps = []
    short = replace(cfg, steps=STEPS, warmup=0, eval_every=10_000, checkpoint_every=10_000, until_flat=False)
    with tempfile.TemporaryDirectory() as d:
        summary = train_run(short, data, d, on_step=lambda step: stamps.append(time.perf_counter()))
        end = time.perf_counter()
    per_step = statistics.median(b - a for a, b in zip(stamps[3:-2], stamps[4:-1]))
    if final:
        return {"form": form(cfg), "per_step_s": per_step, "final_s": end - stamps[-1],
                "test_eval_s": summary["test_eval_seconds"], "final_steps": (end - stamps[-1]) / per_step}
    model = build_model(cfg)
    t = time.perf_counter()
    evaluate(model, data, cfg)
    if cfg.bounded or cfg.widened:
        probe(model, data.dev_batches(1, cfg.batch, cfg.seq_len)[0][0])
    return {"per_step_s": per_step, "per_eval_s": time.perf_counter() - t}


def preset_time(name: str, data, recorded: dict | None = None) -> dict:
    """``recorded``: {form: costs} measured before (a grid that only adds runs of models already timed, such as an
    init axis, is recomputed from them without timing anything); a model not among them is timed."""
    runs = PRESETS[name].runs()
    costs = {}
    for r in runs:
        k = cost_key(r)
        if k not in costs:
            if recorded and form(r) in recorded:
                costs[k] = recorded[form(r)]
                continue
            costs[k] = measure(r, data)
            print(f"{name}: {r.name()}: {costs[k]['per_step_s'] * 1e3:.1f} ms/step", flush=True)
    total = sum(r.steps * costs[cost_key(r)]["per_step_s"] + (r.steps // r.eval_every + 1) *
                costs[cost_key(r)]["per_eval_s"] for r in runs)
    forms = [{"form": form(r), **costs[cost_key(r)]}
             for r in {cost_key(r): r for r in runs}.values()]
    return {"runs": len(runs), "steps_per_run": sorted({r.steps for r in runs}), "computed_total_s": total,
            "threads": torch.get_num_threads(), "per_form": forms,
            "note": "computed from measured per-step times, not a run of the preset"}


def final_eval(data) -> dict:
    """The end of a run in training steps, on GPT-2-init pre-LN at 24 layers (the claims' bulk) and at 6."""
    refs = [measure(RunConfig(depth=d, init="gpt2", warmup=0), data, final=True) for d in (24, 6)]
    return {"per_form": refs, "final_steps": statistics.median(r["final_steps"] for r in refs),
            "threads": torch.get_num_threads(),
            "note": "final_s: measured after the last step of a 12-step run of the study's loop (the test and dev "
                    "splits read whole, the gap measures, the summary); final_steps = final_s / per_step_s"}


def main(names: list[str], reuse: bool = False, final: bool = False) -> None:
    torch.set_num_threads(1)
    data = load_split()
    results = json.loads(OUT.read_text()) if OUT.exists() else {}
    if final:
        results["final_eval"] = final_eval(data)
        for r in results["final_eval"]["per_form"]:
            print(f"{r['form']}: the run's end {r['final_s']:.1f} s (test split {r['test_eval_s']:.1f} s) = "
                  f"{r['final_steps']:.0f} steps of {r['per_step_s'] * 1e3:.0f} ms", flush=True)
        OUT.write_text(json.dumps(results, indent=1) + "\n")
    for name in names:
        recorded = {f["form"]: {k: f[k] for k in ("per_step_s", "per_eval_s")}
                    for f in results.get(name, {}).get("per_form", [])} if reuse else None
        results[name] = preset_time(name, data, recorded)
        print(f"{name}: {results[name]['runs']} runs, {results[name]['computed_total_s'] / 3600:.2f} h on one thread",
              flush=True)
        OUT.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    # --reuse: keep the per-step times already recorded for a preset's models, time only the models new to it
    # --final-eval: time the end of a run (the held-out evaluations) on the reference models, and nothing else
    args = [a for a in sys.argv[1:] if a not in ("--reuse", "--final-eval")]
    final = "--final-eval" in sys.argv[1:]
    main(args or ([] if final else ["frontier", "depth", "long", "wide", "mixing", "dyt"]), reuse="--reuse" in sys.argv[1:],
         final=final)
