"""The study's write-up (report/study_writeup.py): every claim answered from a study's rows with its intervals and
calls, the published numbers with their citations and the scale gap, the page and docs/study.md kept current."""

import json
import re
from pathlib import Path

from addnorm.report.published import PUBLISHED, scale_gap
from addnorm.report.study_writeup import (CLAIMS, END, NOT_MEASURED, NOT_REPRODUCED, REPRODUCED, START,
                                          _scale, answer, markdown, page, reproduced, update_docs)

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results" / "study"


def _pair(placement, lr, diff, low, high, call, fails=(0, 3, 0, 3), fail_call="not distinguishable"):
    return dict(placement=placement, norm="layer", depth=24, lr=lr, warmup=100, diff_mean=diff, diff_low=low,
                diff_high=high, call=call, failures=fails[0], seeds=fails[1], pre_failures=fails[2],
                pre_seeds=fails[3], fail_diff_mean=(fails[0] - fails[2]) / 3, fail_p=1.0,
                fail_call=fail_call, paired=True)


def test_a_claim_is_answered_from_the_pairwise_table_with_its_calls():
    claim = next(c for c in CLAIMS if c.key == "mixln")
    study = {"runs": [dict(placement="mix", norm="layer", depth=24, lr=1e-3, n_params=1_200_000,
                           tokens_seen=524288)],
             "pairwise": [_pair("mix", 1e-3, -0.137, -0.180, -0.107, "better"),
                          _pair("mix", 3e-3, 0.05, -0.02, 0.1, "not distinguishable"),
                          _pair("deepnorm", 1e-3, -0.2, -0.3, -0.1, "better")]}
    a = answer(claim, study)
    assert a["measured"] and a["verdict"] == "better at 1 of 2, not distinguishable at 1 of 2"
    assert a["lines"][0] == ("lr 0.001: final validation loss minus pre-LN's -0.137 [-0.180, -0.107] (failed 0/3 "
                             "vs 0/3) — better")
    assert answer(claim, None) == {"measured": False, "lines": [], "verdict": "not measured yet", "n_params": None,
                                   "tokens": None, "calls": []}
    assert reproduced(claim, answer(claim, None)) == [("", NOT_MEASURED, "no `paper24/` results committed")]


def test_the_mixing_gain_claim_reads_the_runs_gains_with_intervals():
    claim = next(c for c in CLAIMS if c.measure == "gain")
    runs = [dict(placement=p, depth=12, seed=s, max_composite_gain_fwd=g + s, max_composite_gain_bwd=g, n_params=1,
                 tokens_seen=1) for p, g in (("hc", 30.0), ("mhc", 1.0)) for s in range(3)]
    a = answer(claim, {"runs": runs + [dict(runs[0], placement="pre")]})
    assert a["lines"] == ["hc, 12 layers: largest composite gain forward 31 [30, 32], backward 30 [30, 30] (3 runs)",
                          "mhc, 12 layers: largest composite gain forward 2 [1, 3], backward 1 [1, 1] (3 runs)"]
    peaks = [dict(r, peak_composite_gain_fwd=r["max_composite_gain_fwd"] * 2,
                  peak_composite_gain_bwd=r["max_composite_gain_bwd"] * 2) for r in runs]
    a = answer(claim, {"runs": peaks})  # HC's rises and falls again: the peak over training, where recorded
    assert a["lines"][0] == ("hc, 12 layers: peak composite gain over training forward 62 [60, 64], backward 60 "
                             "[60, 60] (3 runs)")


def test_a_committed_summary_without_peaks_gets_them_from_its_mixing_series(tmp_path):
    from addnorm.report.study_writeup import load

    (tmp_path / "mixing").mkdir()
    row = dict(name="hc-a", placement="hc", depth=6, seed=0, lr=1e-3, max_composite_gain_fwd=6.0,
               max_composite_gain_bwd=4.0)
    mixing = [dict(placement="hc", depth=6, seed=0, lr=1e-3, series=[[50, 1.0, 1.0], [250, 10.0, 9.0], [500, 6.0, 4.0]])]
    (tmp_path / "mixing" / "summary.json").write_text(json.dumps({"runs": [row], "mixing": mixing}))
    (r,) = load(tmp_path)["mixing"]["runs"]
    assert (r["peak_composite_gain_fwd"], r["peak_composite_gain_bwd"]) == (10.0, 9.0)


