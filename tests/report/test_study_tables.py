"""The study's tables (report/study_tables.py) from hand-made rows: seeds pooled with intervals, token budgets,
differences against pre-LN and their calls, the learning-rate table, and the variant labels of figures."""

import pytest

from addnorm.report.study_tables import groups, lr_range_table, markdown, pairwise, tokens_text, variants


def row(p, lr, seed, failed, loss, norm="layer", warmup=100, tokens=512 * 16 * 64, params=1_000_000, **kw):
    return dict(name=f"{p}-{norm}-{lr}-{seed}", placement=p, norm=norm, depth=24, warmup=warmup, init="xavier",
                clip=0.0, lr=lr, seed=seed, failed=failed, failure="plateau" if failed else "", final_val_loss=loss,
                generalization_gap=0.01, tokens_seen=tokens, n_params=params, **kw)


def test_figures_never_draw_runs_that_differ_in_an_axis_as_one():
    rows = [dict(placement="pre", norm=n, depth=24, warmup=w, init="xavier", clip=0.0, lr=1e-3, seed=0)
            for n in ("layer", "dyt") for w in (0, 100)]
    assert len(set(variants(rows).values())) == 4
    assert set(variants(rows, without=("warmup",)).values()) == {"pre layer", "pre dyt"}
    assert variants(rows[:1]) == {id(rows[0]): "pre"}  # nothing varies: the placement alone
    wide = [dict(rows[0], n_streams=n, placement="mhc") for n in (2, 4)]
    assert set(variants(wide).values()) == {"mhc n=2", "mhc n=4"}


def test_the_learning_rate_table_pools_seeds_with_intervals_and_names_where_every_seed_trained():
    rows = [row("post", 1e-3, 0, True, 3.2), row("post", 1e-3, 1, False, 3.0), row("post", 1e-2, 0, True, 3.3),
            row("post", 1e-2, 1, True, 3.3), row("pre", 1e-3, 0, False, 2.5), row("pre", 1e-3, 1, False, 2.7),
            row("pre", 1e-2, 0, False, 2.4), row("pre", 1e-2, 1, False, 2.4)]
    table = lr_range_table(rows)
    assert "| post | 3.000 (1 of 2 failed) | failed (2 of 2) | none |" in table  # one run: no interval
    # two seeds: 4 equally likely resamples, means 2.5, 2.6, 2.6, 2.7 -> the 2.5 % and 97.5 % points are the ends
    assert "| pre | 2.600 [2.500, 2.700] | 2.400 [2.400, 2.400] | 0.001, 0.01 |" in table
    assert lr_range_table(rows[:1]) == []


def test_groups_carry_intervals_failures_and_the_token_budget():
    rows = [row("pre", 1e-3, s, False, v) for s, v in enumerate((2.0, 2.1, 2.3))] + [
        row("post", 1e-3, 0, True, 3.3, tokens=100 * 16 * 64), row("post", 1e-3, 1, True, 3.3, tokens=512 * 16 * 64)]
    pre, post = groups(rows)
    assert (pre["val_loss_low"], pre["val_loss_high"]) == (2.0, 2.3)  # 3 seeds: the range
    assert pre["val_loss_mean"] == pytest.approx(2.1333333)
    assert (pre["tokens_seen_min"], pre["tokens_per_param_max"]) == (524288, 0.524288)
    assert post["val_loss_mean"] is None and post["failures"] == 2
    assert (post["tokens_seen_min"], post["tokens_seen_max"]) == (102400, 524288)  # stopped at different steps
    md = markdown({"grid": "g", "corpus": "c", "unigram_nats": 3.1, "runs": rows, "missing": [],
                   "groups": [pre, post], "pairwise": pairwise(rows)})
    assert "| 2.133 [2.000, 2.300] | +0.010 [+0.010, +0.010] | 524k | 0.52 |" in md
    assert "| 2 / 2 (plateau) | — | — | 102k–524k | 0.1–0.52 |" in md


def test_tokens_text():
    assert [tokens_text(n) for n in (512, 524288, 1_000_000, 118e6, 2.5e9)] == ["512", "524k", "1M", "118M", "2.5G"]


