"""`addnorm gradflow`: real runs on the default corpus, files written, results reused."""

import json

import pytest
import torch

from addnorm.cli.main import main
from addnorm.experiments.corpus import load_corpus
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


def test_cli(tmp_path, capsys):
    assert main(["gradflow", "--placements", "pre,post", "--depth", "4", "--d-model", "16", "--heads", "2",
                 "--seq-len", "16", "--batch", "2", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "Gradient flow at initialisation: depth 4" in out
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert [p["placement"] for p in summary["placements"]] == ["pre", "post"]
