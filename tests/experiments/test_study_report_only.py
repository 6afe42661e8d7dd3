"""`addnorm study --report-only`: the tables, figures and page again from a results directory, training nothing --
from the run directories, or from summary.json alone (a committed results directory keeps no runs/)."""

import json
import shutil

from addnorm.cli.main import main

GRID = ["--preset", "quick", "--steps", "12", "--warmups", "0", "--seeds", "0,1"]


def test_report_only_regenerates_the_page_without_training(tmp_path, capsys):
    trained = tmp_path / "trained"
    assert main(["study", *GRID, "--out", str(trained)]) == 0
    first = json.loads((trained / "summary.json").read_text())
    assert first["curves"] and first["grad_profiles"] and all(r["tokens_seen"] == 12 * 16 * 64 for r in first["runs"])

    committed = tmp_path / "committed"  # what a results directory under benchmarks/ holds: no runs/
    (committed / "figures").mkdir(parents=True)
    shutil.copy(trained / "summary.json", committed / "summary.json")
    (committed / "figures" / "a_figure_an_older_version_drew.png").write_bytes(b"stale")
    capsys.readouterr()
    assert main(["study", *GRID, "--out", str(committed), "--report-only"]) == 0
    assert "runs" not in {p.name for p in committed.iterdir()}  # nothing trained
    again = json.loads((committed / "summary.json").read_text())
    for key in ("runs", "groups", "pairwise", "curves", "grad_profiles", "figures"):
        assert again[key] == first[key], key
    assert sorted(p.name for p in (committed / "figures").iterdir()) == sorted(first["figures"])  # the stale one gone
    assert (committed / "summary.md").read_text() == (trained / "summary.md").read_text()
    assert (committed / "index.html").stat().st_size > 0
    assert "results in" in capsys.readouterr().out

    # from the run directories (summary.json gone): the same rows
    (trained / "summary.json").unlink()
    assert main(["study", *GRID, "--out", str(trained), "--report-only"]) == 0
    assert json.loads((trained / "summary.json").read_text())["groups"] == first["groups"]


def test_report_only_says_when_there_is_nothing_to_report(tmp_path, capsys):
    assert main(["study", *GRID, "--out", str(tmp_path / "empty"), "--report-only"]) == 2
    err = capsys.readouterr().err
    assert "--report-only:" in err and "neither summary.json nor runs/" in err and "Traceback" not in err


def test_the_mixing_figure_is_drawn_and_kept_for_report_only(tmp_path):
    """The mHC claim's figure: a grid with widened streams writes figures/composite_gain.png and keeps the gains
    (with their series) in summary.json, so a committed directory redraws it."""
    grid = ["--preset", "quick", "--placements", "hc,mhc", "--depths", "2", "--steps", "12", "--warmups", "0",
            "--seeds", "0"]
    trained = tmp_path / "trained"
    assert main(["study", *grid, "--out", str(trained)]) == 0
    first = json.loads((trained / "summary.json").read_text())
    assert "composite_gain.png" in first["figures"] and (trained / "figures" / "composite_gain.png").exists()
    assert {m["placement"] for m in first["mixing"]} == {"hc", "mhc"} and all(m["series"] for m in first["mixing"])
    committed = tmp_path / "committed"
    committed.mkdir()
    shutil.copy(trained / "summary.json", committed / "summary.json")
    assert main(["study", *grid, "--out", str(committed), "--report-only"]) == 0
    again = json.loads((committed / "summary.json").read_text())
    assert again["mixing"] == first["mixing"] and (committed / "figures" / "composite_gain.png").exists()
    assert "figures/composite_gain.png" in (committed / "index.html").read_text()  # the page shows it too


def _committed_copy(trained, tmp_path, name="committed"):
    committed = tmp_path / name
    committed.mkdir()
    shutil.copy(trained / "summary.json", committed / "summary.json")
    return committed


def test_report_only_on_a_committed_directory_keeps_every_run_whatever_the_preset(tmp_path, capsys):
    """A committed results directory has no runs/: summary.json is the only copy of its results. --report-only
    without the matching --preset (here: the default preset, which names none of these runs) must regenerate from
    the runs summary.json records, never rewrite it with fewer."""
    trained = tmp_path / "trained"
    assert main(["study", *GRID, "--out", str(trained)]) == 0
    first = json.loads((trained / "summary.json").read_text())
    committed = _committed_copy(trained, tmp_path)
    capsys.readouterr()
    for wrong in ([], ["--preset", "paper"], ["--preset", "quick", "--seeds", "0"]):
        assert main(["study", *wrong, "--out", str(committed), "--report-only"]) == 0, wrong
        again = json.loads((committed / "summary.json").read_text())
        assert len(again["runs"]) == len(first["runs"]) == 4 and again["missing"] == [], wrong
        for key in ("runs", "groups", "pairwise", "curves", "grad_profiles", "grid"):
            assert again[key] == first[key], (wrong, key)
        assert (committed / "summary.md").read_text() == (trained / "summary.md").read_text()
    assert "runs from" in capsys.readouterr().out


