"""The claims file: recomputed from the committed runs it must equal the committed claims.json (so it is never
edited by hand), and each kind of claim is measured as its definition says, on runs made up for the test."""

import json
from pathlib import Path

import pytest

from addnorm.experiments.study import claims as C
from addnorm.harness.statistics import HIGHER, INCONCLUSIVE, LOWER, SAME

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results" / "study"
KEYS = {"id", "source", "statement", "preset", "arm", "baseline", "n_seeds", "tokens", "tokens_per_param", "epochs",
        "val_bytes", "effect", "ci", "p", "p_holm", "verdict", "mde", "published", "command"}


@pytest.fixture(scope="module")
def committed():
    return json.loads((RESULTS / "claims.json").read_text(encoding="utf-8"))


def test_the_committed_claims_file_is_what_the_committed_runs_give():
    fresh = C.to_json(C.build(results=RESULTS))
    committed = (RESULTS / "claims.json").read_text(encoding="utf-8")
    assert fresh == committed, "claims.json differs from the committed runs: run python benchmarks/study_claims.py"


def test_every_record_has_the_keys_and_a_lawful_verdict(committed):
    records = committed["claims"]
    assert len({r["id"] for r in records}) == len(records) == len(C.SPECS)
    for r in records:
        assert KEYS <= set(r), r["id"]
        assert r["verdict"] in ("supported", "contradicted", "inconclusive")
        if r["verdict"] != INCONCLUSIVE:  # decided only below alpha after Holm, in the claim's direction or against
            assert r["p_holm"] < 0.05
            sign = r["effect"] < 0 if r["direction"] == LOWER else r["effect"] > 0
            assert (r["verdict"] == "supported") == (sign and r["direction"] != SAME)
        if r["p"] is not None:
            assert r["p"] <= r["p_holm"] <= 1 and r["p"] >= r["min_p"] - 1e-12
            assert r["ci"][0] <= r["effect"] <= r["ci"][1]
        assert " /" not in r["command"] and r["command"].startswith("addnorm study ")
    assert committed["holm_family"] == sum(r["p"] is not None for r in records)


def test_the_seeds_claims_name_their_seed_document_and_carry_no_published_number(committed):
    seeds = [r for r in committed["claims"] if r["source"].endswith(".txt")]
    assert {r["id"] for r in seeds} == {"post_unstable", "post_warmup", "pre_warmup", "post_tuned", "no_residual",
                                        "batchnorm", "batchnorm_mode_gap", "batchnorm_leak", "rmsnorm"}
    assert all(r["published"] is None for r in seeds)


def test_the_warmup_claim_is_decided_on_post_ln_without_against_with_warmup(committed):
    r = {c["id"]: c for c in committed["claims"]}["post_warmup"]
    assert (r["arm"]["placement"], r["arm"]["warmup"]) == ("post", 0)
    assert (r["baseline"]["placement"], r["baseline"]["warmup"]) == ("post", 100)
    assert r["n_seeds"] == 6  # 3 seeds x 2 learning rates, paired by both


def test_the_frontier_baseline_is_gpt2_init_pre_ln_at_its_best_learning_rate(committed):
    for r in committed["claims"]:
        if r["preset"] == "frontier":
            assert (r["baseline"]["placement"], r["baseline"]["norm"], r["baseline"]["init"]) == ("pre", "layer", "gpt2")
            assert r["baseline"]["lr"] in r["baseline"]["lr_grid"] and r["n_seeds"] == 5


def test_a_claim_without_runs_keeps_its_record_and_says_so():
    spec = next(s for s in C.SPECS if s.id == "dyt_embedding_scale")
    rows = [_run("pre", s, 2.5) for s in range(5)]  # no run with an embedding scale
    r = C.measure(spec, rows)
    assert (r["effect"], r["p"], r["n_seeds"]) == (None, None, 0)
    assert r["notes"][0] == "not measured: dyt/ holds 0 runs of the arm and 5 of the baseline"


# ---- the measurement, on made-up runs -------------------------------------------------------------------------

