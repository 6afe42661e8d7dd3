"""What the claims file costs to re-run from nothing: the CPU-hours of each claims preset, computed from measured
times (experiments/study/budget.py: per-step and per-evaluation times of each model, measured on one thread by
bench_study_presets.py, and the end of a run -- the held-out test and dev splits read whole -- measured in training
steps). Trains nothing. Runs already committed with a held-out test split are not counted again.

    python benchmarks/study_claims_budget.py              # the presets as defined (5 seeds) and their
                                                          # confirmation runs (--confirm: seeds 5-10)
    python benchmarks/study_claims_budget.py --seeds 11   # as many seeds as Holm's correction needs to decide

prints, per claims preset, its runs, the CPU-hours (one thread), the wall time as two one-thread shards on 2
cores, the claims it feeds, and whether it is inside the 8-CPU-hour claim set (budget.CLAIM_SET).
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

from addnorm.experiments.study import confirm
from addnorm.experiments.study.budget import BUDGET_CPU_HOURS, CLAIM_SET, committed_runs, load_costs, preset_cost
from addnorm.experiments.study.claims import MIN_VAL_BYTES, SPECS, run_rows
from addnorm.experiments.study.config import PRESETS, Study, as_study

ROOT = Path(__file__).resolve().parent
RESULTS = ROOT / "results" / "study"
TIMES = ROOT / "results" / "study_presets.json"


def with_seeds(preset: str, seeds: int | None) -> Study:
    grid = as_study(PRESETS[preset])
    return grid if seeds is None else Study(tuple(replace(p, seeds=tuple(range(seeds))) for p in grid.parts))


def confirmation(preset: str) -> tuple[Study | None, bool]:
    """The preset's confirmation runs (``addnorm study --confirm``): as planned from its committed runs where every
    claim can be, else the most it can need (each distinct side once: an upper bound); and whether that is exact."""
    plan = confirm.plan(preset, run_rows(RESULTS / preset))
    if plan.waiting:
        return confirm.most(preset), False
    return (plan.study if plan.grids else None), True


def table(seeds: int | None = None) -> list[dict]:
    costs = load_costs(TIMES)
    presets = list(dict.fromkeys(s.preset for s in SPECS if not s.needs))
    out = []
    for p in presets:
        done = committed_runs(RESULTS, p, MIN_VAL_BYTES)
        c = preset_cost(with_seeds(p, seeds), costs, done)
        extra, exact = confirmation(p) if seeds is None else (None, True)
        k = preset_cost(extra, costs, done) if extra is not None else None
        out.append({"preset": p, "runs": c.runs, "new": c.new, "cpu_hours": c.cpu_hours, "borrowed": c.borrowed,
                    "claims": [s.id for s in SPECS if s.preset == p], "in_set": p in CLAIM_SET,
                    "confirm_runs": k.runs if k else 0, "confirm_new": k.new if k else 0,
                    "confirm_hours": k.cpu_hours if k else 0.0, "confirm_exact": exact})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=None, help="seeds per setting (default: the presets' own, 5)")
    args = ap.parse_args()
    rows = table(args.seeds)
    seeds = f"{args.seeds} seeds" if args.seeds else "the presets' seeds"
    print(f"{seeds}; CPU-hours on one thread, computed from measured per-step times ({TIMES.name}), not run")
    for r in rows:
        extra = f", {r['borrowed']} priced by another model of their depth and width" if r["borrowed"] else ""
        mark = "in the 8-hour set" if r["in_set"] else "outside it"
        print(f"  {r['preset']:16s} {r['runs']:4d} runs ({r['new']} to run{extra}): {r['cpu_hours']:6.2f} CPU-hours, "
              f"{r['cpu_hours'] / 2:5.2f} h as two shards on 2 cores; {mark}: {', '.join(r['claims'])}")
        if r["confirm_runs"]:
            bound = "" if r["confirm_exact"] else "at most "
            print(f"  {'':16s} + {bound}{r['confirm_runs']} confirmation runs ({r['confirm_new']} to run): "
                  f"{r['confirm_hours']:6.2f} CPU-hours (--confirm: each paired side's setting at seeds 5-10)")
    inside = sum(r["cpu_hours"] for r in rows if r["in_set"])
    total = sum(r["cpu_hours"] for r in rows)
    inside_c = inside + sum(r["confirm_hours"] for r in rows if r["in_set"])
    total_c = total + sum(r["confirm_hours"] for r in rows)
    print(f"  the claim set ({', '.join(CLAIM_SET)}): {inside:.2f} CPU-hours of {BUDGET_CPU_HOURS:g}; every claims "
          f"preset: {total:.2f} CPU-hours ({total / 2:.2f} h on 2 cores)")
    if args.seeds is None:
        print(f"  with the confirmation runs: the claim set {inside_c:.2f} CPU-hours ({inside_c / 2:.2f} h on 2 "
              f"cores); every claims preset {total_c:.2f} CPU-hours ({total_c / 2:.2f} h on 2 cores)")


if __name__ == "__main__":
    main()
