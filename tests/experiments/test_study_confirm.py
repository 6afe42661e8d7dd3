"""Confirmation runs (experiments/study/confirm.py, `addnorm study --confirm`): each side of a claim paired by seed
at its setting -- a tuned side's chosen on the selection seeds -- planned at the confirmation seeds from a results
directory's finished runs, claims that cannot be planned named, and the runs reported with the preset's own."""

import json
from dataclasses import replace

import pytest

from addnorm.cli.main import main
from addnorm.experiments.study import confirm
from addnorm.experiments.study.claims import setting_row
from addnorm.experiments.study.config import CONFIRM_SEEDS, PRESETS, RunConfig, Study, StudyGrid, as_study

SEEDS = tuple(range(5, 11))


def _rows(preset, dev):
    """A finished row for every run of ``preset``: its dev (and test) loss is ``dev(run)``."""
    return [{"name": r.name(), **setting_row(r.__dict__), "final_dev_loss": dev(r), "final_val_loss": dev(r)}
            for r in as_study(PRESETS[preset]).runs()]


def _budget_dev(r):
    """claims_dyt_budget: DyT best at 1e-2, pre-LN at 3e-3 on seeds 0-4."""
    best = 1e-2 if r.norm == "dyt" else 3e-3
    return 2.0 + (0 if r.lr == best else 0.5) + r.seed / 100


def test_the_plan_is_each_sides_chosen_setting_at_the_confirmation_seeds():
    rows = _rows("claims_dyt_budget", _budget_dev)
    # a stray run at seed 7 of DyT's 1e-3, better than anything: the choice is made on seeds 0-4 alone
    stray = replace(next(r for r in PRESETS["claims_dyt_budget"].runs() if r.norm == "dyt" and r.lr == 1e-3), seed=7)
    rows.append({"name": stray.name(), **setting_row(stray.__dict__), "final_dev_loss": 0.1, "final_val_loss": 0.1})
    p = confirm.plan("claims_dyt_budget", rows)
    assert (p.claims, p.skipped, p.waiting) == (("dyt_budget",), (), ())
    expected = {f"pre-{norm}-L24-lr{lr}-w100-s{s}-c0-gpt2" for norm, lr in (("dyt", "0.01"), ("layer", "0.003"))
                for s in SEEDS}
    assert {r.name() for r in p.runs()} == expected and len(p.runs()) == 12
    assert tuple(range(5, 11)) == CONFIRM_SEEDS


def test_sides_that_choose_alike_share_their_runs_and_the_seeds_can_be_given():
    # claims_dyt_cause: DyT 0.8/0.2/0.2 at sqrt(d) and at unit RMS, each against pre-LN without a scale (shared)
    def dev(r):
        best = {None: 1e-3, 8.0: 3e-3, 50.0: 1e-2}[r.embed_scale]
        return 2.0 + (0 if r.lr == best else 0.4) + r.seed / 100
    p = confirm.plan("claims_dyt_cause", _rows("claims_dyt_cause", dev), seeds=(5, 6))
    assert p.claims == ("dyt_embedding_scale", "dyt_unit_rms") and not p.waiting
    assert sorted(r.name() for r in p.runs()) == sorted(
        [f"pre-dyt-L6-lr{lr}-w50-s{s}-c0-gpt2-a0.8_0.2_0.2-e{e}" for lr, e in (("0.003", 8), ("0.01", 50))
         for s in (5, 6)] + [f"pre-layer-L6-lr0.001-w50-s{s}-c0-gpt2" for s in (5, 6)])


def test_a_claim_whose_selection_runs_are_missing_waits_by_name():
    rows = [r for r in _rows("claims_dyt_budget", _budget_dev) if r["name"] != "pre-dyt-L24-lr0.003-w100-s2-c0-gpt2"]
    p = confirm.plan("claims_dyt_budget", rows)
    assert (p.runs(), p.claims) == ([], ())
    assert p.waiting == ("dyt_budget: the arm's setting cannot be chosen yet: 1 of its 15 selection runs are not "
                         "finished (pre-dyt-L24-lr0.003-w100-s2-c0-gpt2)",)


def test_an_untuned_side_needs_no_runs_and_one_of_several_settings_cannot_be_confirmed():
    p = confirm.plan("claims_mixing", [])
    assert p.claims == ("hc_gain_depth", "mhc_gain") and len(p.grids) == 3
    assert {r.name() for r in p.runs()} == {f"{f}-layer-L{d}-lr0.001-w100-s{s}-c0-gpt2" for f, d in
                                            (("hc", 24), ("hc", 6), ("mhc", 24)) for s in SEEDS}
    seeds = confirm.plan("claims_seeds", [])
    # BatchNorm's mode gap and leak pair over the learning-rate grid (15 pairs): nothing to confirm
    assert seeds.skipped == () or seeds.skipped == []
    assert not {"batchnorm_mode_gap", "batchnorm_leak"} & set(seeds.claims)
    assert [w.split(":")[0] for w in seeds.waiting] == ["post_tuned", "batchnorm", "rmsnorm"]
    with pytest.raises(ValueError, match="preset must be one of"):
        confirm.plan("nowhere", [])
    with pytest.raises(ValueError, match="seeds must be integers >= 0"):
        confirm.plan("claims_mixing", [], seeds=(-1,))


