"""What the claims file costs to re-run: a preset's CPU-hours computed from measured per-step times, and the claim
set that re-runs within 8 CPU-hours by the committed measurements."""

import json
from pathlib import Path

import pytest

from addnorm.experiments.study import RunConfig, StudyGrid
from addnorm.experiments.study.budget import (BUDGET_CPU_HOURS, CLAIM_SET, Costs, committed_runs, form, load_costs,
                                              preset_cost)
from addnorm.experiments.study.config import PRESETS

ROOT = Path(__file__).resolve().parents[2]
TIMES = ROOT / "benchmarks" / "results" / "study_presets.json"
COSTS = Costs({"pre-layer-L24": (0.2, 0.3), "post-layer-L24": (0.4, 0.5), "lns-layer-L24": (0.3, 0.1),
               "pre-layer-L6": (0.05, 0.06)}, final_steps=100.0)


def test_a_run_costs_its_steps_its_evaluations_and_its_end():
    cfg = RunConfig(depth=24, steps=500, eval_every=50)
    # 500 steps x 0.2 + 10 evaluations x 0.3 + the end: 100 steps x 0.2
    assert COSTS.run_seconds(cfg) == pytest.approx(100 + 3 + 20)
    assert form(RunConfig(depth=24, norm="dyt", dyt_alpha=(0.8, 0.2, 0.2), init="gpt2", lr=1e-2)) == \
        "pre-dyt-L24-a0.8_0.2_0.2"


def test_a_model_never_timed_takes_the_median_of_its_depth_and_width():
    step, evaluation, borrowed = COSTS.of(RunConfig(depth=24, placement="mix"))
    assert (step, evaluation, borrowed) == (0.3, 0.3, True)  # the medians of pre, post and lns at 24 layers
    assert COSTS.of(RunConfig(depth=24))[2] is False
    with pytest.raises(KeyError, match="no timed model of depth 12 and d_model 64"):
        COSTS.of(RunConfig(depth=12))


def test_costs_come_from_every_timed_preset_and_need_the_final_evaluation(tmp_path):
    times = {"a": {"per_form": [{"form": "pre-layer-L6", "per_step_s": 0.1, "per_eval_s": 0.2}]},
             "b": {"per_form": [{"form": "pre-layer-L6", "per_step_s": 0.3, "per_eval_s": 0.4}]}}
    path = tmp_path / "times.json"
    path.write_text(json.dumps(times))
    with pytest.raises(ValueError, match="no final_eval measurement"):
        load_costs(path)
    path.write_text(json.dumps({**times, "final_eval": {"final_steps": 90.0, "per_form": []}}))
    costs = load_costs(path)
    assert costs.per_form == {"pre-layer-L6": (pytest.approx(0.2), pytest.approx(0.3))} and costs.final_steps == 90


def test_committed_runs_measured_on_the_test_split_are_not_counted_again(tmp_path):
    grid = StudyGrid(placements=("pre",), depths=(6,), lrs=(1e-3, 3e-3), seeds=(0,), base=RunConfig(steps=100))
    names = [r.name() for r in grid.runs()]
    for i, (name, val_bytes) in enumerate(zip(names, (262144, 4096))):
        (tmp_path / "p" / "runs" / str(i)).mkdir(parents=True)
        (tmp_path / "p" / "runs" / str(i) / "summary.json").write_text(json.dumps({"name": name,
                                                                                   "val_bytes": val_bytes}))
    done = committed_runs(tmp_path, "p", 262144)
    assert done == {names[0]}  # the run on 4 KiB is run again
    c = preset_cost(grid, COSTS, done)
    assert (c.runs, c.new, c.borrowed) == (2, 1, 0)
    assert c.cpu_hours == pytest.approx((100 * 0.05 + 2 * 0.06 + 100 * 0.05) / 3600)


def test_the_claim_set_fits_its_budget_by_the_committed_measurements():
    costs = load_costs(TIMES)
    hours = sum(preset_cost(PRESETS[p], costs).cpu_hours for p in CLAIM_SET)
    assert hours <= BUDGET_CPU_HOURS
    assert 50 <= costs.final_steps <= 200  # the end of a run, measured: the test and dev splits read whole