def _run(placement, seed, loss, lr=1e-3, failed=False, gap=0.01, **kw):
    return {"name": f"{placement}-{lr}-{seed}", "placement": placement, "norm": "layer", "init": "xavier",
            "depth": 6, "d_model": 64, "lr": lr, "warmup": 100, "seed": seed, "steps": 100, "batch": 16,
            "seq_len": 64, "eval_batches": 4, "value_residual": False, "dyt_alpha": "0.5", "n_params": 1000,
            "final_val_loss": loss, "generalization_gap": gap, "failed": failed, "seconds": None, **kw}


def _spec(**kw):
    base = dict(id="x", source="0000.00000", statement="s", preset="study", measure=C.LOSS, direction=LOWER,
                arm=(("placement", "lns"),), baseline=(("placement", "pre"),))
    return C.Spec(**{**base, **kw})


def test_a_loss_claim_pairs_by_seed_and_tests_the_differences():
    # differences lns - pre by seed: -0.1, -0.2, -0.3, -0.4, -0.5 (mean -0.3); all negative -> p = 2/32
    rows = [_run("pre", s, 3.0 + s) for s in range(5)] + [_run("lns", s, 3.0 + s - 0.1 * (s + 1)) for s in range(5)]
    r = C.measure(_spec(), rows)
    assert r["n_seeds"] == 5 and r["effect"] == pytest.approx(-0.3) and r["p"] == 2 / 32 and r["min_p"] == 2 / 32
    # s of the differences = sqrt(0.025) = 0.15811; half = 2.7764 * 0.15811 / sqrt(5) = 0.19632
    assert r["ci"] == pytest.approx([-0.3 - 0.19632, -0.3 + 0.19632], abs=1e-5)
    assert (r["tokens"], r["val_bytes"], r["tokens_per_param"]) == (100 * 16 * 64, 4096, 102.4)
    assert r["epochs"] == pytest.approx(102400 / 4194304, abs=1e-4)
    # each side's mean over the paired runs: pre 3 + (0+1+2+3+4)/5 = 5, lns 5 - 0.3
    assert (r["arm"]["mean"], r["baseline"]["mean"]) == (pytest.approx(4.7), pytest.approx(5.0))


def test_a_batchnorm_gap_claim_says_when_the_leak_was_not_recorded():
    rows = [_run("pre", s, 2.5, gap=0.01, future_leak=0.0) for s in range(3)]
    rows += [_run("pre", s, 2.6, gap=0.05, future_leak=None) | {"norm": "batch"} for s in range(3)]
    spec = _spec(measure=C.GAP, direction=HIGHER, arm=(("norm", "batch"),), baseline=(("norm", "layer"),),
                 remarks=("a remark",))
    r = C.measure(spec, rows)
    assert r["effect"] == pytest.approx(0.04) and r["p"] == 0.25
    assert any(n.startswith("future_leak and train_mode_val_loss were not recorded") for n in r["notes"])
    assert r["notes"][-2] == "a remark"  # the spec's remarks ride along


def test_the_batchnorm_claims_read_the_leak_and_the_evaluation_minus_training_mode_loss(tmp_path):
    """The seed's 'BatchNorm generalizes poorly', judged on the gap, on the train/evaluation-mode difference and
    on the future leak, from the rows of a results directory (LayerNorm's leak and mode difference: 0)."""
    rows = [_run("pre", s, 2.5, gap=0.01, future_leak=0.0, train_mode_val_loss=2.5) for s in range(3)]
    rows += [_run("pre", s, 2.8, gap=0.02, future_leak=10.0 + s, train_mode_val_loss=2.6) | {"norm": "batch"}
             for s in range(3)]
    (tmp_path / "study_norms").mkdir()
    (tmp_path / "study_norms" / "summary.json").write_text(json.dumps({"runs": rows}))
    loaded = C.load_rows(tmp_path, "study_norms")
    assert [r[C.MODE_GAP] for r in loaded] == pytest.approx([0.0] * 3 + [0.2] * 3)
    specs = {s.id: s for s in C.SPECS}
    gap = C.measure(specs["batchnorm"], loaded)
    assert gap["effect"] == pytest.approx(0.01)
    assert any(n.startswith("BatchNorm's mean future leak 11 and evaluation-minus-training-mode validation loss "
                            "+0.2 against 0 and +0") for n in gap["notes"])
    mode = C.measure(specs["batchnorm_mode_gap"], loaded)
    leak = C.measure(specs["batchnorm_leak"], loaded)
    assert mode["effect"] == pytest.approx(0.2) and leak["effect"] == pytest.approx(11.0)
    assert mode["n_seeds"] == leak["n_seeds"] == 3


