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
        "val_bytes", "effect", "ci", "p", "p_holm", "verdict", "mde", "published", "command", "results",
        "lr_bracketed", "judged"}


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
            assert r["p"] >= r["min_p"] - 1e-12 and r["ci"][0] <= r["effect"] <= r["ci"][1]
        if r["p_holm"] is not None:
            assert r["judged"] and r["p"] <= r["p_holm"] <= 1
        else:
            assert r["verdict"] == INCONCLUSIVE
        assert " /" not in r["command"] and r["command"].startswith(f"addnorm study --preset {r['preset']} ")
        assert f"--out benchmarks/results/study/{r['preset']} " in r["command"]
    assert committed["holm_family"] == sum(r["p_holm"] is not None for r in records)


def test_no_claim_measured_on_the_fixed_4_kib_batches_is_judged(committed):
    """The committed runs before the test split measured every final loss on four fixed batches (4,096 bytes):
    their records keep their numbers and say why they are not judged."""
    for r in committed["claims"]:
        if r["val_bytes"] is not None and r["val_bytes"] < C.MIN_VAL_BYTES and r["measure"] in (C.LOSS, C.GAP,
                                                                                                C.FAILURE):
            assert not r["judged"] and r["p_holm"] is None and r["verdict"] == INCONCLUSIVE
            assert f"not judged: val_bytes {r['val_bytes']:,} < 262,144" in r["notes"][0], r["id"]


def test_the_seeds_claims_name_their_seed_document_and_carry_no_published_number(committed):
    seeds = [r for r in committed["claims"] if r["source"].endswith(".txt")]
    assert {r["id"] for r in seeds} == {"post_unstable", "post_warmup", "pre_warmup", "post_tuned", "no_residual",
                                        "batchnorm", "batchnorm_mode_gap", "batchnorm_leak", "rmsnorm"}
    assert all(r["published"] is None for r in seeds)


def test_the_warmup_claim_is_decided_on_post_ln_without_against_with_warmup(committed):
    r = {c["id"]: c for c in committed["claims"]}["post_warmup"]
    assert (r["arm"]["placement"], r["arm"]["warmup"]) == ("post", 0)
    assert (r["baseline"]["placement"], r["baseline"]["warmup"]) == ("post", 100)
    # paired by learning rate and seed: every run of each side is in a pair
    assert r["n_seeds"] == r["arm"]["runs"] == r["baseline"]["runs"] == len(r["arm"]["lr"]) * 5


def test_the_frontier_baseline_is_gpt2_init_pre_ln_at_its_best_learning_rate(committed):
    for r in committed["claims"]:
        if r["results"] in ("frontier", "claims_frontier") and r["measure"] == C.LOSS:
            assert (r["baseline"]["placement"], r["baseline"]["norm"], r["baseline"]["init"]) == ("pre", "layer", "gpt2")
            # seeds 0-4, and 5-10 where the claim's confirmation runs (--confirm) were added
            assert r["baseline"]["lr"] in r["baseline"]["lr_grid"] and 5 <= r["n_seeds"] <= 11, r["id"]


def test_the_claims_presets_run_gpt2_init_five_seeds_and_a_grid_that_can_bracket():
    from addnorm.experiments.study.config import PRESETS

    for spec in C.SPECS:
        if spec.needs:
            continue
        assert spec.preset.startswith("claims_"), spec.id  # its runs come from a claims preset
        runs = PRESETS[spec.preset].runs()
        assert {r.init for r in runs} == {"gpt2"} and {r.seed for r in runs} >= set(range(5))
        arm = [r for r in runs if C.matches(C.setting_row(r.__dict__), spec.arm)]
        assert arm, spec.id
        if "lr" in spec.tune or spec.pair_by != ("seed",) or spec.measure == C.FAILURE:
            assert len({r.lr for r in arm}) >= 3, spec.id


def test_a_claim_without_runs_keeps_its_record_and_says_so():
    spec = next(s for s in C.SPECS if s.id == "dyt_embedding_scale")
    rows = [_run("pre", s, 2.5) for s in range(5)]  # no run with an embedding scale
    r = C.measure(spec, rows)
    assert (r["effect"], r["p"], r["n_seeds"]) == (None, None, 0)
    assert r["notes"][0] == "not measured: claims_dyt_cause/ holds 0 runs of the arm and 5 of the baseline"