def test_published_numbers_carry_citations_and_the_scale_gap():
    for key, number in (("post_diverges", "250M"), ("lns_beats_pre", "every model size"), ("mhc_gain", "3000"),
                        ("mhc_gain", "1.6"), ("dyt_budget", "-27 %"), ("dyt_budget", "+19 %"), ("ngpt", "4 to 20"),
                        ("value_residual", "16.11 %"), ("value_residual", "20.3 %")):
        assert number in PUBLISHED[key].result
    assert {a for p in PUBLISHED.values() for a in p.arxiv} == {"2412.13795", "2502.05795", "2512.24880", "2604.23434",
                                                               "2402.02622", "2503.04598", "2410.01131",
                                                               "2410.17897", "2512.10938"}
    # one arXiv id per citation: LayerNorm Scaling (Sun et al.) is 2502.05795, Mix-LN is 2412.13795
    for p in PUBLISHED.values():
        for citation, arxiv in p.refs:
            assert ("Sun et al." in citation) == (arxiv == "2502.05795"), (p.key, citation, arxiv)
            assert ("Mix-LN:" in citation) == (arxiv == "2412.13795"), (p.key, citation, arxiv)
    assert "58×–820× the study's 1.2M parameters" in scale_gap(PUBLISHED["lns_beats_pre"], 1_220_000)
    assert "2×–230× the study's 512,000 tokens" in scale_gap(PUBLISHED["dyt_budget"], None, 512_000)
    assert all(k in PUBLISHED for c in CLAIMS for k in c.published)


def test_each_command_writes_the_directory_its_claim_reads():
    for c in CLAIMS:
        assert c.command.startswith("addnorm study ") and c.command.endswith(f"--out benchmarks/results/study/{c.results}")


def test_docs_study_md_holds_the_current_write_up():
    """Regenerate with `python benchmarks/study_writeup.py` after committing results."""
    text = (ROOT / "docs" / "study.md").read_text()
    assert START in text and END in text
    assert text[text.index(START):text.index(END) + len(END)] + "\n" == markdown(RESULTS)


def test_update_docs_replaces_only_its_section(tmp_path):
    doc = tmp_path / "study.md"
    doc.write_text("# Title\n\nbefore\n")
    assert update_docs(doc, RESULTS) and doc.read_text().startswith("# Title\n\nbefore\n\n" + START)
    doc.write_text(doc.read_text().replace(START, START + "\nstale line") + "after\n")
    assert update_docs(doc, RESULTS) and "stale line" not in doc.read_text() and doc.read_text().endswith("after\n")
    assert not update_docs(doc, RESULTS)


def test_the_page_names_every_claim_and_links_only_existing_figures():
    shown = page(RESULTS).render("t")
    for c in CLAIMS:
        assert c.text in shown.replace("&#x27;", "'")
    for src in re.findall(r"<img src='([^']+)'", shown):
        assert (RESULTS / src).exists(), src


def _claim(key):
    return next(c for c in CLAIMS if c.key == key)


def _row(placement, n_params=1_200_000, **kw):
    return dict(placement=placement, norm="layer", depth=24, lr=1e-3, n_params=n_params, tokens_seen=524288, **kw)


def test_the_batchnorm_claim_is_answered_with_the_generalization_gap_not_the_loss():
    """BatchNorm ends worse in loss but with a smaller gap: 'generalizes poorly' is not reproduced."""
    pair = dict(_pair("pre", 1e-3, 0.245, 0.206, 0.283, "worse"), norm="batch", gap_diff_mean=-0.016,
                gap_diff_low=-0.028, gap_diff_high=-0.002, gap_call="smaller gap")
    claim = _claim("batchnorm")
    a = answer(claim, {"runs": [dict(_row("pre"), norm="batch")], "pairwise": [pair]})
    assert "generalization gap" in a["lines"][0] and a["lines"][0].endswith("— smaller gap")
    assert reproduced(claim, a)[0][1] == NOT_REPRODUCED


def test_the_depth_claims_read_post_and_the_others_apart():
    """Post-LN's claim is decided by post's pooled failures; DeepNorm's, Mix-LN's and LNS's 'keep training' by
    theirs -- the depth sweep measured Mix-LN failing more (7/24 vs 1/24), which the one old claim never judged."""
    pairs = [dict(_pair(p, 1e-3, -0.1, -0.2, -0.05, "better", (k, 3, 0, 3)), depth=d)
             for p, k in (("post", 3), ("deepnorm", 0), ("mix", 3), ("lns", 0)) for d in (6, 48)]
    study = {"runs": [_row(p) for p in ("post", "pre", "deepnorm", "mix", "lns")], "pairwise": pairs}
    a = answer(_claim("depth"), study)
    assert not any(p in line for line in a["lines"] for p in ("deepnorm", "mix", "lns"))
    # post fails 6/6 against 0/6 pooled over its depths (Fisher p = 0.002): that decides the claim
    assert "pooled over post's 2 settings: failed 6/6 vs pre-LN 0/6 (Fisher's exact test, p = 0.002) — fails more" \
        in a["lines"]
    assert reproduced(_claim("depth"), a)[0][1] == REPRODUCED
    others = answer(_claim("depth_others"), study)
    for placement in ("deepnorm", "mix", "lns"):
        assert any(line.startswith(placement) for line in others["lines"]), placement
    verdict = reproduced(_claim("depth_others"), others)[0]
    assert verdict[1] == NOT_REPRODUCED and "1 contradict" in verdict[2]  # mix fails more, pooled