def test_the_dyt_cause_compares_each_scale_with_none_and_with_layernorm():
    rows = []
    for s in range(5):
        for lr in (1e-3, 3e-3):
            rows.append(_run("pre", s, 2.6, lr=lr, embed_scale=None))
            for a in ("0.5", "0.8/0.2/0.2", "8"):
                rows.append(_run("pre", s, 3.24, lr=lr, failed=a != "8", dyt_alpha=a, embed_scale=None)
                            | {"norm": "dyt"})
            for a in ("0.5", "0.8/0.2/0.2"):
                rows.append(_run("pre", s, 2.6 + 0.01 * s, lr=lr, dyt_alpha=a, embed_scale=8.0) | {"norm": "dyt"})
    specs = {s.id: s for s in C.SPECS}
    cause = C.measure(specs["dyt_cause_sqrt_d"], rows)
    assert (cause["arm"]["mean"], cause["baseline"]["mean"]) == (0.0, 1.0)  # alpha 8 (no scale) left out
    assert cause["arm"]["runs"] == cause["baseline"]["runs"] == 20 and cause["arm"]["embed_scale"] == 8.0
    assert cause["baseline"]["embed_scale"] is None and cause["p"] < 1e-9
    same = C.measure(specs["dyt_embedding_scale"], rows)
    assert same["n_seeds"] == 5 and same["effect"] == pytest.approx(0.02) and same["arm"]["dyt_alpha"] == "0.8/0.2/0.2"
    assert "embed_scale" not in C.measure(specs["batchnorm"], rows + [dict(rows[0], norm="batch")])["baseline"]


def test_a_tuned_claim_takes_each_side_at_its_own_best_learning_rate():
    rows = ([_run("pre", s, 3.0, lr=1e-3) for s in range(3)] + [_run("pre", s, 2.9, lr=3e-3) for s in range(3)]
            + [_run("lns", s, 2.5, lr=1e-3) for s in range(3)] + [_run("lns", s, 2.8, lr=3e-3) for s in range(3)])
    r = C.measure(_spec(tune=("lr",)), rows)
    assert (r["arm"]["lr"], r["baseline"]["lr"]) == (1e-3, 3e-3)
    assert r["effect"] == pytest.approx(2.5 - 2.9) and r["arm"]["lr_at_grid_edge"]
    assert any("at the edge of the grid" in n for n in r["notes"])


def test_a_failure_claim_uses_fisher_on_the_rates():
    rows = [_run("pre", s, 2.5) for s in range(3)] + [_run("lns", s, 3.1, failed=True) for s in range(3)]
    r = C.measure(_spec(measure=C.FAILURE, direction=HIGHER), rows)
    assert r["effect"] == 1.0 and r["p"] == pytest.approx(0.1) and r["mde"] is None
    assert (r["arm"]["mean"], r["baseline"]["mean"]) == (1.0, 0.0)  # the failure rates
    assert r["ci"] == pytest.approx([0.20593, 1.0], abs=1e-5)
    assert any("cannot reach p < 0.05" in n for n in r["notes"])