# ---- the measurement, on made-up runs -------------------------------------------------------------------------

def _run(placement, seed, loss, lr=1e-3, failed=False, gap=0.01, dev=None, **kw):
    return {"name": f"{placement}-{lr}-{seed}", "placement": placement, "norm": "layer", "init": "xavier",
            "depth": 6, "d_model": 64, "lr": lr, "warmup": 100, "seed": seed, "steps": 100, "batch": 16,
            "seq_len": 64, "eval_batches": 4, "value_residual": False, "dyt_alpha": "0.5", "n_params": 1000,
            "final_val_loss": loss, "final_dev_loss": loss if dev is None else dev, "val_bytes": 262144,
            "data_digest": "d", "generalization_gap": gap, "failed": failed, "seconds": None, **kw}


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
    assert (r["tokens"], r["val_bytes"], r["tokens_per_param"]) == (100 * 16 * 64, 262144, 102.4)
    assert r["judged"] and r["lr_bracketed"] is None  # 5 seeds on 256 KiB: judged (p cannot reach 0.05, though)
    assert r["epochs"] == pytest.approx(102400 / 4194304, abs=1e-4)
    # each side's mean over the paired runs: pre 3 + (0+1+2+3+4)/5 = 5, lns 5 - 0.3
    assert (r["arm"]["mean"], r["baseline"]["mean"]) == (pytest.approx(4.7), pytest.approx(5.0))


def test_a_side_spanning_a_setting_its_pairing_does_not_name_is_refused_not_picked_from():
    # each side ran 3 learning rates: paired by seed alone, a seed has 3 runs a side; one of them was kept before
    rows = [_run(p, s, 3.0 + lr, lr=lr) for p in ("pre", "lns") for s in range(5) for lr in (1e-3, 3e-3, 1e-2)]
    with pytest.raises(ValueError, match=r"claim 'x': the arm has two runs at \{'seed': 0\}"):
        C.measure(_spec(), rows)
    r = C.measure(_spec(pair_by=("lr", "seed")), rows)
    assert r["n_seeds"] == 15


def test_the_batchnorm_mode_gap_and_leak_pair_over_the_learning_rate_grid():
    by_id = {s.id: s for s in C.SPECS}
    assert by_id["batchnorm_mode_gap"].pair_by == by_id["batchnorm_leak"].pair_by == ("lr", "seed")


def test_a_batchnorm_gap_claim_says_when_the_leak_was_not_recorded():
    rows = [_run("pre", s, 2.5, gap=0.01, future_leak=0.0) for s in range(3)]
    rows += [_run("pre", s, 2.6, gap=0.05, future_leak=None) | {"norm": "batch"} for s in range(3)]
    spec = _spec(measure=C.GAP, direction=HIGHER, arm=(("norm", "batch"),), baseline=(("norm", "layer"),),
                 remarks=("a remark",))
    r = C.measure(spec, rows)
    assert r["effect"] == pytest.approx(0.04) and r["p"] == 0.25
    assert any(n.startswith("future_leak and train_mode_val_loss were not recorded") for n in r["notes"])
    assert r["notes"][-1] == "a remark"  # the spec's remarks ride along


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
    assert r["effect"] == pytest.approx(2.5 - 2.9) and r["lr_bracketed"] is False
    assert r["arm"]["lr_bracketed"] is False and r["arm"]["chosen_on"] == "dev"
    assert any("the arm's best learning rate 0.001 is not inside its grid (0.001/0.003)" in n for n in r["notes"])
    assert not r["judged"] and "not judged: 3 seeds < 5" in r["notes"]


def _grid(placement, dev, test, seeds=5):
    """Runs at lr 1e-3, 3e-3, 1e-2 whose dev and test losses are given per learning rate (seed s adds s / 100)."""
    return [_run(placement, s, test[i] + s / 100, lr=lr, dev=dev[i] + s / 100)
            for i, lr in enumerate((1e-3, 3e-3, 1e-2)) for s in range(seeds)]


