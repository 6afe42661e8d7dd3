"""The study, v2: the frontier forms and their options in the grid, the presets, the flattening rule, the per-slot
saturation and mixing-gain probes, resume after SIGKILL with all of them on, and TensorBoard logging."""

import dataclasses
import json
import math
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch

from addnorm.cli.main import main
from addnorm.experiments.study import PRESETS, RunConfig, StudyGrid, train_run
from addnorm.experiments.study.config import DYT_PAPER_ALPHA, FRONTIER_FORMS, Study
from addnorm.experiments.study.data import load_split
from addnorm.experiments.study.flat import flatten_step, improvement
from addnorm.experiments.study.probe import probe, saturated, slot_of
from addnorm.model.placement import FRONTIER

TINY = dict(depth=2, d_model=32, heads=2, seq_len=32, batch=4, steps=30, eval_every=10, eval_batches=2,
            checkpoint_every=5)


@pytest.fixture(scope="module")
def data():
    return load_split(max_bytes=1 << 20)


def _lines(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


# ---- configuration: the keys of runs finished before the new fields stay; the axes expand without copies

def test_runs_cached_before_the_frontier_fields_keep_their_keys_and_names():
    # keys computed before n_streams, value_residual, dyt_alpha and until_flat existed
    assert RunConfig().key("abc") == "4c725a9dd6317728"
    assert RunConfig(placement="mhc", norm="dyt", depth=24).key("abc") == "62c84d261cc12fdf"
    assert RunConfig(placement="mhc", norm="dyt", depth=24).name() == "mhc-dyt-L24-lr0.003-w0-s0-c0-xavier"
    assert RunConfig(n_streams=None, dyt_alpha=0.5).key("abc") == "4c725a9dd6317728"
    assert RunConfig(value_residual=True).key("abc") != "4c725a9dd6317728"


def test_each_new_field_changes_the_key_and_the_name():
    base = RunConfig(placement="mhc", norm="dyt")
    variants = [RunConfig(placement="mhc", norm="dyt", n_streams=2), RunConfig(placement="mhc", norm="dyt",
                value_residual=True), RunConfig(placement="mhc", norm="dyt", dyt_alpha=DYT_PAPER_ALPHA),
                RunConfig(placement="mhc", norm="dyt", until_flat=True), RunConfig(placement="mhc", norm="dyt",
                                                                                    d_model=256)]
    assert len({base.key("d")} | {v.key("d") for v in variants}) == 6
    assert [v.name().removeprefix(base.name()) for v in variants] == ["-n2", "-vr", "-a0.8_0.2_0.2", "-flat",
                                                                      "-d256"]


def test_axes_a_run_cannot_use_are_not_copies_of_it():
    g = StudyGrid(placements=("pre", "mhc", "ngpt"), norms=("layer", "dyt"), n_streams=(2, 4),
                  dyt_alphas=(0.5, DYT_PAPER_ALPHA))
    runs = g.runs()
    assert len(runs) == len(set(runs))
    names = [r.name() for r in runs]
    # pre: layer, dyt x 2 alphas; mhc: (layer + dyt x 2 alphas) x 2 widths; ngpt: one (no norm kind, one stream)
    assert len(runs) == 3 + 6 + 1
    assert "pre-layer-L6-lr0.003-w0-s0-c0-xavier" in names and "mhc-dyt-L6-lr0.003-w0-s0-c0-xavier-n2-a0.8_0.2_0.2" \
        in names and "ngpt-layer-L6-lr0.003-w0-s0-c0-xavier" in names


def test_the_model_gets_every_frontier_option():
    c = RunConfig(placement="hc", norm="derf", n_streams=2, value_residual=True, dyt_alpha=DYT_PAPER_ALPHA,
                  d_model=48).gpt_config()
    assert (c.placement, c.norm, c.streams, c.value_residual, c.n_embd) == ("hc", "derf", 2, True, 48)
    assert (c.slot_alpha("attn"), c.slot_alpha("mlp"), c.slot_alpha("final")) == DYT_PAPER_ALPHA


def test_every_frontier_form_and_option_is_on_the_command_line(capsys):
    args = ["study", "--preset", "quick", "--list", "--placements", "hc,mhc,mhc_lite,lns,denseformer,hybrid,"
            "hybrid_star,ngpt", "--norms", "derf", "--n-streams", "2,3", "--value-residual", "--dyt-alpha",
            "0.5,0.8/0.2/0.2", "--warmups", "0", "--d-model", "48"]
    assert main(args) == 0
    out = capsys.readouterr().out
    # 3 widened x 2 widths x 2 alphas + 4 single-stream (lns, denseformer, hybrid, hybrid_star) x 2 alphas + ngpt
    assert "21 runs" in out
    assert "mhc_lite-derf-L6-lr0.003-w0-s0-c0-xavier-d48-n3-vr-a0.8_0.2_0.2" in out
    assert "ngpt-layer-L6-lr0.003-w0-s0-c0-xavier-d48-vr" in out
    assert main(["study", "--preset", "quick", "--list", "--value-residual", "on,off", "--warmups", "0"]) == 0
    assert "4 runs" in capsys.readouterr().out


@pytest.mark.parametrize("args, message", [
    (["--n-streams", "0", "--placements", "mhc"], "--n-streams must be >= 1, got 0"),
    (["--n-streams", "two", "--placements", "mhc"], "--n-streams: 'two' is not a valid int"),
    (["--n-streams", "2"], "--n-streams needs a widened-stream placement (hc, mhc, mhc_lite) in the grid"),
    (["--n-streams", "7", "--placements", "mhc_lite"], "--n-streams n_streams=7 is too wide for mhc_lite"),
    (["--dyt-alpha", "0.8/0.2"], "--dyt-alpha: '0.8/0.2' is not a valid alpha (one number, or attention/FFN/final"),
    (["--dyt-alpha", "0.8/0.2/0.2"], "--dyt-alpha needs a DyT or Derf norm in the grid (--norms dyt or derf)"),
    (["--dyt-alpha", "-1", "--norms", "dyt"], "--dyt-alpha must be numbers > 0, got -1.0"),
    (["--value-residual", "maybe"], "--value-residual: 'maybe' is not a valid on or off"),
    (["--d-model", "30"], "--d-model 30 must be divisible by heads (4)"),
    (["--d-model", "0"], "--d-model must be an integer >= 1, got 0"),
])
def test_the_frontier_options_are_validated_in_one_line(args, message, capsys):
    assert main(["study", "--preset", "quick", *args]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_tensorboard_without_the_package_names_the_option(monkeypatch, tmp_path, capsys):
    from addnorm.experiments.study import tensorboard

    monkeypatch.setattr(tensorboard, "available", lambda: False)
    assert main(["study", "--preset", "quick", "--steps", "5", "--warmups", "0", "--out", str(tmp_path), "--tensorboard",
                 str(tmp_path / "tb")]) == 2
    err = capsys.readouterr().err
    assert "--tensorboard needs the tensorboard package" in err and "pip install tensorboard" in err
    assert not (tmp_path / "runs").exists()


# ---- presets

def test_the_frontier_preset_puts_every_form_beside_the_seeds_placements_with_5_seeds():
    runs = PRESETS["frontier"].runs()
    assert len(runs) == len(set(runs)) == 220
    # HybridNorm at its paper's init (Megatron's: "gpt2"), with pre and post at that init as its baselines
    assert {(r.placement, r.lr) for r in runs if r.init == "gpt2"} == {
        (p, lr) for p in ("pre", "post", "hybrid", "hybrid_star") for lr in (1e-3, 3e-3)}
    forms = {(r.placement, r.norm, r.value_residual, r.dyt_alpha, r.init) for r in runs}
    assert {p for p, *_ in forms} == set(FRONTIER) | {"pre", "post", "sandwich", "deepnorm", "mix", "layerscale",
                                                      "attn_res"}
    assert set(FRONTIER_FORMS) >= set(FRONTIER)
    assert ("pre", "derf", False, 0.5, "xavier") in forms and ("pre", "layer", True, 0.5, "xavier") in forms
    assert ("pre", "dyt", False, DYT_PAPER_ALPHA, "xavier") in forms
    for form in forms:
        seeds = sorted(r.seed for r in runs if (r.placement, r.norm, r.value_residual, r.dyt_alpha, r.init) == form
                       and r.lr == 1e-3)
        assert seeds == [0, 1, 2, 3, 4]


def test_the_depth_long_wide_mixing_and_dyt_presets():
    depth = PRESETS["depth"].runs()
    assert {r.depth for r in depth} == {6, 12, 24, 48}
    assert {r.placement for r in depth} == {"post", "pre", "deepnorm", "mix", "lns"}
    long = PRESETS["long"].runs()
    assert all(r.until_flat and r.steps == 10000 for r in long) and ("pre", "dyt") in {(r.placement, r.norm)
                                                                                       for r in long}
    assert {r.d_model for r in PRESETS["wide"].runs()} == {256}
    mixing = PRESETS["mixing"].runs()
    assert {(r.placement, r.depth) for r in mixing} == {(p, d) for p in ("hc", "mhc", "mhc_lite") for d in (6, 12, 24)}
    alphas = {r.dyt_alpha for r in PRESETS["dyt"].runs() if r.norm in ("dyt", "derf")}
    assert DYT_PAPER_ALPHA in alphas and 0.5 in alphas and len(alphas) == 5
    assert isinstance(PRESETS["long"], Study)


# ---- the flattening rule, by hand

def test_the_flattening_rule_by_hand():
    falling = [(100 * i, 3.0 - 0.1 * i) for i in range(1, 12)]  # 10 % better every 100 steps
    assert improvement(falling[:9]) is None  # fewer than 10 evaluations: not judged
    # at 1100 steps: best up to 880 (step 800: 2.2) vs best overall (1100: 1.9): 13.6 % -- not flat
    assert improvement(falling) == pytest.approx((2.2 - 1.9) / 2.2)
    assert flatten_step(falling) is None
    level = [(100 * i, 2.0 + 0.5 / i) for i in range(1, 30)]  # 2 + 0.5/i: gains shrink
    at = flatten_step(level)
    t = at / 100  # first t with (0.5/floor(0.8t) - 0.5/t) / (2 + 0.5/floor(0.8t)) < 0.01
    assert t == min(i for i in range(10, 30) if (0.5 / math.floor(0.8 * i) - 0.5 / i) / (2 + 0.5 / math.floor(0.8 * i))
                    < 0.01)
    noisy = [(100 * i, 2.0) for i in range(1, 10)] + [(1000, 2.5)]  # one bad evaluation: the best still counts
    assert improvement(noisy) == 0.0 and flatten_step(noisy) == 1000
    # on the unigram plateau a level curve has not flattened: it has not started (long's DyT seeds left it late)
    assert flatten_step(noisy, plateau=2.0) is None and flatten_step(noisy, plateau=2.01) == 1000
    leaves = [(100 * i, 3.2) for i in range(1, 12)] + [(100 * i, 1.5) for i in range(12, 40)]
    assert flatten_step(leaves[:11]) == 1000 and flatten_step(leaves[:11], plateau=3.1) is None
    assert flatten_step(leaves, plateau=3.1) == min(s for s, _ in leaves if s * 0.8 >= 1200)  # flat once 1.5 is
    #                                                                       the best of the window's first 80 %
    # below the plateau once, then back on it: on the plateau (the last 20 % decides), until it leaves again
    dips = [(100, 3.24), (200, 3.10)] + [(100 * i, 3.24) for i in range(3, 16)]
    assert flatten_step(dips) == 1000 and flatten_step(dips, plateau=3.14) is None
    assert flatten_step(dips + [(1600, 3.0), (1700, 3.0)], plateau=3.14) is None  # 3.0 in the window, not flat yet
    # a NaN evaluation in the window: not judged flat
    assert flatten_step(noisy[:9] + [(1000, math.nan)]) is None and flatten_step(noisy[:9] + [(1000, 2.0)]) == 1000


# ---- the probes

def test_saturation_counts_the_bounded_functions_argument():
    z = torch.tensor([-3.0, -2.0, -1.0, 0.0, 2.5, 1.9])
    assert saturated(z) == (2, 6)  # |z| > 2: -3 and 2.5 (2.0 itself is not past it)
    assert [slot_of(n) for n in ("h.3.attn.norm_before", "h.0.mlp.norm_sum", "ln_f", "h.1.attn.fn.q_norm")] == \
        ["attn", "mlp", "final", "attn"]


@pytest.mark.parametrize("norm", ["dyt", "derf"])
def test_probe_measures_saturation_per_slot_against_a_direct_count(norm):
    from addnorm.model import GPT

    torch.manual_seed(0)
    model = GPT(RunConfig(placement="pre", norm=norm, depth=2, d_model=32, heads=2, dyt_alpha=(40.0, 3.0, 0.1))
                .gpt_config())
    x = torch.randint(0, 256, (2, 16))
    got = probe(model, x)
    inputs = {}
    hooks = [m.register_forward_hook(lambda mod, a, o, n=n: inputs.setdefault(n, []).append(
        (mod.alpha * o[1] + (mod.shift if norm == "derf" else 0)).detach()))
        for n, m in model.named_modules() if type(m).__name__ in ("DyT", "Derf")]
    model.eval()
    model(x)
    for h in hooks:
        h.remove()
    for slot in ("attn", "mlp", "final"):
        z = torch.cat([t.flatten() for n, ts in inputs.items() if slot_of(n) == slot for t in ts])
        assert got["saturation"][slot] == (z.abs() > 2).float().mean().item()
    assert got["alpha"] == pytest.approx({"attn": 40.0, "mlp": 3.0, "final": 0.1})
    assert got["saturation"]["attn"] > got["saturation"]["final"]  # alpha 40 vs 0.1 on comparable inputs
    assert "composite_gain_fwd" not in got


# ---- the runner: the measures per evaluation and in the summary

def test_a_widened_run_records_the_composite_gain_per_evaluation_and_its_maximum(data, tmp_path):
    s = train_run(RunConfig(**TINY, placement="hc", n_streams=3), data, tmp_path)
    evals = [m for m in _lines(tmp_path) if "val_loss" in m]
    assert len(evals) == 3 and all(len(m["composite_gain_fwd"]) == 2 * TINY["depth"] for m in evals)
    assert s["max_composite_gain_fwd"] == max(evals[-1]["composite_gain_fwd"])
    assert s["max_composite_gain_bwd"] == max(evals[-1]["composite_gain_bwd"])
    lite = train_run(RunConfig(**TINY, placement="mhc_lite", n_streams=3), data, tmp_path / "lite")
    assert lite["max_composite_gain_fwd"] == pytest.approx(1.0, abs=1e-5)  # doubly stochastic: gain 1 exactly
    assert "saturation" not in s and "max_composite_gain_fwd" not in train_run(RunConfig(**TINY), data,
                                                                               tmp_path / "pre")
    assert "saturation_curve" not in s  # no DyT/Derf slot


def test_an_attn_res_run_trains_and_records_its_depth_state_per_block(data, tmp_path):
    """Attention Residuals' blocks hand on the depth state (a list of sources and a partial sum), not one stream: the
    per-block statistics read its newest source."""
    s = train_run(RunConfig(**{**TINY, "steps": 6, "eval_every": 3}, placement="attn_res"), data, tmp_path)
    assert s.get("failure") in (None, "plateau") and math.isfinite(s["final_val_loss"])  # 6 steps: still on it
    step = [m for m in _lines(tmp_path) if "stream_rms" in m][-1]
    assert len(step["stream_rms"]) == TINY["depth"] and all(v > 0 and math.isfinite(v) for v in step["stream_rms"])


def test_a_dyt_run_keeps_the_saturation_of_every_evaluation(data, tmp_path):
    """``saturation_curve``: [steps done, {slot: fraction}] per evaluation (the last one is ``saturation``), steps
    counted as the validation curve's; a run finished before it existed gets it from its metrics.jsonl."""
    s = train_run(RunConfig(**{**TINY, "steps": 12, "eval_every": 4}, norm="dyt"), data, tmp_path)
    evals = [m for m in _lines(tmp_path) if "val_loss" in m]
    assert s["saturation_curve"] == [[m["step"] + 1, m["saturation"]] for m in evals]
    assert [step for step, _ in s["saturation_curve"]] == [4, 8, 12] and s["saturation_curve"][-1][1] == s["saturation"]
    assert json.loads((tmp_path / "summary.json").read_text())["saturation_curve"] == s["saturation_curve"]
    old = {k: v for k, v in s.items() if k != "saturation_curve"}
    (tmp_path / "summary.json").write_text(json.dumps(old))  # as a run finished before it existed
    again = train_run(RunConfig(**{**TINY, "steps": 12, "eval_every": 4}, norm="dyt"), data, tmp_path)
    assert again["reused"] and again["saturation_curve"] == s["saturation_curve"]
    assert json.loads((tmp_path / "summary.json").read_text())["saturation_curve"] == s["saturation_curve"]


def test_every_run_records_tokens_parameters_and_whether_it_flattened(data, tmp_path):
    s = train_run(RunConfig(**TINY), data, tmp_path)
    assert s["tokens_seen"] == 30 * 4 * 32
    assert s["n_params"] == sum(p.numel() for p in __import__("addnorm.experiments.study.runner",
                                fromlist=["build_model"]).build_model(RunConfig(**TINY)).parameters())
    assert s["flattened"] is False and s["flatten_step"] is None and s["stopped_flat"] is False
    old = {k: v for k, v in s.items() if k not in ("flattened", "flatten_step", "tokens_seen", "n_params")}
    (tmp_path / "summary.json").write_text(json.dumps(old))  # as a run finished before these existed
    again = train_run(RunConfig(**TINY), data, tmp_path)
    assert again["reused"] and again["flattened"] is False and again["tokens_seen"] == s["tokens_seen"]
    assert again["n_params"] == s["n_params"]


FLAT = dict(TINY, steps=60, eval_every=2, checkpoint_every=4, lr=1e-7, placement="mhc", norm="dyt",
            dyt_alpha=DYT_PAPER_ALPHA, until_flat=True)


def _below_plateau(data):
    """The corpus with its unigram plateaus (the dev split's and the test split's) raised above any loss: every curve
    counts as having left it, and no final loss as on it."""
    return dataclasses.replace(data, unigram_nats=1e9, test_unigram_nats=1e9)


def test_until_flat_stops_at_the_first_flat_evaluation(data, tmp_path):
    s = train_run(RunConfig(**FLAT), _below_plateau(data), tmp_path)
    # lr 1e-7: nothing moves, so the 10th evaluation (20 steps) is the first the rule may judge, and it is flat
    assert s["stopped_flat"] and s["flattened"] and s["flatten_step"] == 20 and s["steps_done"] == 20
    assert s["failure"] is None and len(_lines(tmp_path)) == 20
    assert torch.load(tmp_path / "checkpoint.pt", weights_only=True)["step"] == 20
    evals = [m for m in _lines(tmp_path) if "val_loss" in m]
    assert all(set(m["saturation"]) == {"attn", "mlp", "final"} and "composite_gain_fwd" in m for m in evals)
    assert set(s["saturation"]) == {"attn", "mlp", "final"} and s["alpha"]["attn"] == pytest.approx(0.8, abs=1e-4)
    capped = train_run(RunConfig(**{**FLAT, "until_flat": False}), _below_plateau(data), tmp_path / "capped")
    assert capped["steps_done"] == 60 and capped["flattened"] and capped["flatten_step"] == 20


def test_until_flat_does_not_stop_a_run_on_the_unigram_plateau(data, tmp_path):
    """The same level curve, but at the real plateau: the run trains to its cap and fails as a plateau there."""
    s = train_run(RunConfig(**FLAT), data, tmp_path)
    assert s["final_val_loss"] >= data.test_unigram_nats
    assert not s["stopped_flat"] and not s["flattened"] and s["flatten_step"] is None and s["steps_done"] == 60
    assert s["failure"] == "plateau"


@pytest.mark.parametrize("kill_at", [13, 19])  # mid-way between checkpoints; at the flat step, before the summary
def test_resume_after_sigkill_with_the_probes_and_the_stopping_rule_is_bit_identical(data, tmp_path, kill_at):
    cfg = dict(FLAT, lr=3e-3) if kill_at == 13 else FLAT  # lr 3e-3: a run that trains (probes change), no stop
    raise_plateau = kill_at == 19  # the level run stops at its 20th step only off the plateau (see flat.py)
    used = _below_plateau(data) if raise_plateau else data
    whole = train_run(RunConfig(**cfg), used, tmp_path / "whole")
    code = f"""
        import dataclasses, os, signal
        from addnorm.experiments.study import RunConfig, train_run
        from addnorm.experiments.study.data import load_split
        def die(step):
            if step == {kill_at}:
                os.kill(os.getpid(), signal.SIGKILL)
        data = load_split(max_bytes=1 << 20)
        if {raise_plateau!r}:
            data = dataclasses.replace(data, unigram_nats=1e9, test_unigram_nats=1e9)
        train_run(RunConfig(**{cfg!r}), data, {str(tmp_path / "cut")!r}, on_step=die)
    """
    p = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=300)
    assert p.returncode == -signal.SIGKILL, p.stderr
    assert not (tmp_path / "cut" / "summary.json").exists()
    resumed = train_run(RunConfig(**cfg), used, tmp_path / "cut")
    assert _lines(tmp_path / "cut") == _lines(tmp_path / "whole")
    for k in ("final_val_loss", "steps_done", "flattened", "flatten_step", "stopped_flat", "saturation",
              "max_composite_gain_fwd", "max_composite_gain_bwd"):
        assert resumed[k] == whole[k], k


# ---- TensorBoard

def test_tensorboard_holds_the_metrics_lines_and_a_resume_purges_the_lost_steps(data, tmp_path):
    pytest.importorskip("tensorboard", reason="the tensorboard package is not installed (the test extra has it)")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    cfg = RunConfig(**TINY, placement="mhc", norm="dyt")
    code = f"""
        import os, signal
        from pathlib import Path
        from addnorm.experiments.study import RunConfig, train_run
        from addnorm.experiments.study.data import load_split
        def die(step):
            if step == 17:
                os.kill(os.getpid(), signal.SIGKILL)
        train_run(RunConfig(**{TINY!r}, placement="mhc", norm="dyt"), load_split(max_bytes=1 << 20),
                  {str(tmp_path / "run")!r}, on_step=die, tensorboard=Path({str(tmp_path / "tb")!r}))
    """
    p = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=300)
    assert p.returncode == -signal.SIGKILL, p.stderr
    # TensorBoard reads a directory's event files in the order of their names, which start with the second they
    # were opened: a resume within the same second as the crash could be read first, before the purge applies
    time.sleep(1.1)
    train_run(cfg, data, tmp_path / "run", tensorboard=tmp_path / "tb")
    acc = EventAccumulator(str(tmp_path / "tb" / "run"), size_guidance={"scalars": 0}).Reload()
    lines = _lines(tmp_path / "run")
    loss = acc.Scalars("loss")
    assert [e.step for e in loss] == list(range(30))  # steps 15-17 written twice: the first copy purged
    assert [e.value for e in loss] == pytest.approx([m["loss"] for m in lines], rel=1e-6)
    assert [e.value for e in acc.Scalars("val_loss")] == pytest.approx([m["val_loss"] for m in lines
                                                                       if "val_loss" in m], rel=1e-6)
    assert [e.value for e in acc.Scalars("layer_grad_norm/block_1")] == pytest.approx(
        [m["layer_grad_norm"][1] for m in lines], rel=1e-6)
    assert [e.value for e in acc.Scalars("saturation/attn")] == pytest.approx(
        [m["saturation"]["attn"] for m in lines if "saturation" in m], rel=1e-6, abs=1e-9)


def test_the_cli_writes_tensorboard_next_to_the_jsonl(tmp_path, capsys):
    pytest.importorskip("tensorboard", reason="the tensorboard package is not installed (the test extra has it)")
    assert main(["study", "--preset", "quick", "--steps", "6", "--warmups", "0", "--placements", "pre",
                 "--out", str(tmp_path / "out"), "--tensorboard", str(tmp_path / "tb")]) == 0
    (run,) = (tmp_path / "tb").iterdir()
    assert (tmp_path / "out" / "runs" / run.name / "metrics.jsonl").exists()
    assert any(f.name.startswith("events.out.tfevents") for f in run.iterdir())
