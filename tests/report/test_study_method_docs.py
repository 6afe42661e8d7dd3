"""docs/study.md's Method and Limitations are rendered from the committed method.json and claims.json alone, and
each paper claim's scale is read from its published text."""

import json
from pathlib import Path

import pytest

from addnorm.report import study_method as S
from addnorm.report.docs_section import replace_section

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results" / "study"
DOC = ROOT / "docs" / "study.md"


def test_docs_study_md_holds_the_method_of_the_committed_files():
    text = DOC.read_text(encoding="utf-8")
    section = text[text.index(S.START):text.index(S.END) + len(S.END)]
    assert section + "\n" == S.markdown(S.load(RESULTS / "method.json"), S.load(RESULTS / "claims.json")), \
        "run python benchmarks/study_writeup.py"
    assert text.index(S.END) < text.index("## What a run is")  # read before the details


@pytest.mark.parametrize("setting, params, tokens", [
    ("LLaMA-style models of 71M to 1B parameters trained on C4", (71e6, 1e9), None),
    ("a 1.2B dense model (1T tokens) and a 6.9B Mixture-of-Experts model (500B tokens)", (1.2e9, 6.9e9), (5e11, 1e12)),
    ("a 64M-parameter language model at 1M tokens", (64e6, 64e6), (1e6, 1e6)),
    ("ViT, DiT, LLaMA 7B-70B and others", (7e9, 70e9), None),
    ("0.5B and 1B models on OpenWebText, contexts of 1k to 8k tokens", (0.5e9, 1e9), None),
    ("small language models at 118M tokens", None, (118e6, 118e6)),
    ("ViT on ImageNet", None, None),
])
def test_a_papers_scale_is_read_from_its_published_text(setting, params, tokens):
    assert S.paper_scale({"result": "it reaches 82.8 % top-1 with 16.11 % fewer parameters", "setting": setting}) \
        == (params, tokens)
    assert S.paper_scale(None) == (None, None)


def test_the_ratio_spans_the_smallest_paper_model_over_the_largest_run_to_the_reverse():
    assert S.ratio_text((71e6, 1e9), (1.22e6, 1.22e6)) == "58×–820×"
    assert S.ratio_text((27e9, 27e9), (1.25e6, 1.52e6)) == "18,000×–22,000×"
    assert S.ratio_text((1e6, 1e6), (512_000, 512_000)) == "2×"
    assert S.ratio_text(None, (1, 1)) == S.ratio_text((1, 1), None) == "—"


def _record(**kw):
    base = {"id": "lns", "source": "2502.05795", "tokens": 512_000, "judged": False, "effect": 0.1,
            "arm": {"n_params": 1_200_000}, "baseline": {"n_params": 1_300_000},
            "published": {"result": "LNS is better", "setting": "models of 130M to 7B parameters", "arxiv": "x"}}
    return {**base, **kw}


def test_each_paper_claim_is_a_row_with_its_scale_and_a_seeds_claim_is_not():
    claims = {"claims": [_record(), _record(id="no_residual", source="002_1b45541e9a6140b9.txt"),
                         _record(id="deepnorm_depth", published=None, tokens=None, arm={}, baseline={})]}
    lns, deep = S.scale_rows(claims)
    assert lns[0] == "`lns`" and lns[3:] == ["130M–7B", "1.2M–1.3M", "100×–5,800×", "—", "512k", "—"]
    assert deep[2:] == ["—", "—", "not measured", "—", "—", "not measured", "—"]


def test_the_limitations_say_which_claims_are_judged_from_the_claims_file():
    method = S.load(RESULTS / "method.json")
    claims = {"claims": [_record(), _record(id="a", judged=True), _record(id="b", effect=None)],
              "seeds_to_decide": 11, "min_seeds": 5, "min_val_bytes": 262_144,
              "selection_seeds": [0, 1, 2, 3, 4], "confirmation_seeds": [5, 6, 7, 8, 9, 10]}
    text = S.markdown(method, claims)
    assert "1 of the claims file's 3 claims are judged. Measured but not judged (1): `lns`. Not measured yet " \
           "(1): `b`." in text
    assert "a loss claim needs 11 pairs" in text
    for name, p in method["presets"].items():
        (row,) = [line for line in text.splitlines() if line.startswith(f"| `{name}` |")]
        assert f"| {p['runs']} |" in row


def test_the_section_goes_before_a_line_then_replaces_only_itself(tmp_path):
    doc = tmp_path / "study.md"
    doc.write_text("# Title\n\nintro\n\n## What a run is\n\nrest\n")
    (tmp_path / "method.json").write_text((RESULTS / "method.json").read_text())
    (tmp_path / "claims.json").write_text((RESULTS / "claims.json").read_text())
    assert S.update_docs(doc, tmp_path, before="## What a run is")
    text = doc.read_text()
    assert text.startswith("# Title\n\nintro\n\n" + S.START) and text.endswith(S.END + "\n\n## What a run is\n\nrest\n")
    assert not S.update_docs(doc, tmp_path, before="## What a run is")
    claims = json.loads((tmp_path / "claims.json").read_text())
    claims["seeds_to_decide"] = 99
    (tmp_path / "claims.json").write_text(json.dumps(claims))
    assert S.update_docs(doc, tmp_path, before="## What a run is")
    assert doc.read_text().count(S.START) == 1 and "needs 99 pairs" in doc.read_text()
    with pytest.raises(ValueError, match="section"):
        replace_section(doc, S.START, S.END, "no markers")
