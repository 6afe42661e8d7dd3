"""What the claims file needs from the long runs, and what they cost, from the committed runs' own times.

For every claim of ``addnorm.experiments.study.claims.SPECS`` with committed runs: the settings of its arm and its
baseline (as committed), each at ``--lrs`` learning rates at least (a tuned claim needs a grid that brackets its
optimum: 3 or more) and ``--seeds`` seeds. A setting's cost per step is the median, over the committed runs of the
same model (placement, norm, depth, width), of their recorded seconds_this_session / steps_done -- one thread, on
the machine that ran them; a run resumed over several sittings records only its last one, which makes the
estimate low, never high. Runs already committed (same setting, learning rate and seed) are not counted again.

    python benchmarks/study_claims_budget.py --seeds 11

prints the runs and CPU-hours per results directory. Trains nothing.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from addnorm.experiments.study.claims import FAILURE, SPECS, load_rows, matches

RESULTS = Path(__file__).resolve().parent / "results" / "study"
SETTING = ("placement", "norm", "init", "depth", "d_model", "warmup", "steps", "value_residual", "dyt_alpha")
MODEL = ("placement", "norm", "depth", "d_model")


def per_step(rows_by_preset: dict[str, list[dict]]) -> dict[tuple, float]:
    """{model: median seconds per step} over every committed run that recorded its time."""
    times: dict[tuple, list[float]] = {}
    for rows in rows_by_preset.values():
        for r in rows:
            if r.get("seconds") and r.get("steps_done"):
                times.setdefault(tuple(r[k] for k in MODEL), []).append(r["seconds"] / r["steps_done"])
    return {k: statistics.median(v) for k, v in times.items()}


def _rate(model: tuple, rates: dict[tuple, float]) -> float | None:
    """The model's own rate, else the median of the same depth and width (another placement), else None."""
    if model in rates:
        return rates[model]
    same = [v for k, v in rates.items() if k[2:] == model[2:]]
    return statistics.median(same) if same else None


def needed(seeds: int, min_lrs: int, results: Path = RESULTS) -> dict[str, dict]:
    rows_by = {s.preset: load_rows(results, s.preset) for s in SPECS}
    rows_by = {k: v for k, v in rows_by.items() if v is not None}
    rates = per_step(rows_by)
    want: dict[str, set] = {}
    for s in SPECS:
        rows = rows_by.get(s.preset)
        if rows is None or s.needs:
            continue
        for select in (s.arm, s.baseline):
            mine = [r for r in rows if matches(r, select)]
            for setting in {tuple(r[k] for k in SETTING) for r in mine}:
                lrs = sorted({r["lr"] for r in mine if tuple(r[k] for k in SETTING) == setting})
                if ("lr" in s.tune or s.measure == FAILURE or s.pair_by != ("seed",)) and len(lrs) < min_lrs:
                    lrs += [lrs[-1] * 3 ** (i + 1) for i in range(min_lrs - len(lrs))]  # widen the grid upward
                for lr in lrs:
                    for seed in range(seeds):
                        want.setdefault(s.preset, set()).add((setting, lr, seed))
    out = {}
    for preset, runs in sorted(want.items()):
        have = {(tuple(r[k] for k in SETTING), r["lr"], r["seed"]) for r in rows_by[preset]}
        new = runs - have
        unpriced = 0
        seconds = 0.0
        for setting, _, _ in new:
            rate = _rate(tuple(dict(zip(SETTING, setting))[k] for k in MODEL), rates)
            if rate is None:
                unpriced += 1
            else:
                seconds += rate * dict(zip(SETTING, setting))["steps"]
        out[preset] = {"runs": len(runs), "new": len(new), "cpu_hours": seconds / 3600, "unpriced": unpriced}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=11, help="seeds per setting (default %(default)s)")
    ap.add_argument("--lrs", type=int, default=3, help="learning rates at least, for tuned claims (default 3)")
    args = ap.parse_args()
    table = needed(args.seeds, args.lrs)
    total = sum(v["cpu_hours"] for v in table.values())
    print(f"{args.seeds} seeds, at least {args.lrs} learning rates where a claim is tuned or pools the grid")
    for preset, v in table.items():
        extra = f" ({v['unpriced']} runs of a model never timed: not counted)" if v["unpriced"] else ""
        print(f"  {preset:15s} {v['runs']:5d} runs, {v['new']:5d} not committed, {v['cpu_hours']:7.1f} CPU-hours{extra}")
    print(f"  total {total:.1f} CPU-hours ({total / 2:.1f} h on 2 cores)")


if __name__ == "__main__":
    main()