def test_the_learning_rate_is_chosen_on_dev_and_the_effect_read_on_test():
    # on dev pre is best at 3e-3 and lns at 1e-3; on test both would pick 1e-2: the choice must follow dev
    rows = _grid("pre", dev=[3.0, 2.8, 2.9], test=[3.0, 2.9, 2.0]) + _grid("lns", dev=[2.5, 2.7, 2.9],
                                                                              test=[2.6, 2.7, 1.0])
    r = C.measure(_spec(tune=("lr",)), rows)
    assert (r["arm"]["lr"], r["baseline"]["lr"]) == (1e-3, 3e-3)
    assert r["effect"] == pytest.approx(2.6 - 2.9)  # the test losses at the dev's choices, paired by seed
    assert r["baseline"]["lr_bracketed"] is True and r["arm"]["lr_bracketed"] is False and r["lr_bracketed"] is False
    assert r["judged"] and any("lowest mean final dev loss" in n for n in r["notes"])


def test_a_diverged_learning_rate_is_never_the_best():
    rows = _grid("pre", dev=[3.0, 2.8, 2.9], test=[3.0, 2.8, 2.9]) + _grid("lns", dev=[2.5, 2.7, 2.0],
                                                                              test=[2.5, 2.7, 2.0])
    for r in rows:
        if r["placement"] == "lns" and r["lr"] == 1e-2 and r["seed"] == 0:
            r["final_dev_loss"] = r["final_val_loss"] = float("nan")
    r = C.measure(_spec(tune=("lr",)), rows)
    assert r["arm"]["lr"] == 1e-3 and r["lr_bracketed"] is False


def _confirm(placement, lr, dev, test, seeds=range(5, 11)):
    """Confirmation runs: one setting at seeds 5-10 (seed s adds s / 100, as ``_grid``)."""
    return [_run(placement, s, test + s / 100, lr=lr, dev=dev + s / 100) for s in seeds]


def test_the_setting_is_chosen_on_the_seeds_run_at_every_setting_and_tested_on_all_its_seeds():
    # lns on seeds 0-4: best at 3e-3 (2.6) over 1e-3 (2.7). Seeds 5-10 run only at 1e-3 (dev 2.0) would make 1e-3
    # the best if counted (mean over 11 seeds 2.35): the choice must stay 3e-3, and those runs be left out
    rows = _grid("pre", dev=[3.0, 2.8, 2.9], test=[3.0, 2.8, 2.9]) + _grid("lns", dev=[2.7, 2.6, 2.9],
                                                                              test=[2.7, 2.6, 2.9])
    rows += _confirm("lns", 1e-3, dev=2.0, test=2.0)
    r = C.measure(_spec(tune=("lr",)), rows)
    assert (r["arm"]["lr"], r["arm"]["runs"]) == (3e-3, 5)  # counting seeds 5-10 would choose 1e-3
    assert r["arm"]["chosen_with_seeds"] == [0, 1, 2, 3, 4]
    assert r["n_seeds"] == 5 and r["arm"]["left_out"] == 6 and r["arm"]["lr_bracketed"] is True
    assert ("the arm's 6 runs at seeds 5-10, run at a setting not chosen here (confirmation runs of another "
            "claim's setting), are left out") in r["notes"]
    # the confirmation runs at each side's chosen setting: 11 pairs, every one below -> p = 2/2^11
    rows += _confirm("lns", 3e-3, dev=2.6, test=2.6) + _confirm("pre", 3e-3, dev=2.8, test=2.8)
    r = C.measure(_spec(tune=("lr",)), rows)
    assert (r["arm"]["lr"], r["baseline"]["lr"]) == (3e-3, 3e-3)
    assert r["n_seeds"] == 11 and r["p"] == pytest.approx(2 / 2 ** 11) and r["min_p"] == pytest.approx(2 / 2 ** 11)
    assert r["arm"]["runs"] == r["baseline"]["runs"] == 11 and r["effect"] == pytest.approx(-0.2)
    assert r["baseline"]["chosen_with_seeds"] == [0, 1, 2, 3, 4] and "left_out" not in r["baseline"]
    assert any("lowest mean final dev loss over seeds 0-4, those run at every setting" in n for n in r["notes"])