def test_three_of_three_against_none_is_not_called_in_the_write_up():
    pair = dict(_pair("post", 1e-3, None, None, None, "no loss to compare (every run failed)", (3, 3, 0, 3)),
                fail_p=0.1, fail_call="not distinguishable")
    claim = _claim("post_unstable")
    a = answer(claim, {"runs": [_row("post")], "pairwise": [pair]})
    assert a["lines"] == ["lr 0.001: failed 3/3 vs pre-LN 0/3 (Fisher's exact test, p = 0.100) — not distinguishable"]
    assert reproduced(claim, a)[0][1] == NOT_REPRODUCED


def test_the_scale_is_the_range_of_parameter_counts_across_the_runs():
    claim = _claim("mhc_gain")
    runs = [dict(_row(p, n), depth=d, seed=0, max_composite_gain_fwd=1.0, max_composite_gain_bwd=1.0)
            for p, n, d in (("hc", 330_000, 6), ("mhc", 1_600_000, 24))]
    a = answer(claim, {"runs": runs})
    assert a["n_params"] == (330_000, 1_600_000) and _scale(a).startswith("0.33M–1.6M parameters")
    assert "the study's 0.33M–1.6M parameters" in scale_gap(PUBLISHED["mhc_gain"], a["n_params"])


def test_the_committed_write_up_says_per_published_result_whether_it_is_reproduced():
    text = markdown(RESULTS)
    for c in CLAIMS:
        section = text[text.index(f"**{c.text}**"):]
        section = section[:section.index("\n\n**") if "\n\n**" in section else len(section)]
        statuses = [s for s in (REPRODUCED, NOT_REPRODUCED, NOT_MEASURED) if f"**{s}**" in section]
        assert statuses, c.key
    mhc = text[text.index("Published result (mHC)"):].split("\n")[0]
    assert any(f"**{s}**" in mhc for s in (REPRODUCED, NOT_REPRODUCED, NOT_MEASURED))
    assert "Published result (HC): **reproduced**" in text


def _mixing_runs(mhc_losses, lite_losses, gain=1.0):
    runs = []
    for depth, hc_gain in ((6, 2.5), (12, 4.4)):
        for seed in range(2):
            runs.append(dict(placement="hc", depth=depth, seed=seed, max_composite_gain_fwd=hc_gain,
                             max_composite_gain_bwd=hc_gain, final_val_loss=2.5))
            runs.append(dict(placement="mhc", depth=depth, seed=seed, max_composite_gain_fwd=gain,
                             max_composite_gain_bwd=gain, final_val_loss=mhc_losses[seed]))
            runs.append(dict(placement="mhc_lite", depth=depth, seed=seed, max_composite_gain_fwd=1.0,
                             max_composite_gain_bwd=1.0, final_val_loss=lite_losses[seed]))
    return runs


def test_the_mhc_verdict_reads_whether_its_streams_stayed_copies():
    from addnorm.report.study_writeup import _gain_reproduced

    # equal losses run for run: the streams stayed copies, so the gain of 1 is by construction
    hc, mhc = _gain_reproduced(_mixing_runs([2.4, 2.5], [2.4, 2.5]))
    assert hc[1] == REPRODUCED and mhc[1] == NOT_MEASURED and "by construction" in mhc[2]
    # distinct streams (losses differ) and the gain held at 1 while HC's grows: reproduced
    hc, mhc = _gain_reproduced(_mixing_runs([2.4, 2.5], [2.41, 2.52]))
    assert mhc[1] == REPRODUCED and "backward (column) gain is at most 1" in mhc[2]
    # a constrained gain well above 1 is not the paper's result
    assert _gain_reproduced(_mixing_runs([2.4, 2.5], [2.41, 2.52], gain=1.4))[1][1] == NOT_REPRODUCED


