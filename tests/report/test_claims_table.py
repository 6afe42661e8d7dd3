"""docs/study.md's claims table and the study page's are rendered from the committed claims.json alone."""

import json
from pathlib import Path

from addnorm.report import claims_table as T
from addnorm.report.study_writeup import START as WRITEUP, page

ROOT = Path(__file__).resolve().parents[2]
CLAIMS = ROOT / "benchmarks" / "results" / "study" / "claims.json"
DOC = ROOT / "docs" / "study.md"


def test_docs_study_md_holds_the_table_of_the_committed_claims_file():
    text = DOC.read_text(encoding="utf-8")
    section = text[text.index(T.START):text.index(T.END) + len(T.END)]
    assert section + "\n" == T.markdown(T.load(CLAIMS)), "run python benchmarks/study_claims.py"
    assert text.index(T.END) < text.index(WRITEUP)  # above the write-up, whose calls it overrules


def test_every_claim_is_one_row_with_its_numbers():
    data = T.load(CLAIMS)
    md = T.markdown(data)
    for c in data["claims"]:
        (line,) = [x for x in md.splitlines() if x.startswith(f"| **{c['id']}**:")]
        assert f"**{c['verdict']}**" in line
        assert ("(not judged)" in line) == (not c["judged"])
        if c["p_holm"] is not None:
            assert f"| {c['p']:.2g} | {c['p_holm']:.2g} |" in line
        elif c["p"] is not None:
            assert f"| {c['p']:.2g} | — |" in line
    assert T.counts_text(data).startswith(f"{len(data['claims'])} claims: ")


def _claim(**kw):
    base = {"id": "lns", "statement": "LNS ends below pre-LN.", "source": "2502.05795", "preset": "frontier",
            "arm": {"placement": "lns", "norm": "layer", "init": "xavier", "lr": 0.003, "runs": 5},
            "baseline": {"placement": "pre", "norm": "layer", "init": "gpt2", "lr": 0.003, "runs": 5},
            "measure": "final_val_loss", "n_seeds": 5, "effect": 0.1388, "ci": [0.0922, 0.1853], "p": 0.0625,
            "p_holm": 1.0, "verdict": "inconclusive", "mde": 0.0631, "published": None}
    return {**base, **kw}


def test_a_row_by_hand():
    data = {"claims": [_claim(), _claim(id="fails", measure="failure_rate", effect=1.0, ci=[0.2059, 1.0], p=0.1,
                                        mde=None, source="002_1b45541e9a6140b9.txt", n_seeds=3,
                                        arm={"placement": "no_residual", "lr": 0.001, "runs": 3},
                                        baseline={"placement": "pre", "lr": 0.001, "runs": 3})],
            "holm_family": 2, "method": "m"}
    lns, fails = T.rows(data)
    assert lns[1:] == ["[arXiv 2502.05795](https://arxiv.org/abs/2502.05795)", "`frontier`",
                       "lns, xavier init, lr 0.003 vs pre, gpt2 init, lr 0.003", "5",
                       "+0.139 [+0.0922, +0.185] (final held-out loss, nats)", "0.062", "1", "**inconclusive**",
                       "0.0631", "—"]
    assert fails[1] == "seed `002_1b45541e9a6140b9.txt`" and fails[4] == "3 (3 vs 3 runs)"
    assert fails[5] == "+1.00 [+0.21, +1.00] (failure rate)" and fails[9] == "none at 80 %"
    assert T.counts_text(data) == "2 claims: 0 supported, 0 contradicted, 2 inconclusive; 2 judged (Holm's " \
                                  "correction over those 2)"
    unjudged = T.rows({"claims": [_claim(judged=False, p_holm=None, results="wide", preset="claims_wide")]})[0]
    assert unjudged[2] == "`claims_wide` (runs read: `wide`)" and unjudged[7:9] == ["—", "**inconclusive** (not judged)"]


def test_update_docs_replaces_only_its_section(tmp_path):
    claims = tmp_path / "claims.json"
    claims.write_text(json.dumps({"claims": [_claim()], "holm_family": 1, "method": "m"}))
    doc = tmp_path / "study.md"
    doc.write_text(f"# head\n\n{WRITEUP}\nrest\n")
    assert T.update_docs(doc, claims, before=WRITEUP)
    text = doc.read_text()
    assert text.startswith("# head\n\n" + T.START) and text.endswith(f"{T.END}\n\n{WRITEUP}\nrest\n")
    assert not T.update_docs(doc, claims, before=WRITEUP)  # idempotent
    claims.write_text(json.dumps({"claims": [_claim(verdict="supported", p_holm=0.01)], "holm_family": 1,
                                  "method": "m"}))
    assert T.update_docs(doc, claims, before=WRITEUP)
    assert doc.read_text().count(T.START) == 1 and "**supported**" in doc.read_text()


def test_the_study_page_shows_the_claims_table():
    html = page(ROOT / "benchmarks" / "results" / "study").render("t")
    assert "<h2>The claims file</h2>" in html
    for c in T.load(CLAIMS)["claims"]:
        assert f"{c['id']}: " in html


def test_the_seeds_text_says_where_settings_are_chosen_and_how_many_seeds_test_them():
    data = {"claims": [_claim()] * 39, "seeds_to_decide": 11, "selection_seeds": [0, 1, 2, 3, 4],
            "confirmation_seeds": [5, 6, 7, 8, 9, 10]}
    text = T.seeds_text(data)
    assert "p < 0.05/39" in text and "Five seeds cannot decide any paired claim (p >= 2/32 = 0.0625)" in text
    assert text.endswith("So the learning rates (and warmups) are chosen on the dev split with seeds 0–4, the chosen "
                         "settings are run again at seeds 5–10, and every claim paired by seed is tested on all 11 "
                         "seeds at the chosen settings (p down to 2/2^11).")
    assert "chosen on the dev split with seeds 0–4" in T.markdown(json.loads(CLAIMS.read_text(encoding="utf-8")))