def test_confirmation_runs_enter_no_pool_and_no_pairing_over_the_grid():
    """A failure rate pools every setting of a side, and a claim paired by learning rate and seed spans the grid:
    seeds run at one of its settings only (another claim's confirmation runs) would weigh that setting more."""
    rows = _grid("pre", dev=[3.0, 2.8, 2.9], test=[3.0, 2.8, 2.9]) + _grid("lns", dev=[2.7, 2.6, 2.9],
                                                                              test=[2.7, 2.6, 2.9])
    rows += [r | {"failed": True} for r in _confirm("lns", 3e-3, dev=2.6, test=2.6)]
    rows += _confirm("pre", 3e-3, dev=2.8, test=2.8)
    fails = C.measure(_spec(measure=C.FAILURE, direction=HIGHER), rows)
    assert (fails["arm"]["runs"], fails["baseline"]["runs"], fails["effect"]) == (15, 15, 0.0)
    assert any(n.startswith("the arm's 6 runs at seeds 5-10, run at only some of its settings") for n in fails["notes"])
    grid = C.measure(_spec(pair_by=("lr", "seed")), rows)
    assert grid["n_seeds"] == 15 and grid["effect"] == pytest.approx((-0.3 - 0.2 + 0.0) / 3)
    # a side of one setting reads every seed run there
    one = [r for r in rows if r["lr"] == 3e-3]
    assert C.measure(_spec(), one)["n_seeds"] == 11


def test_a_side_with_no_seed_run_at_every_setting_is_not_measured():
    rows = [_run("pre", s, 2.5, lr=1e-3) for s in range(5)] + [_run("lns", s, 2.4, lr=1e-3) for s in (0, 1)]
    rows += [_run("lns", s, 2.4, lr=3e-3) for s in (2, 3)]
    r = C.measure(_spec(tune=("lr",)), rows)
    assert (r["n_seeds"], r["p"]) == (0, None)
    assert r["notes"][0] == "not measured: no seed of the arm's 4 runs in study/ was run at every one of its settings"


@pytest.mark.parametrize("change, reason", [
    (dict(val_bytes=4096), "val_bytes 4,096 < 262,144: the final losses were measured on 4,096 held-out bytes"),
    (dict(final_dev_loss=None), "the learning rate was chosen on the bytes the test reads (no dev loss recorded)"),
    (dict(data_digest="other"), "the runs read 2 different data splits (d, other)"),
])
def test_a_claim_is_judged_only_on_enough_held_out_bytes_one_split_and_a_dev_choice(change, reason):
    rows = _grid("pre", dev=[3.0, 2.8, 2.9], test=[3.0, 2.8, 2.9], seeds=6)
    rows += _grid("lns", dev=[2.9, 2.7, 2.8], test=[2.9, 2.7, 2.8], seeds=6)
    spec = _spec(tune=("lr",))
    assert C.measure(spec, rows)["judged"]
    i = next(i for i, r in enumerate(rows) if r["placement"] == "lns" and r["lr"] == 3e-3)  # one the test reads
    rows[i] = {**rows[i], **change}
    r = C.measure(spec, rows)
    assert not r["judged"] and r["notes"][0] == f"not judged: {reason}"


def test_a_failure_claim_uses_fisher_on_the_rates():
    rows = [_run("pre", s, 2.5) for s in range(3)] + [_run("lns", s, 3.1, failed=True) for s in range(3)]
    r = C.measure(_spec(measure=C.FAILURE, direction=HIGHER), rows)
    assert r["effect"] == 1.0 and r["p"] == pytest.approx(0.1) and r["mde"] is None
    assert (r["arm"]["mean"], r["baseline"]["mean"]) == (1.0, 0.0)  # the failure rates
    assert r["ci"] == pytest.approx([0.20593, 1.0], abs=1e-5)
    assert any("cannot reach p < 0.05" in n for n in r["notes"])