def test_equivalence_is_the_whole_interval_inside_the_margin():
    """'Trains like LayerNorm' needs the interval inside +-margin; an interval holding 0 but reaching past the
    margin shows nothing, one wholly past it contradicts."""
    from addnorm.report.study_writeup import equivalence_call

    assert equivalence_call(-0.003, -0.001) == "equivalent"  # distinguishable from 0, yet equivalent
    assert equivalence_call(-0.2, 0.3) == "not shown equivalent"  # holds 0, says nothing
    assert equivalence_call(0.06, 0.2) == "not equivalent"
    assert equivalence_call(-0.05, 0.05) == "equivalent"
    assert equivalence_call(None, None) == "no loss to compare"


def test_a_results_directory_committed_before_its_preset_finished_says_so(tmp_path):
    """A preset finished across machines is committed as it goes: each claim it answers says how many of the
    preset's runs it read, until none is missing."""
    claim = next(c for c in CLAIMS if c.key == "lns")
    rows = [dict(placement=p, norm="layer", depth=24, lr=1e-3, seed=s, n_params=1_000_000, tokens_seen=512_000,
                 final_val_loss=2.5) for p in ("pre", "lns") for s in (0, 1)]
    study = {"runs": rows, "pairwise": [_pair("lns", 1e-3, -0.01, -0.02, 0.0, "not distinguishable")],
             "missing": ["lns-layer-L24-lr0.001-w100-s2-c0-xavier", "pre-layer-L24-lr0.001-w100-s2-c0-xavier"]}
    a = answer(claim, study)
    assert a["partial"] == "partial: 4 of 6 runs recorded"
    (tmp_path / "frontier").mkdir()
    (tmp_path / "frontier" / "summary.json").write_text(__import__("json").dumps(study))
    text = markdown(tmp_path)
    assert "- Measured in `frontier/` (1M parameters, 512k tokens, 0.51 tokens per parameter; partial: 4 of 6 " \
           "runs recorded)" in text
    assert "partial: 4 of 6 runs recorded" in page(tmp_path).render("t")
    assert answer(claim, dict(study, missing=[]))["partial"] == ""
    # a claim none of whose runs is committed yet says that, not that the directory is missing
    dense = next(c for c in CLAIMS if c.key == "denseformer")
    assert reproduced(dense, answer(dense, study)) == [
        ("", NOT_MEASURED, "none of its runs is among those committed in `frontier/` yet -- partial: 4 of 6 runs "
                           "recorded")]
    assert "none of its runs is among those committed in `frontier/` yet" in text


def test_the_hybridnorm_claims_read_each_init_apart():
    """HybridNorm's paper trains at Megatron's init ('gpt2'): its loss claim is decided there, the Xavier rows are
    shown beside it, and failures are pooled per init, never across inits (10/10 failed at Xavier and 0/10 at gpt2
    pooled would read as 'fails more' for a form that trains at its paper's init)."""
    pairs = [dict(_pair(p, lr, None, None, None, "no loss to compare (every run failed)", (5, 5, 0, 5)),
                  init="xavier", fail_p=0.008, fail_call="fails more")
             for p in ("hybrid", "hybrid_star") for lr in (1e-3, 3e-3)]
    pairs += [dict(_pair(p, lr, -0.05, -0.08, -0.02, "better", (0, 5, 0, 5)), init="gpt2")
              for p in ("hybrid", "hybrid_star") for lr in (1e-3, 3e-3)]
    study = {"runs": [_row("hybrid", init=i) for i in ("xavier", "gpt2")], "pairwise": pairs}
    loss = answer(_claim("hybridnorm"), study)
    assert "hybrid, xavier init, lr 0.001: final validation loss minus pre-LN's" in loss["lines"][0]
    assert loss["calls"] == ["better"] * 4  # the gpt2 rows decide; the Xavier rows' pooled failures are said apart
    assert reproduced(_claim("hybridnorm"), loss)[0][1] == REPRODUCED
    stable = answer(_claim("hybridnorm_stable"), study)
    pooled = [line for line in stable["lines"] if line.startswith("pooled")]
    assert [line.split(":")[0] for line in pooled] == [
        "pooled over hybrid's 2 settings", "pooled over hybrid_star's 2 settings",
        "pooled over hybrid (gpt2 init)'s 2 settings", "pooled over hybrid_star (gpt2 init)'s 2 settings"]
    assert "failed 10/10 vs pre-LN 0/10" in pooled[0] and "failed 0/10 vs pre-LN 0/10" in pooled[2]
    verdict = reproduced(_claim("hybridnorm_stable"), stable)[0]
    assert verdict[1] == NOT_REPRODUCED and "2 of 4" in verdict[2] and "2 contradict" in verdict[2]
