"""`addnorm study`: resumable runs (bit-identical after SIGKILL), corrupt files redone, content-keyed cache,
divergence detected, arguments validated, the grid's outputs."""

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from addnorm.cli.main import main
from addnorm.experiments.study import RunConfig, StudyGrid, train_run
from addnorm.experiments.study.data import load_split

TINY = dict(depth=2, d_model=32, heads=2, seq_len=32, batch=4, steps=30, eval_every=10, eval_batches=2,
            checkpoint_every=5)


@pytest.fixture(scope="module")
def data():
    return load_split(max_bytes=1 << 20)


def _losses(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_split_is_by_file_and_deterministic(data):
    again = load_split(max_bytes=1 << 20)
    assert data.digest == again.digest and data.test_files and data.dev_files
    assert len(data.train_files) > len(data.test_files) + len(data.dev_files)
    assert 2.0 < data.unigram_nats < 5.6  # bytes of source code: well below log(256) = 5.55


def test_resume_after_sigkill_is_bit_identical(data, tmp_path):
    cfg = RunConfig(**TINY, placement="post", lr=3e-3)
    whole = train_run(cfg, data, tmp_path / "whole")
    code = f"""
        import os, signal
        from addnorm.experiments.study import RunConfig, train_run
        from addnorm.experiments.study.data import load_split
        def die(step):
            if step == 17:  # after the checkpoint at step 15, mid-way to the next
                os.kill(os.getpid(), signal.SIGKILL)
        train_run(RunConfig(**{TINY!r}, placement="post", lr=3e-3), load_split(max_bytes=1 << 20),
                  {str(tmp_path / "cut")!r}, on_step=die)
    """
    p = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=300)
    assert p.returncode == -signal.SIGKILL, p.stderr
    assert not (tmp_path / "cut" / "summary.json").exists()
    resumed = train_run(cfg, data, tmp_path / "cut")
    assert _losses(tmp_path / "cut") == _losses(tmp_path / "whole")  # every metric of every step, bit for bit
    assert resumed["final_val_loss"] == whole["final_val_loss"]
    a = torch.load(tmp_path / "whole" / "checkpoint.pt", weights_only=True)["model"]
    b = torch.load(tmp_path / "cut" / "checkpoint.pt", weights_only=True)["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_a_checkpoint_from_before_the_scalars_were_one_element_resumes_bit_identical(data, tmp_path):
    """DyT's alpha was 0-d, in the model and in AdamW's moments: such a checkpoint loaded but the next step failed.
    It resumes now, and the run is the uninterrupted one's, bit for bit."""
    cfg = RunConfig(**TINY, norm="dyt", lr=3e-3)
    train_run(cfg, data, tmp_path / "whole")

    class Stop(Exception):
        pass

    def stop(step):
        if step == 17:  # after the checkpoint at step 15
            raise Stop

    with pytest.raises(Stop):
        train_run(cfg, data, tmp_path / "cut", on_step=stop)
    path = tmp_path / "cut" / "checkpoint.pt"
    ck = torch.load(path, weights_only=True)
    scalars = [k for k, t in ck["model"].items() if t.shape == (1,)]
    assert scalars  # the DyT alphas
    for k in scalars:
        ck["model"][k] = ck["model"][k].reshape(())
    for state in ck["optimizer"]["state"].values():  # their moments: the only (1,) state
        for k, t in state.items():
            if k != "step" and t.shape == (1,):
                state[k] = t.reshape(())
    torch.save(ck, path)
    resumed = train_run(cfg, data, tmp_path / "cut")
    assert not any("unreadable" in n for n in resumed["notes"])  # resumed, not restarted
    assert _losses(tmp_path / "cut") == _losses(tmp_path / "whole")


def test_finished_runs_are_reused_and_corrupt_files_redone(data, tmp_path):
    cfg = RunConfig(**TINY)
    first = train_run(cfg, data, tmp_path)
    assert train_run(cfg, data, tmp_path)["reused"] is True
    (tmp_path / "summary.json").write_text('{"key": "trunc')
    (tmp_path / "checkpoint.pt").write_bytes(b"not a checkpoint")
    redone = train_run(cfg, data, tmp_path)
    assert redone["reused"] is False and redone["final_val_loss"] == first["final_val_loss"]
    assert any("summary.json" in n for n in redone["notes"]) and any("checkpoint.pt" in n for n in redone["notes"])


def test_the_generalization_gap_is_recorded_and_backfilled_for_older_runs(data, tmp_path):
    s = train_run(RunConfig(**TINY), data, tmp_path)
    assert s["generalization_gap"] == s["final_val_loss"] - s["final_train_split_loss"]
    assert 0 < s["final_train_split_loss"] < 6
    old = {k: v for k, v in s.items() if k not in ("final_train_split_loss", "generalization_gap")}
    (tmp_path / "summary.json").write_text(json.dumps(old))  # as a run finished before the measure existed
    again = train_run(RunConfig(**TINY), data, tmp_path)  # measured from the final checkpoint
    assert again["reused"] and again["final_train_split_loss"] == s["final_train_split_loss"]
    assert json.loads((tmp_path / "summary.json").read_text())["generalization_gap"] == s["generalization_gap"]


def test_the_cache_key_is_the_data_content_not_its_path(tmp_path):
    def folder(name, text):
        d = tmp_path / name
        d.mkdir()
        for i in range(3):
            (d / f"f{i}.txt").write_text(text * 400 + str(i))
        return d

    small = dict(test_bytes=2048, dev_bytes=2048)  # three files: one for each split
    a, b = load_split(folder("a", "the residual stream "), **small), load_split(folder("b", "other words here "), **small)
    cfg = RunConfig(**TINY)
    assert cfg.key(a.digest) != cfg.key(b.digest)
    assert cfg.key(a.digest) == cfg.key(load_split(tmp_path / "a", **small).digest)
    assert cfg.key(a.digest) != cfg.key(load_split(tmp_path / "a", test_bytes=1024, dev_bytes=2048).digest)


def test_divergence_is_detected_and_stops_the_run(data, tmp_path):
    s = train_run(RunConfig(**{**TINY, "steps": 60}, placement="post", lr=30.0), data, tmp_path)
    assert s["failed"] and s["failure"] in ("nan", "spike", "plateau")
    if s["failure"] != "plateau":
        assert s["steps_done"] < 60


@pytest.mark.parametrize("args, message", [
    (["--depths", "0"], "--depths must be an integer >= 1, got 0"),
    (["--lrs", "fast"], "--lrs: 'fast' is not a valid float"),
    (["--placements", "prenorm"], "--placements unknown ['prenorm']"),
    (["--norms", "group"], "--norms must be one of"),
    (["--steps", "0"], "--steps must be an integer >= 1, got 0"),
    (["--shard", "2/2"], "--shard must be i/n with 0 <= i < n"),
    (["--out", "/proc/addnorm-cannot-write"], "--out: /proc/addnorm-cannot-write is not a writable directory"),
    (["--data", "/nonexistent"], "--data: --data /nonexistent: no such file or directory"),
    (["--warmups", "400"], "--warmups 400 must be smaller than steps (400)"),
    (["--out", "/proc/[bold]x"], "--out: /proc/[bold]x is not a writable directory"),  # printed as written
    (["--test-bytes", "0"], "--test-bytes: test_bytes must be an integer >= 1, got 0"),
])
def test_arguments_are_validated_before_any_work(args, message, capsys):
    assert main(["study", "--preset", "quick", *args]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_a_value_given_twice_is_one_run(capsys):
    assert main(["study", "--preset", "quick", "--list", "--seeds", "0,0", "--warmups", "0"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "2 runs" in out and "seeds: 0;" in out


def test_the_printed_grid_keeps_its_brackets(capsys):
    assert main(["study", "--preset", "quick", "--list"]) == 0
    assert "[d_model 64, 4 heads" in " ".join(capsys.readouterr().out.split())


def test_the_paper_preset_is_the_deep_comparison_with_dyt_beside_it(capsys):
    from addnorm.experiments.study import PRESETS

    runs = PRESETS["paper"].runs()
    assert len(runs) == len(set(runs)) == 96 and {r.depth for r in runs} == {24}
    assert {(r.placement, r.norm) for r in runs if r.norm == "dyt"} == {("pre", "dyt")}
    assert main(["study", "--preset", "paper", "--list", "--lrs", "1e-3", "--seeds", "0"]) == 0
    out = capsys.readouterr().out
    assert "8 runs" in out and "pre-dyt-L24-lr0.001-w100-s0" in out


def test_a_small_grid_writes_its_tables_and_figures(tmp_path, capsys):
    small = ["--preset", "quick", "--steps", "12", "--warmups", "0,5", "--out", str(tmp_path)]
    assert main(["study", *small, "--shard", "0/2"]) == 0
    half = json.loads((tmp_path / "summary.json").read_text())
    assert len(half["runs"]) == 2 and len(half["missing"]) == 2
    assert main(["study", *small, "--shard", "1/2"]) == 0
    merged = json.loads((tmp_path / "summary.json").read_text())
    assert len(merged["runs"]) == 4 and not merged["missing"]
    assert "warmup_lr_failures.png" in merged_figures(tmp_path) and "grad_norm_vs_depth.png" in merged_figures(tmp_path)
    for f in ("summary.csv", "summary.md", "index.html", "report.json", "figures/val_loss_curves.png"):
        assert (tmp_path / f).stat().st_size > 0
    out = capsys.readouterr().out
    assert "4 runs" in out and "placements: post, pre" in out
    shown = json.loads((tmp_path / "report.json").read_text())
    page = (tmp_path / "index.html").read_text()
    assert all(f'data-key="{k}">{v["text"]}<' in page for k, v in shown.items())
    _renders_in_chromium(tmp_path / "index.html", tmp_path, images=len(merged_figures(tmp_path)))


def merged_figures(out):
    return sorted(p.name for p in (out / "figures").glob("*.png"))


def _renders_in_chromium(index, tmp_path, images):
    import re
    import shutil

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        if os.environ.get("CI"):
            pytest.fail("Chromium is required in CI (.ci/run installs Debian's chromium package)")
        pytest.skip("Chromium is not installed (apt-get install chromium); CI installs it and runs this check")
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", f"--user-data-dir={tmp_path / 'u'}",
             "--virtual-time-budget=10000", "--dump-dom", index.resolve().as_uri()]
    dom = subprocess.run([chromium, *flags], capture_output=True, text=True, timeout=120).stdout
    m = re.search(r'data-images="(\d+)/(\d+)"', dom)
    assert m and int(m.group(1)) == int(m.group(2)) == images, dom[-500:]


def test_batchnorm_leaks_the_future_in_training_and_layernorm_does_not(data, tmp_path):
    ln = train_run(RunConfig(**{**TINY, "steps": 10}, norm="layer"), data, tmp_path / "ln")
    bn = train_run(RunConfig(**{**TINY, "steps": 10}, norm="batch"), data, tmp_path / "bn")
    assert ln["future_leak"] == 0.0
    assert bn["future_leak"] > 1e-4
    assert bn["train_mode_val_loss"] != bn["final_val_loss"]


def _ddp_worker(rank, world, init_file, out_dir):
    import torch.distributed as dist

    from addnorm.experiments.study import RunConfig, train_run
    from addnorm.experiments.study.data import load_split

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    train_run(RunConfig(**TINY), load_split(max_bytes=1 << 20), out_dir)
    dist.barrier()
    dist.destroy_process_group()


def test_ddp_with_two_processes_equals_one_process(data, tmp_path):
    import torch.multiprocessing as mp

    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    mp.spawn(_ddp_worker, args=(2, str(tmp_path / "init"), str(tmp_path / "ddp")), nprocs=2, join=True)
    torch.set_num_threads(1)
    try:
        one = train_run(RunConfig(**TINY), data, tmp_path / "one")
    finally:
        torch.set_num_threads(2)
    two = json.loads((tmp_path / "ddp" / "summary.json").read_text())
    a = [m["loss"] for m in _losses(tmp_path / "one")]
    b = [m["loss"] for m in _losses(tmp_path / "ddp")]
    assert len(a) == len(b) == TINY["steps"]
    torch.testing.assert_close(torch.tensor(b), torch.tensor(a), atol=1e-5, rtol=1e-5)
    assert abs(two["final_val_loss"] - one["final_val_loss"]) < 1e-4


@pytest.mark.parametrize("placement", ["hc", "mhc", "mhc_lite", "lns", "denseformer", "hybrid", "ngpt"])
def test_frontier_placements_train_in_the_study_runner(data, tmp_path, placement):
    s = train_run(RunConfig(**{**TINY, "steps": 12, "eval_every": 6}, placement=placement, lr=3e-3), data, tmp_path)
    assert s["final_val_loss"] < 5.6  # below a uniform guess over 256 bytes (5.55) after 12 steps
    if placement == "ngpt":  # normalize_ ran after every step: the final weights are on the sphere
        from addnorm.experiments.study.runner import build_model

        m = build_model(RunConfig(**TINY, placement="ngpt"))
        m.load_state_dict(torch.load(tmp_path / "checkpoint.pt", weights_only=True)["model"])
        torch.testing.assert_close(m.wte.weight.norm(dim=1), torch.ones(256))
        torch.testing.assert_close(m.h[0].attn.c_proj.weight.norm(dim=0), torch.ones(32))


def test_a_single_hard_batch_is_not_a_spike_in_a_run_trained_until_flat():
    """Near the loss floor one hard batch is 1.5x the mean (long's post and sandwich seed-0 runs, step 7555); a run
    trained until its curve flattens is stopped only when the jump persists. Fixed-length runs keep the one-step rule."""
    from addnorm.experiments.study.runner import SPIKE_PERSIST, _failure

    flat = [1.15] * 30
    one_batch = flat + [1.88]
    assert _failure(one_batch) == "spike"
    assert _failure(one_batch, SPIKE_PERSIST) is None
    assert _failure(one_batch + [1.15] * 4, SPIKE_PERSIST) is None
    diverged = flat + [1.88] * SPIKE_PERSIST
    assert _failure(diverged, SPIKE_PERSIST) == "spike"
    assert _failure(flat + [1.88] * (SPIKE_PERSIST - 1), SPIKE_PERSIST) is None
    assert _failure(flat + [float("nan")], SPIKE_PERSIST) == "nan"


def test_run_names_tell_apart_settings_beyond_six_digits():
    """Names took lr and clip to 6 significant digits: lr 0.001 and 0.0010000001 shared a directory, a summary
    row and a curve. Settings that 6 digits give back keep the names runs have always had."""
    a, b = RunConfig(**TINY, lr=0.001), RunConfig(**TINY, lr=0.0010000001)
    assert a.name() != b.name()
    assert "-lr0.001-" in a.name() and "-lr0.0010000001-" in b.name()
    assert "-c1-" in RunConfig(**TINY, lr=3e-4, clip=1.0).name() and "-lr0.0003-" in RunConfig(**TINY, lr=3e-4).name()


def test_a_smoke_run_is_too_short_to_judge_not_failed_and_each_run_is_a_log_line(tmp_path, capsys):
    """--steps 12: every run, pre-norm included, ended on the unigram plateau and was reported failed '(plateau)'.
    On a budget under JUDGED_FROM steps that says nothing about the setting: marked too short to judge, with the
    budget, and not counted as failed. With stdout not a terminal (a log), each finished run is a line as it ends."""
    from addnorm.experiments.study.verdict import JUDGED_FROM, too_short

    assert too_short("plateau", JUDGED_FROM - 1) and not too_short("plateau", JUDGED_FROM)
    assert not too_short("spike", 12) and not too_short(None, 12)  # a divergence is judged at any budget
    grid = ["--preset", "quick", "--placements", "post,pre", "--steps", "12", "--warmups", "0", "--seeds", "0"]
    assert main(["study", *grid, "--out", str(tmp_path)]) == 0
    out = " ".join(capsys.readouterr().out.split())
    rows = json.loads((tmp_path / "summary.json").read_text())["runs"]
    assert [(r["placement"], r["failed"], r["too_short"]) for r in rows] == [("post", False, True), ("pre", False, True)]
    md = (tmp_path / "summary.md").read_text()
    assert "| 0 / 1; 1 too short to judge (12 steps) |" in md and "(plateau)" not in md
    assert f"Give --steps {JUDGED_FROM} or more to judge them" in md
    assert "1 too short to judge (12 steps)" in (tmp_path / "index.html").read_text()  # the report says it too
    assert "run 1/2 post-layer-L6" in out and "run 2/2 pre-layer-L6" in out
    assert out.count("too short to judge (on the unigram plateau") == 2 and "(plateau)" not in out


def test_the_summary_is_a_table_that_fits_the_terminal():
    """The summary was summary.md's raw Markdown, hard-wrapped at 80 columns: a rich table now, every cell
    folded rather than cut, as wide as the console (the frontier study: 14 settings, the widest committed)."""
    from rich.console import Console

    from addnorm.cli.study_summary import summary_table

    root = Path(__file__).resolve().parents[2]
    study = json.loads((root / "benchmarks/results/study/frontier/summary.json").read_text())
    for width in (80, 120):
        console = Console(width=width, record=True)
        console.print(summary_table(study))
        text = console.export_text()
        assert max(len(line) for line in text.splitlines()) <= width and "…" not in text
        assert sum(line.count("/ 5") for line in text.splitlines()) == len(study["groups"])  # a row per setting


def test_a_grid_refuses_a_base_setting_its_default_axis_would_replace():
    # the tour's grid once set 12 layers in its base and trained at the depths axis' default, 6
    with pytest.raises(ValueError, match=r"base.depth=12 would be replaced by the default depths=\(6,\)"):
        StudyGrid(base=RunConfig(depth=12))
    assert {r.depth for r in StudyGrid(depths=(12,), base=RunConfig(depth=12)).runs()} == {12}
    assert {r.depth for r in StudyGrid(depths=(48,), base=RunConfig(depth=24)).runs()} == {48}  # given: on purpose