def test_a_fewer_failures_claim_gets_its_mde_and_no_cannot_reach_note():
    # 30 runs a side, the baseline failing every run: the test can reach p < 0.05 (the drop to 5/30 gives ~5e-12),
    # and the smallest drop it detects is a number -- not "none", nor "cannot reach p < 0.05 whatever the rates"
    rows = [_run("pre", s, 3.1, failed=True) for s in range(30)]
    rows += [_run("lns", s, 2.5 if s >= 5 else 3.1, failed=s < 5) for s in range(30)]
    r = C.measure(_spec(measure=C.FAILURE, direction=LOWER), rows)
    assert r["effect"] == pytest.approx(5 / 30 - 1) and r["p"] < 1e-10
    assert r["mde"] is not None and 0 < r["mde"] < 0.5
    assert not any("cannot reach" in n for n in r["notes"])


def test_holm_runs_over_the_judged_records_only(tmp_path):
    # the same 12 seeds twice, the second measured on 4 KiB: it keeps its p but is not judged, nor in Holm's family
    rows = [_run("pre", s, 2.5) for s in range(12)] + [_run("lns", s, 2.4 - 0.01 * s) for s in range(12)]
    rows += [_run("rms", s, 2.4 - 0.01 * s, val_bytes=4096) for s in range(12)]
    (tmp_path / "study").mkdir()
    (tmp_path / "study" / "summary.json").write_text(json.dumps({"runs": rows}))
    specs = (_spec(id="big"), _spec(id="small", arm=(("placement", "rms"),)))
    big, small = C.build(specs, tmp_path)
    assert big.p == small.p == pytest.approx(2 / 4096)
    assert big.p_holm == big.p and big.verdict == "supported"  # a family of one
    assert (small.judged, small.p_holm, small.verdict) == (False, None, INCONCLUSIVE)
    assert json.loads(C.to_json([big, small]))["holm_family"] == 1


def test_a_decided_claim_whose_t_interval_holds_zero_says_why(tmp_path):
    # 14 differences of -0.01 and one of -3 (a failed baseline run): every sign agrees, p = 2 / 2^15, while the
    # t interval (mean -0.209, sd 0.77) reaches past 0
    rows = [_run("pre", s, 2.5 + (3.0 if s == 0 else 0.01)) for s in range(15)] + [_run("lns", s, 2.5)
                                                                                for s in range(15)]
    (tmp_path / "study").mkdir()
    (tmp_path / "study" / "summary.json").write_text(json.dumps({"runs": rows}))
    (r,) = C.build((_spec(),), tmp_path)
    assert r.verdict == "supported" and r.p == pytest.approx(2 / 2 ** 15) and r.ci[0] < 0 < r.ci[1]
    assert any("the paired-t interval holds 0 while the sign-flip test rejects" in n for n in r.notes)
    rows = [_run("pre", s, 2.51) for s in range(15)] + [_run("lns", s, 2.5) for s in range(15)]
    (tmp_path / "study" / "summary.json").write_text(json.dumps({"runs": rows}))
    (r,) = C.build((_spec(),), tmp_path)
    assert r.verdict == "supported" and not any("holds 0" in n for n in r.notes)


def test_a_claim_reads_its_legacy_directory_until_its_own_is_committed(tmp_path):
    old = [_run("pre", s, 2.5, val_bytes=4096) for s in range(3)] + [_run("lns", s, 2.4, val_bytes=4096)
                                                                    for s in range(3)]
    (tmp_path / "study").mkdir()
    (tmp_path / "study" / "summary.json").write_text(json.dumps({"runs": old}))
    spec = _spec(preset="claims_seeds", legacy="study")
    (c,) = C.build((spec,), tmp_path)
    assert (c.preset, c.results, c.judged, c.val_bytes) == ("claims_seeds", "study", False, 4096)
    assert c.command.startswith("addnorm study --preset claims_seeds --out benchmarks/results/study/claims_seeds ")
    new = [_run("pre", s, 2.5) for s in range(6)] + [_run("lns", s, 2.4 - 0.01 * s) for s in range(6)]
    (tmp_path / "claims_seeds").mkdir()
    (tmp_path / "claims_seeds" / "summary.json").write_text(json.dumps({"runs": new}))
    (c,) = C.build((spec,), tmp_path)
    assert (c.results, c.judged, c.val_bytes, c.n_seeds) == ("claims_seeds", True, 262144, 6)
    (c,) = C.build((_spec(preset="claims_wide", legacy="wide"),), tmp_path)
    assert c.notes == ["not measured: benchmarks/results/study/claims_wide/ nor wide/ is not committed",
                       "outside the 8-CPU-hour claim set (claims_seeds, claims_frontier); its command makes its runs"]