@pytest.mark.parametrize("cfg", [
    RunConfig(depth=24, init="gpt2", lr=1e-2, warmup=100, steps=500),
    RunConfig(norm="dyt", dyt_alpha=(0.8, 0.2, 0.2), embed_scale=8.0, warmup=50, steps=400),
    RunConfig(placement="hc", depth=6), RunConfig(placement="ngpt"), RunConfig(value_residual=True, d_model=256),
])
def test_a_setting_at_seeds_is_a_grid_of_exactly_that_run(cfg):
    assert confirm.at_seeds(cfg, (5, 6)).runs() == [replace(cfg, seed=5), replace(cfg, seed=6)]


def test_the_upper_bound_counts_each_distinct_side_once():
    assert len(confirm.most("claims_mixing").runs()) == 18
    # post, pre (lr and warmup), BatchNorm, pre at warmup 100 (BatchNorm's and RMSNorm's baseline), RMSNorm
    assert len(confirm.most("claims_seeds").runs()) == 5 * 6
    assert confirm.most("quick") is None


def _commit(out, rows):
    """Run directories as a study leaves them: config.json and summary.json."""
    for r in rows:
        cfg = next(c for c in as_study(PRESETS["claims_dyt_budget"]).runs() if c.name() == r["name"])
        d = out / "runs" / f"{r['name']}-0123456789abcdef"
        d.mkdir(parents=True)
        (d / "config.json").write_text(json.dumps({"config": cfg.__dict__, "data_digest": "d"}, default=list))
        (d / "summary.json").write_text(json.dumps({"name": r["name"], "final_val_loss": r["final_val_loss"],
                                                    "final_dev_loss": r["final_dev_loss"], "failed": False}))


def test_the_command_lists_the_runs_it_would_make(tmp_path, capsys):
    _commit(tmp_path, _rows("claims_dyt_budget", _budget_dev))
    assert main(["study", "--preset", "claims_dyt_budget", "--confirm", "--list", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    listed = [line.strip() for line in out.splitlines() if line.startswith("  ")]
    assert sorted(listed) == sorted(f"pre-{n}-L24-lr{lr}-w100-s{s}-c0-gpt2" for n, lr in (("dyt", "0.01"),
                                    ("layer", "0.003")) for s in SEEDS)
    assert "12 confirmation runs (2 settings x 6 seeds)" in " ".join(out.split())


def test_the_command_says_which_claims_wait_and_trains_nothing_then(tmp_path, capsys):
    assert main(["study", "--preset", "claims_dyt_budget", "--confirm", "--out", str(tmp_path)]) == 1
    out = " ".join(capsys.readouterr().out.split())
    assert "not yet: dyt_budget: the arm's setting cannot be chosen yet: 15 of its 15 selection runs" in out
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("args, message", [
    (["--confirm-seeds", "5-10"], "--confirm-seeds needs --confirm"),
    (["--confirm", "--lrs", "1e-3"], "--confirm plans from the preset's own grid (the settings its finished runs "
                                     "chose): drop --lrs"),
    (["--confirm", "--confirm-seeds", "3-10"], "--confirm-seeds 3-10: seeds [3, 4] are the preset's own"),
    (["--confirm", "--confirm-seeds", "a"], "--confirm-seeds must be a-b or comma separated seeds >= 0"),
])
def test_bad_confirmation_options_are_refused_by_name(args, message, tmp_path, capsys):
    assert main(["study", "--preset", "claims_mixing", *args, "--out", str(tmp_path)]) == 2
    assert message in " ".join(capsys.readouterr().err.split())


def test_a_preset_without_a_claim_to_confirm_is_refused(tmp_path, capsys):
    assert main(["study", "--preset", "quick", "--confirm", "--list", "--out", str(tmp_path)]) == 2
    assert "no claim of the claims file pairs runs of the quick preset by seed" in capsys.readouterr().err


def test_confirmation_runs_are_reported_with_the_presets_own(tmp_path):
    from addnorm.experiments.study import run_study
    from addnorm.experiments.study.data import load_split

    data = load_split(max_bytes=1 << 20)
    base = RunConfig(depth=2, d_model=32, heads=2, seq_len=32, batch=4, steps=6, eval_every=3, eval_batches=2,
                     checkpoint_every=3)
    preset = Study((StudyGrid(placements=("pre",), depths=(2,), seeds=(0,), base=base),))
    extra = Study((confirm.at_seeds(preset.runs()[0], (1,)),))
    run_study(preset, data, tmp_path)
    run_study(extra, data, tmp_path, report=Study(preset.parts + extra.parts))
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert sorted(r["seed"] for r in summary["runs"]) == [0, 1] and summary["missing"] == []