def test_report_only_refuses_a_grid_that_would_drop_recorded_runs(tmp_path, capsys):
    trained = tmp_path / "trained"
    assert main(["study", *GRID, "--out", str(trained)]) == 0
    before = (trained / "summary.json").read_text()
    capsys.readouterr()
    assert main(["study", "--preset", "quick", "--steps", "12", "--warmups", "0", "--seeds", "0", "--out",
                 str(trained), "--report-only"]) == 2
    err = capsys.readouterr().err
    assert "--preset" in err and "drop 2" in err and "Traceback" not in err
    assert (trained / "summary.json").read_text() == before  # untouched


def test_the_rows_keep_what_a_run_measured_beyond_its_loss(tmp_path):
    """Saturation and alpha per slot (the DyT audit), the flattening fields (the long preset) and BatchNorm's
    train-mode loss and future leak stay in summary.json/csv and survive --report-only from a committed copy."""
    grid = ["--preset", "quick", "--placements", "pre", "--norms", "dyt", "--depths", "2", "--steps", "12",
            "--warmups", "0", "--seeds", "0"]
    trained = tmp_path / "trained"
    assert main(["study", *grid, "--out", str(trained)]) == 0
    (row,) = json.loads((trained / "summary.json").read_text())["runs"]
    for key in ("flattened", "flatten_step", "stopped_flat", "train_mode_val_loss", "future_leak"):
        assert key in row, key
    assert set(row["saturation"]) == set(row["alpha"]) == {"attn", "mlp", "final"}
    assert row["dyt_alpha"] == "0.5" and all(0.0 <= v <= 1.0 for v in row["saturation"].values())
    header, line = (trained / "summary.csv").read_text().splitlines()[:2]
    cells = dict(zip(header.split(","), line.split(",")))
    assert float(cells["saturation_final"]) == row["saturation"]["final"] and cells["future_leak"] != ""
    committed = _committed_copy(trained, tmp_path)
    assert main(["study", "--out", str(committed), "--report-only"]) == 0
    assert json.loads((committed / "summary.json").read_text())["runs"] == [row]


def test_the_saturation_curves_and_their_figure_survive_report_only(tmp_path):
    """The DyT/Derf saturation of every evaluation (summary.json's ``saturation_curves``, one curve per DyT/Derf
    run) and its figure: drawn, kept by --report-only from summary.json alone, from runs/, and from the previous
    summary.json for a run whose directory is gone; a summary.json written before the key existed still loads."""
    from addnorm.experiments.study import RunConfig, StudyGrid, run_study
    from addnorm.experiments.study.data import load_split
    from addnorm.experiments.study.grid import report_only

    grid = StudyGrid(placements=("pre",), norms=("dyt", "layer"), depths=(2,), warmups=(0,),
                     base=RunConfig(depth=2, d_model=32, heads=2, seq_len=32, batch=4, steps=12, eval_every=4,
                                    eval_batches=2))
    trained = tmp_path / "trained"
    run_study(grid, load_split(max_bytes=1 << 20), trained)
    first = json.loads((trained / "summary.json").read_text())
    dyt = next(r["name"] for r in first["runs"] if r["norm"] == "dyt")
    assert list(first["saturation_curves"]) == [dyt]  # the LayerNorm run has none
    assert [step for step, _ in first["saturation_curves"][dyt]] == [4, 8, 12]
    assert first["saturation_curves"][dyt][-1][1] == next(r for r in first["runs"] if r["name"] == dyt)["saturation"]
    assert "saturation_over_training.png" in first["figures"]
    page = (trained / "index.html").read_text()
    assert 'src="figures/saturation_over_training.png"' in page and "Verma 2026" in page

    committed = _committed_copy(trained, tmp_path)
    assert main(["study", "--out", str(committed), "--report-only"]) == 0
    again = json.loads((committed / "summary.json").read_text())
    assert again["saturation_curves"] == first["saturation_curves"] and again["figures"] == first["figures"]
    assert (committed / "figures" / "saturation_over_training.png").exists()

    (trained / "summary.json").unlink()  # from the run directories alone
    assert report_only(grid, trained)["saturation_curves"] == first["saturation_curves"]
    for d in (trained / "runs").glob(f"{dyt}-*"):  # the DyT run's directory gone: its curve from summary.json
        shutil.rmtree(d)
    assert report_only(grid, trained)["saturation_curves"] == first["saturation_curves"]

    older = {k: v for k, v in first.items() if k != "saturation_curves"}  # written before the key existed
    (committed / "summary.json").write_text(json.dumps(older))
    assert main(["study", "--out", str(committed), "--report-only"]) == 0
    again = json.loads((committed / "summary.json").read_text())
    assert again["saturation_curves"] == {} and again["runs"] == first["runs"]
    assert "saturation_over_training.png" not in again["figures"]
    assert not (committed / "figures" / "saturation_over_training.png").exists()  # nothing to draw it from