def test_pairwise_is_paired_by_seed_and_calls_only_where_the_interval_excludes_zero():
    pre = [row("pre", 1e-3, s, False, v) for s, v in enumerate((2.50, 2.60, 2.70))]
    better = [row("deepnorm", 1e-3, s, False, v - 0.1 + 0.01 * s) for s, v in enumerate((2.50, 2.60, 2.70))]
    mixed = [row("sandwich", 1e-3, s, False, v + d) for s, (v, d) in enumerate(zip((2.50, 2.60, 2.70),
                                                                                    (-0.02, 0.01, 0.03)))]
    broken = [row("post", 1e-3, s, True, 3.2) for s in range(3)]
    dyt = [row("pre", 1e-3, s, False, v + 0.2, norm="dyt") for s, v in enumerate((2.50, 2.60, 2.70))]
    other_lr = [row("lns", 3e-3, s, False, 2.0) for s in range(3)]  # no pre at 3e-3: no comparison
    got = {(d["placement"], d["norm"]): d for d in pairwise(pre + better + mixed + broken + dyt + other_lr)}
    assert set(got) == {("deepnorm", "layer"), ("sandwich", "layer"), ("post", "layer"), ("pre", "dyt")}
    d = got["deepnorm", "layer"]
    # per-seed differences -0.10, -0.09, -0.08 (paired): 3 pairs, so the interval is their range
    assert d["paired"] and d["diff_low"] == pytest.approx(-0.10) and d["diff_high"] == pytest.approx(-0.08)
    assert d["call"] == "better" and d["fail_call"] == "not distinguishable"
    s = got["sandwich", "layer"]
    assert s["diff_low"] < 0 < s["diff_high"] and s["call"] == "not distinguishable"
    p = got["post", "layer"]
    assert p["diff_mean"] is None and p["call"] == "no loss to compare (every run failed)"
    # 3/3 vs 0/3: the bootstrap of 0/1 outcomes gave a zero-width [1, 1] and called it; Fisher's p is 0.1
    assert p["fail_diff_mean"] == 1.0 and p["fail_p"] == pytest.approx(0.1) and p["fail_call"] == "not distinguishable"
    assert got["pre", "dyt"]["call"] == "worse"  # DyT's baseline is pre-norm LayerNorm at the same lr


def test_pairwise_is_unpaired_where_the_seeds_differ():
    pre = [row("pre", 1e-3, s, False, 2.5 + 0.1 * s) for s in range(3)]
    mix = [row("mix", 1e-3, 0, True, 3.1)] + [row("mix", 1e-3, s, False, 2.0 + 0.1 * s) for s in (1, 2)]
    (d,) = pairwise(pre + mix)
    assert d["paired"] is False and d["diff_mean"] == pytest.approx(2.15 - 2.6)
    assert d["call"] == "better"  # every resampled mean of mix (2.1..2.2) is below every one of pre (2.5..2.7)


def test_failure_counts_are_called_by_fishers_exact_test_and_gaps_are_compared():
    pre = [row("pre", 1e-3, s, False, 2.5) for s in range(5)]
    post = [row("post", 1e-3, s, True, 3.2) for s in range(5)]  # 5/5 vs 0/5: p = 2/252
    batch = [dict(row("pre", 1e-3, s, False, 2.7, norm="batch"), generalization_gap=0.01 - 0.02 * (s + 1))
             for s in range(5)]
    got = {d["norm"] if d["placement"] == "pre" else d["placement"]: d for d in pairwise(pre + post + batch)}
    assert got["post"]["fail_p"] == pytest.approx(2 / 252) and got["post"]["fail_call"] == "fails more"
    b = got["batch"]  # the loss is worse, but the generalization gap is smaller: each measure its own call
    assert b["call"] == "worse" and b["gap_call"] == "smaller gap" and b["gap_diff_high"] < 0
    md = markdown({"grid": "g", "corpus": "c", "unigram_nats": 3.1, "runs": pre + post, "missing": [],
                   "groups": groups(pre + post), "pairwise": pairwise(pre + post)})
    assert "| +1.00 (p = 0.008) | fails more |" in md and "Fisher's exact test" in md