def test_holm_runs_over_the_whole_file_and_decides_the_verdict(tmp_path):
    # two claims in one made-up results directory: 11 of 12 failed against 0 of 12 (Fisher p = 9.6e-6) and a
    # loss claim at p = 2/32; Holm: min(1, 2 x 9.6e-6) and max(that, 1 x 0.0625)
    rows = ([_run("pre", s, 2.5) for s in range(12)] + [_run("post", s, 3.1, failed=s > 0) for s in range(12)]
            + [_run("lns", s, 2.4 - 0.01 * s) for s in range(12)])
    (tmp_path / "study").mkdir()
    (tmp_path / "study" / "summary.json").write_text(json.dumps({"runs": rows}))
    specs = (_spec(id="fails", measure=C.FAILURE, direction=HIGHER, arm=(("placement", "post"),)),
             _spec(id="loss", arm=(("placement", "lns"),)))
    out = {c.id: c for c in C.build(specs, tmp_path)}
    assert out["fails"].p == pytest.approx(9.61482991366e-06) and out["fails"].p_holm == pytest.approx(2 * out["fails"].p)
    assert out["fails"].verdict == "supported"
    assert out["loss"].p == pytest.approx(2 / 4096) and out["loss"].p_holm == pytest.approx(2 / 4096)
    assert out["loss"].verdict == "supported"  # 12 seeds, every lns run below its pre-LN pair


def test_a_missing_results_directory_gives_an_inconclusive_record(tmp_path):
    (c,) = C.build((_spec(preset="wide"),), tmp_path)
    assert (c.verdict, c.p, c.p_holm, c.n_seeds) == (INCONCLUSIVE, None, None, 0)
    assert c.notes == ["not measured: benchmarks/results/study/wide/ is not committed"]


@pytest.mark.parametrize("bad, message", [
    (dict(preset="nowhere"), "preset must be one of"), (dict(measure="loss"), "measure must be one of"),
    (dict(direction="down"), "direction must be one of"),
    (dict(measure=C.FAILURE, tune=("lr",)), "a failure rate pools every run"),
])
def test_a_claim_spec_refuses_what_it_cannot_measure(bad, message):
    with pytest.raises(ValueError, match=f"claim 'x': {message}"):
        _spec(**bad)


def test_rows_come_from_the_run_directories_where_they_are_committed(tmp_path):
    d = tmp_path / "frontier"
    (d / "runs" / "a").mkdir(parents=True)
    cfg = {"placement": ["pre", "post"], "norm": "layer", "init": "gpt2", "depth": 2, "d_model": 64, "lr": 1e-3,
           "warmup": 10, "seed": 4, "steps": 50, "batch": 8, "seq_len": 32, "eval_batches": 2,
           "value_residual": False, "dyt_alpha": [0.8, 0.2, 0.2]}
    (d / "runs" / "a" / "config.json").write_text(json.dumps({"config": cfg}))
    (d / "runs" / "a" / "summary.json").write_text(json.dumps(
        {"name": "a", "final_val_loss": 2.0, "failed": False, "n_params": 10, "seconds_this_session": 3.5}))
    (d / "summary.json").write_text(json.dumps({"runs": [], "mixing": [
        {"placement": "pre+post", "depth": 2, "seed": 4, "lr": 1e-3, "series": [[10, 1.5, 2.0], [20, 3.0, 1.0]]}]}))
    (row,) = C.load_rows(tmp_path, "frontier")
    assert (row["placement"], row["dyt_alpha"], row["seed"], row["seconds"]) == ("pre+post", "0.8/0.2/0.2", 4, 3.5)
    assert (row[C.GAIN_FWD], row[C.GAIN_BWD]) == (3.0, 2.0)  # the peaks over training, not the last evaluation
    assert C.load_rows(tmp_path, "absent") is None


def test_the_command_line_writes_the_file(tmp_path, capsys):
    (tmp_path / "study").mkdir()
    rows = [_run("pre", s, 2.5) for s in range(3)] + [_run("post", s, 2.6) for s in range(3)]
    (tmp_path / "study" / "summary.json").write_text(json.dumps({"runs": rows}))
    out = tmp_path / "claims.json"
    assert C.main(["--results", str(tmp_path), "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    assert len(data["claims"]) == len(C.SPECS) and "claims (" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        C.main(["--results", str(tmp_path / "missing")])
