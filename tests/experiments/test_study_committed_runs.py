"""A study finished across machines: a results directory is committed with each run's summary.json and config.json
only (.gitignore drops the checkpoints and metrics), and a clone of it reuses those runs -- trains none of them
again, and reports them with their gradient profiles, mixing-gain series and saturation curves as first measured."""

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from addnorm.cli.main import main

ROOT = Path(__file__).resolve().parents[2]
GRID = ["--preset", "quick", "--placements", "pre,mhc", "--norms", "layer,dyt", "--depths", "2", "--steps", "12",
        "--warmups", "0", "--seeds", "0"]


def _as_committed(trained: Path, clone: Path) -> None:
    """What a clone of a committed results directory holds: the top-level files and, per run, the two kept."""
    clone.mkdir()
    for name in ("summary.json", "summary.md", "summary.csv"):
        shutil.copy(trained / name, clone / name)
    for run in (trained / "runs").iterdir():
        (clone / "runs" / run.name).mkdir(parents=True)
        for name in ("summary.json", "config.json"):
            shutil.copy(run / name, clone / "runs" / run.name / name)


def test_a_clone_with_only_the_committed_files_reuses_every_run_and_reports_it_whole(tmp_path, monkeypatch):
    trained = tmp_path / "trained"
    assert main(["study", *GRID, "--out", str(trained)]) == 0
    first = json.loads((trained / "summary.json").read_text())
    assert first["grad_profiles"] and first["saturation_curves"] and all(m["series"] for m in first["mixing"])
    for run in (trained / "runs").iterdir():  # the summary itself keeps what the report reads from the metrics
        s = json.loads((run / "summary.json").read_text())
        assert s["grad_profile"] and ("gain_curve" in s) == s["config"]["placement"].startswith("mhc")

    clone = tmp_path / "clone"
    _as_committed(trained, clone)
    import addnorm.experiments.study.runner as runner

    def no_training(*a, **k):
        raise AssertionError("a committed run was trained again")

    monkeypatch.setattr(runner.torch.optim, "AdamW", no_training)
    assert main(["study", *GRID, "--out", str(clone)]) == 0
    again = json.loads((clone / "summary.json").read_text())
    for key in ("runs", "groups", "pairwise", "curves", "grad_profiles", "saturation_curves", "mixing", "figures"):
        assert again[key] == first[key], key
    assert not list(clone.glob("runs/*/checkpoint.pt")) and not list(clone.glob("runs/*/metrics.jsonl"))

    assert main(["study", *GRID, "--out", str(clone), "--report-only"]) == 0  # from the run directories too
    again = json.loads((clone / "summary.json").read_text())
    for key in ("runs", "grad_profiles", "saturation_curves", "mixing"):
        assert again[key] == first[key], key


def test_a_run_finished_before_the_summary_kept_its_profile_gets_it_from_its_metrics(tmp_path):
    trained = tmp_path / "trained"
    assert main(["study", *GRID, "--out", str(trained)]) == 0
    first = json.loads((trained / "summary.json").read_text())
    for path in trained.glob("runs/*/summary.json"):  # as an older addnorm wrote them
        s = json.loads(path.read_text())
        del s["grad_profile"]
        s.pop("gain_curve", None)
        path.write_text(json.dumps(s))
    assert main(["study", *GRID, "--out", str(trained)]) == 0
    for path in trained.glob("runs/*/summary.json"):
        s = json.loads(path.read_text())
        assert s["grad_profile"] and ("gain_curve" in s) == s["config"]["placement"].startswith("mhc")
    again = json.loads((trained / "summary.json").read_text())
    assert again["grad_profiles"] == first["grad_profiles"] and again["mixing"] == first["mixing"]


def test_gitignore_keeps_each_runs_summary_and_config_and_drops_the_rest():
    if not (ROOT / ".git").exists() or shutil.which("git") is None:
        pytest.skip("not a git checkout: .gitignore is checked in one")
    run = "benchmarks/results/study/somepreset/runs/pre-layer-L2-lr0.003-w0-s0-c0-xavier-0123456789abcdef"
    paths = [f"{run}/{name}" for name in ("summary.json", "config.json", "checkpoint.pt", "metrics.jsonl",
                                          "tmpabc123")]
    out = subprocess.run(["git", "check-ignore", "--no-index", *paths], cwd=ROOT, capture_output=True, text=True)
    assert set(out.stdout.split()) == set(paths[2:])
