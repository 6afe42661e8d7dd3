"""The DyT/Derf audit's cause: the token embedding's scale as a study axis (GPTConfig.embed_scale, a learned scalar
starting at the option's value), off by default so that every cached run keeps its key and name."""

import math

import pytest
import torch

from addnorm.cli.main import main
from addnorm.experiments.study import PRESETS, RunConfig, StudyGrid
from addnorm.experiments.study.config import DYT_PAPER_ALPHA, EMBED_SCALES, UNIT_RMS, StudyConfigError
from addnorm.experiments.study.runner import build_model


def test_off_by_default_every_cached_run_keeps_its_key_and_name():
    assert RunConfig().embed_scale is None
    assert RunConfig(embed_scale=None).key("abc") == "4c725a9dd6317728"  # the key before the field existed
    assert RunConfig(embed_scale=None).name() == "pre-layer-L6-lr0.003-w0-s0-c0-xavier"
    assert RunConfig().gpt_config().embed_scale is None


def test_a_scale_changes_the_key_and_the_name_and_8_is_8_0():
    a, b = RunConfig(embed_scale=8), RunConfig(embed_scale=8.0)
    assert a == b and a.key("d") == b.key("d") != RunConfig().key("d")
    assert a.name() == "pre-layer-L6-lr0.003-w0-s0-c0-xavier-e8"
    assert RunConfig(embed_scale=UNIT_RMS).name().endswith("-e50")


def test_the_model_starts_with_the_scale_and_unit_rms_gives_embeddings_at_rms_1():
    m = build_model(RunConfig(embed_scale=UNIT_RMS, depth=2, d_model=64))
    assert m.embed_scale.item() == pytest.approx(50.0) and m.embed_scale.requires_grad
    emb = m.embed_scale * m.wte.weight
    assert emb.pow(2).mean().sqrt().item() == pytest.approx(1.0, rel=0.02)  # 256 x 64 draws of N(0, 0.02) x 50
    plain = build_model(RunConfig(depth=2, d_model=64))
    assert plain.embed_scale is None
    assert plain.wte.weight.pow(2).mean().sqrt().item() == pytest.approx(0.02, rel=0.02)
    assert EMBED_SCALES == (None, math.sqrt(64), UNIT_RMS)


@pytest.mark.parametrize("bad", [0, -1.0, float("nan"), True, "8"])
def test_bad_scales_are_refused_naming_the_field(bad):
    with pytest.raises(StudyConfigError, match="embed_scale must be a finite number > 0 or None"):
        RunConfig(embed_scale=bad)


def test_ngpt_gets_no_scale_in_a_grid_and_is_refused_one_alone():
    with pytest.raises(StudyConfigError, match="embed_scale nGPT"):
        RunConfig(placement="ngpt", embed_scale=8.0)
    runs = StudyGrid(placements=("pre", "ngpt"), embed_scales=(None, 8.0)).runs()
    assert sorted((r.placement, r.embed_scale or 0) for r in runs) == [("ngpt", 0), ("pre", 0), ("pre", 8.0)]


def test_the_dyt_preset_runs_the_cause_with_5_seeds_beside_the_alpha_sweep():
    runs = PRESETS["dyt"].runs()
    assert len(runs) == len(set(runs)) == 162
    cause = [r for r in runs if r.seed > 0]
    for norm, alphas in (("dyt", (0.5, DYT_PAPER_ALPHA)), ("derf", (0.5, DYT_PAPER_ALPHA)), ("layer", (0.5,))):
        for a in alphas:
            for e in EMBED_SCALES:
                for lr in (1e-3, 3e-3):
                    seeds = sorted(r.seed for r in runs if (r.norm, r.dyt_alpha, r.embed_scale, r.lr) ==
                                   (norm, a, e, lr))
                    assert seeds == [0, 1, 2, 3, 4], (norm, a, e, lr)
    assert {r.embed_scale for r in cause} == set(EMBED_SCALES)
    assert {r.dyt_alpha for r in runs if r.embed_scale is None and r.seed == 0 and r.norm == "dyt"} == \
        {0.2, 0.5, DYT_PAPER_ALPHA, 2.0, 8.0}  # the committed alpha sweep, reused


def test_the_command_line_takes_the_scales(capsys):
    assert main(["study", "--preset", "quick", "--list", "--placements", "pre", "--warmups", "0",
                 "--embed-scale", "off,8,50"]) == 0
    out = capsys.readouterr().out
    assert "3 runs" in out and "xavier-e8" in out and "xavier-e50" in out
    assert main(["study", "--preset", "quick", "--placements", "pre", "--embed-scale", "-2"]) == 2
    err = capsys.readouterr().err
    assert "--embed-scale must be a finite number > 0 or None (off), got -2.0" in err
    assert main(["study", "--preset", "quick", "--placements", "ngpt", "--embed-scale", "8"]) == 2
    assert "--embed-scale needs a placement other than ngpt" in capsys.readouterr().err


def test_the_scale_learns(tmp_path):
    from addnorm.experiments.study import train_run
    from addnorm.experiments.study.data import load_split

    cfg = RunConfig(depth=2, d_model=32, heads=2, seq_len=32, batch=4, steps=3, eval_every=3, eval_batches=1,
                    norm="dyt", embed_scale=8.0)
    s = train_run(cfg, load_split(max_bytes=1 << 20), tmp_path)
    state = torch.load(tmp_path / "checkpoint.pt", weights_only=True)["model"]
    assert state["embed_scale"].item() != 8.0 and s["config"]["embed_scale"] == 8.0
