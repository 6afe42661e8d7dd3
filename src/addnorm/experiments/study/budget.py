"""What a preset costs to re-run from nothing, computed from measured times (nothing is trained here):

    run  = steps x per_step + (steps // eval_every) x per_eval + final
    final = R x per_step

``per_step`` (the median step of the study's own loop) and ``per_eval`` (one evaluation of the dev batches, with
the probes) are each model's times measured on one thread by ``benchmarks/bench_study_presets.py`` and recorded per
form in ``benchmarks/results/study_presets.json``; a form measured in several presets takes the median. ``final`` is
what a run does after its last step -- the test and dev splits read whole (heldout.py), the generalization-gap
measures, the summary -- as R training steps of the same model, R measured on the reference models (``final_eval``
in the same file, the median of theirs). A model never timed takes the median of the timed forms of its depth and
width (``borrowed``), and a run trained until flat is priced at its cap of steps: an upper bound.

``CLAIM_SET``: the presets whose runs the claims file re-runs within ``BUDGET_CPU_HOURS`` (one-thread hours: on 2
cores, as two one-thread shards, half as many hours of wall time).
"""

from __future__ import annotations

import json
import re
import statistics
from dataclasses import dataclass
from pathlib import Path

from .config import RunConfig, Study, StudyGrid, as_study

BUDGET_CPU_HOURS = 8.0
CLAIM_SET = ("claims_seeds", "claims_frontier")


def form(cfg: RunConfig) -> str:
    """The model a run trains, as study_presets.json names it: 'pre-layer-L24', 'pre-dyt-L24-a0.8_0.2_0.2' (the
    learning rate, warmup, seed and init do not change a step's cost)."""
    return cfg.name().split("-lr")[0] + cfg.variant_suffix()


def _shape(name: str) -> tuple[int, int]:
    """(depth, d_model) of a form's name."""
    width = re.search(r"-d(\d+)(-|$)", name)
    return int(re.search(r"-L(\d+)", name).group(1)), int(width.group(1)) if width else 64


@dataclass(frozen=True)
class Costs:
    per_form: dict[str, tuple[float, float]]  # form -> (seconds per step, seconds per evaluation)
    final_steps: float  # R: what a run does after its last step, in training steps of the same model

    def of(self, cfg: RunConfig) -> tuple[float, float, bool]:
        """(per_step, per_eval, borrowed): the form's own times, else the median of its depth and width's."""
        name = form(cfg)
        if name in self.per_form:
            return (*self.per_form[name], False)
        same = [v for k, v in self.per_form.items() if _shape(k) == (cfg.depth, cfg.d_model)]
        if not same:
            raise KeyError(f"no timed model of depth {cfg.depth} and d_model {cfg.d_model} to price {name} by")
        return statistics.median(v[0] for v in same), statistics.median(v[1] for v in same), True

    def run_seconds(self, cfg: RunConfig) -> float:
        step, evaluation, _ = self.of(cfg)
        return cfg.steps * step + (cfg.steps // cfg.eval_every) * evaluation + self.final_steps * step


def load_costs(path: Path) -> Costs:
    """The per-form times of every preset timed in ``path`` (study_presets.json) and its measured final-evaluation
    ratio; ValueError where the file has no ``final_eval`` measurement."""
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    times: dict[str, list[tuple[float, float]]] = {}
    for name, entry in data.items():
        for f in entry.get("per_form", []) if name != "final_eval" else []:
            times.setdefault(f["form"], []).append((f["per_step_s"], f["per_eval_s"]))
    if "final_eval" not in data:
        raise ValueError(f"{path}: no final_eval measurement (python benchmarks/bench_study_presets.py --final-eval)")
    per_form = {k: (statistics.median(v[0] for v in vs), statistics.median(v[1] for v in vs))
                for k, vs in times.items()}
    return Costs(per_form, data["final_eval"]["final_steps"])


@dataclass(frozen=True)
class PresetCost:
    runs: int
    new: int  # not committed yet: what the hours count
    cpu_hours: float
    borrowed: int  # new runs priced by another form of their depth and width


def preset_cost(grid: StudyGrid | Study, costs: Costs, committed: set[str] = frozenset()) -> PresetCost:
    """The CPU-hours of the preset's runs whose names are not in ``committed``."""
    runs = as_study(grid).runs()
    new = [r for r in runs if r.name() not in committed]
    seconds = sum(costs.run_seconds(r) for r in new)
    return PresetCost(len(runs), len(new), seconds / 3600, sum(costs.of(r)[2] for r in new))


def committed_runs(results: Path, preset: str, min_val_bytes: int) -> set[str]:
    """The names of the runs committed under ``results/<preset>/runs/`` whose final losses were measured on at least
    ``min_val_bytes`` held-out bytes (an older run is run again)."""
    names = set()
    for path in sorted((Path(results) / preset / "runs").glob("*/summary.json")):
        s = json.loads(path.read_text(encoding="utf-8"))
        if (s.get("val_bytes") or 0) >= min_val_bytes:
            names.add(s["name"])
    return names
