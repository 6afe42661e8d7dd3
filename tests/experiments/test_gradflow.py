"""`addnorm gradflow`: real runs on the default corpus, files written, results reused."""

import json

import pytest
import torch

from addnorm.cli.main import main
from addnorm.harness.corpus import load_corpus
from addnorm.experiments.gradflow import GradflowConfig, run_gradflow


def test_default_corpus_is_deterministic_and_local():
    a, b = load_corpus(), load_corpus()
    assert torch.equal(a.data, b.data) and len(a.data) > 100_000 and "standard library" in a.source
    g1, g2 = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    x1, y1 = a.batch(4, 32, g1)
    x2, _ = a.batch(4, 32, g2)
    assert torch.equal(x1, x2) and torch.equal(x1[:, 1:], y1[:, :-1])


def test_user_data(tmp_path):
    (tmp_path / "a.txt").write_text("hello residual world " * 200)
    c = load_corpus(tmp_path)
    assert c.files == 1 and bytes(c.data[:5].tolist()) == b"hello"
    with pytest.raises(FileNotFoundError, match="no such file"):
        load_corpus(tmp_path / "missing")


def test_gradflow_runs_writes_and_reuses(tmp_path):
    cfg = GradflowConfig(placements=("no_residual", "pre"), depth=6, d_model=16, n_head=2, seq_len=16, batch=2, steps=2)
    s1 = run_gradflow(cfg, tmp_path)
    assert s1["reused"] == []
    for f in ("summary.json", "summary.md", "grad_norm_vs_depth.png", "stream_rms_vs_depth.png",
              "norm_output_stats.png", "grad_norm_over_steps_pre.png", "stream_rms_over_steps_pre.png"):
        assert (tmp_path / f).stat().st_size > 0
    s2 = run_gradflow(cfg, tmp_path)
    assert s2["reused"] == ["no_residual", "pre"]
    assert s1["placements"] == [dict(p, seconds=q["seconds"]) for p, q in zip(s2["placements"], s1["placements"])]
    with pytest.raises(ValueError, match="unknown placement"):
        GradflowConfig(placements=("prenorm",))
    # a rerun with fewer placements and no steps: the earlier run's figures go, a user's own file stays
    (tmp_path / "mine.png").write_bytes(b"x")
    run_gradflow(GradflowConfig(placements=("pre",), depth=6, d_model=16, n_head=2, seq_len=16, batch=2, steps=0),
                 tmp_path)
    assert not list(tmp_path.glob("*_over_steps_*.png")) and (tmp_path / "mine.png").exists()


def test_cli(tmp_path, capsys):
    assert main(["gradflow", "--placements", "pre,post,pre", "--depth", "4", "--d-model", "16", "--heads", "2",
                 "--seq-len", "16", "--batch", "2", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "Gradient flow at initialisation: depth 4" in out
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert [p["placement"] for p in summary["placements"]] == ["pre", "post"]  # a name given twice runs once


SMALL = ["--placements", "pre", "--depth", "3", "--d-model", "16", "--heads", "2", "--seq-len", "16", "--batch", "2"]


@pytest.mark.parametrize("args, message", [
    (["--seq-len", "0"], "--seq-len must be an integer >= 1, got 0"),
    (["--seq-len", "100000"], "--seq-len must be at most the model's context, 1024 positions (GPTConfig.block_size, "
                              "GPT-2's), got 100000"),  # it sat at 0/1 until killed
    (["--steps", "-1"], "--steps must be an integer >= 0, got -1"),
    (["--heads", "0"], "--heads must be an integer >= 1, got 0"),
    (["--d-model", "0"], "--d-model must be an integer >= 1, got 0"),
    (["--batch", "0"], "--batch must be an integer >= 1, got 0"),
    (["--depth", "0"], "--depth must be an integer >= 1, got 0"),
    (["--d-model", "10", "--heads", "3"], "--d-model 10 must be divisible by the number of heads (3)"),
    (["--placements", "prenorm"], "--placements unknown placement(s) ['prenorm']"),
    (["--lr", "nan"], "--lr must be a finite number > 0"),
    (["--n-streams", "0"], "--n-streams must be an integer >= 1, got 0"),
    (["--data", "/nonexistent/corpus"], "--data: --data /nonexistent/corpus: no such file or directory"),
    (["--out", "/proc/addnorm-cannot-write"], "--out: /proc/addnorm-cannot-write is not a writable directory"),
])
def test_every_argument_is_validated_before_any_work(args, message, tmp_path, capsys):
    out = ["--out", str(tmp_path / "o")] if "--out" not in args else []
    assert main(["gradflow", *SMALL, *out, *args]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) <= 2
    assert not (tmp_path / "o" / "runs").exists()


def test_tour_refuses_a_depth_it_cannot_report_before_working(capsys, tmp_path):
    assert main(["tour", "--depth", "1", "--out", str(tmp_path)]) == 2
    assert "--depth must be >= 2" in capsys.readouterr().err


def _cfg():
    return GradflowConfig(placements=("pre",), depth=3, d_model=16, n_head=2, seq_len=16, batch=2)


def test_changed_data_is_not_served_from_the_cache(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "a.txt").write_text("the residual stream carries everything " * 100)
    cfg = GradflowConfig(**{**_cfg().__dict__, "data": str(data)})
    run_gradflow(cfg, tmp_path / "out")
    assert run_gradflow(cfg, tmp_path / "out")["reused"] == ["pre"]
    (data / "a.txt").write_text("a different text entirely, so a different result " * 100)
    assert run_gradflow(cfg, tmp_path / "out")["reused"] == []


def test_a_truncated_run_file_is_named_and_redone(tmp_path):
    s1 = run_gradflow(_cfg(), tmp_path)
    f = tmp_path / "runs" / s1["run_files"]["pre"]
    f.write_text(f.read_text()[:100])  # cut short, as a crash mid-write without atomic writes would
    s2 = run_gradflow(_cfg(), tmp_path)
    assert s2["reused"] == [] and str(f) in s2["redone"][0]
    assert s2["placements"][0]["loss_init"] == s1["placements"][0]["loss_init"]
    assert run_gradflow(_cfg(), tmp_path)["reused"] == ["pre"]


def test_frontier_placements_in_gradflow(tmp_path):
    """Every new form runs in gradflow; widened streams add per-stream RMS and the composite mixing gain,
    and nGPT trains with its weights put back on the sphere after each step."""
    from addnorm.experiments.gradflow import run_placement

    cfg = GradflowConfig(placements=("hc", "mhc", "mhc_lite", "lns", "denseformer", "hybrid", "ngpt"), depth=3,
                         d_model=16, n_head=2, seq_len=16, batch=2, steps=2, n_streams=3, value_residual=True,
                         lr=1e-2)
    corpus = load_corpus(None)
    for p in cfg.placements:
        r = run_placement(cfg, p, corpus)
        assert len(r.profile("grad_norm")) == 3 and all(torch.isfinite(torch.tensor(r.losses)))
        quantities = {x["quantity"] for x in r.records}
        if p in ("hc", "mhc", "mhc_lite"):
            assert {"stream0_rms", "stream2_rms", "composite_gain_fwd", "composite_gain_bwd"} <= quantities
            assert "stream3_rms" not in quantities
        else:
            assert "composite_gain_fwd" not in quantities