def test_a_claim_outside_the_claim_set_says_what_its_runs_cost(committed):
    from addnorm.experiments.study.budget import CLAIM_SET

    for r in committed["claims"]:
        outside = [n for n in r["notes"] if n.startswith("outside the 8-CPU-hour claim set")]
        if r["preset"] in CLAIM_SET or r["notes"][0].startswith("not measured: an"):
            assert not outside, r["id"]
        else:
            (note,) = outside
            assert f"`{r['preset']}` takes " in note and "CPU-hours, computed from measured per-step times" in note


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
    assert c.notes[0] == "not measured: benchmarks/results/study/wide/ is not committed"


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
    assert (row["val_bytes"], row["final_dev_loss"]) == (2 * 8 * 32, None)  # before the test split: its batches
    s = json.loads((d / "runs" / "a" / "summary.json").read_text())
    (d / "runs" / "a" / "summary.json").write_text(json.dumps({**s, "val_bytes": 262144, "final_dev_loss": 2.1}))
    (d / "runs" / "a" / "config.json").write_text(json.dumps({"config": cfg, "data_digest": "abc"}))
    (row,) = C.load_rows(tmp_path, "frontier")
    assert (row["val_bytes"], row["final_dev_loss"], row["data_digest"]) == (262144, 2.1, "abc")
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


def test_a_paired_claims_command_trains_its_confirmation_runs_before_the_claims_file():
    specs = {s.id: s for s in C.SPECS}
    study = "addnorm study --preset claims_seeds --out benchmarks/results/study/claims_seeds"
    assert C.measure(specs["rmsnorm"], None)["command"] == (
        f"{study} && addnorm study --preset claims_seeds --confirm --out benchmarks/results/study/claims_seeds && "
        "python benchmarks/study_claims.py")
    # pooled (failure), paired over the grid, and paired by seed over untuned sides of 3 settings each (nothing to
    # run again): the preset's runs alone
    for claim in ("no_residual", "post_warmup", "batchnorm_leak"):
        assert C.measure(specs[claim], None)["command"] == f"{study} && python benchmarks/study_claims.py"
    assert [s.id for s in C.SPECS if s.preset == "claims_mixing" and s.confirmed] == ["hc_gain_depth", "mhc_gain"]


def test_a_runs_peak_gains_come_from_its_own_summary_where_summary_json_lacks_them(tmp_path):
    """A confirmation run reported after the preset's summary.json was written again without it keeps its gains."""
    d = tmp_path / "claims_mixing"
    (d / "runs" / "a").mkdir(parents=True)
    cfg = {"placement": "hc", "norm": "layer", "init": "gpt2", "depth": 24, "d_model": 64, "lr": 1e-3,
           "warmup": 100, "seed": 7, "steps": 500, "batch": 16, "seq_len": 64, "eval_batches": 4}
    (d / "runs" / "a" / "config.json").write_text(json.dumps({"config": cfg, "data_digest": "d"}))
    (d / "runs" / "a" / "summary.json").write_text(json.dumps(
        {"name": "a", "final_val_loss": 2.0, "failed": False, "peak_composite_gain_fwd": 9.5,
         "peak_composite_gain_bwd": 4.5}))
    (d / "summary.json").write_text(json.dumps({"runs": [], "mixing": []}))
    (row,) = C.load_rows(tmp_path, "claims_mixing")
    assert (row[C.GAIN_FWD], row[C.GAIN_BWD]) == (9.5, 4.5)
    assert C.run_rows(d) == [{k: v for k, v in row.items() if k != C.MODE_GAP}]
