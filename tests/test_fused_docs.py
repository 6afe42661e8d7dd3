"""The performance journal (docs/performance-journal.md, where the measured cells live; docs/performance.md is the
reference) shows the committed fused-forms benchmark results as they are: the tables are the results' own Markdown
(``bench.fused_forms.markdown``), regenerated from the JSON here."""

import json
from pathlib import Path

from addnorm.bench.fused_forms import OpRow, markdown

ROOT = Path(__file__).resolve().parents[1]
JOURNAL = ROOT / "docs" / "performance-journal.md"


def test_docs_show_the_committed_fused_forms_results():
    docs = JOURNAL.read_text()
    for sub in ("", "avx2/", "small_calls/", "small_calls/avx2/"):
        result = json.loads((ROOT / "benchmarks" / "results" / f"{sub}fused_forms_tuned.json").read_text())
        table = markdown([OpRow(**r) for r in result["rows"]])
        assert table in docs, f"the journal is not the committed {sub}fused_forms_tuned.json"
    ab = (ROOT / "benchmarks" / "results" / "erf" / "ab" / "ab.md").read_text().split("\n\n", 1)[1].rstrip("\n")
    assert ab in docs, "the journal is not the committed erf/ab/ab.md"
    block = json.loads((ROOT / "benchmarks" / "results" / "mhc_block.json").read_text())
    assert "\n".join(block["table"][2:]) in docs


def test_docs_show_the_committed_small_call_add_norm_results():
    from addnorm.bench.report import markdown_table

    docs = JOURNAL.read_text()
    for sub in ("", "avx2/"):
        result = json.loads((ROOT / "benchmarks" / "results" / "small_calls" / sub / "add_norm_tuned.json").read_text())
        assert markdown_table(result["rows"]) in docs, f"the journal lacks small_calls/{sub}add_norm_tuned"


def test_docs_show_the_committed_gpu_session():
    """The H200 sessions' tables: the fused-forms cells, the launch sweep's ranking, and the backward and forward
    pair tables (fractions of the copy bandwidth measured in the same session) -- all regenerated here."""
    from addnorm.bench import gpu_forms, gpu_tune

    docs = JOURNAL.read_text()
    forms = json.loads((ROOT / "benchmarks" / "results" / "fused_forms_gpu.json").read_text())
    assert gpu_forms.markdown([OpRow(**r) for r in forms["rows"]]) in docs
    second = json.loads((ROOT / "benchmarks" / "results" / "fused_forms_gpu_defaults.json").read_text())
    assert gpu_forms.markdown([OpRow(**r) for r in second["rows"]]) in docs  # the second session's cells
    third = json.loads((ROOT / "benchmarks" / "results" / "fused_forms_gpu_third.json").read_text())
    assert gpu_forms.markdown([OpRow(**r) for r in third["rows"]]) in docs  # the third session's cells
    from addnorm.bench.report import markdown_table

    h200 = json.loads((ROOT / "benchmarks" / "results" / "add_norm_gpu_h200.json").read_text())
    assert markdown_table(h200["rows"]) in docs  # Add & Norm on the H200
    assert {(r["op"], r["dtype"], r["mode"]) for r in second["repeat_rows"]} == {
        (r["op"], r["dtype"], r["mode"]) for r in second["rows"]}
    tune_dir = ROOT / "benchmarks" / "results" / "gpu_tune"
    assert (tune_dir / "gpu_tune.md").read_text().rstrip("\n") in docs
    cells = json.loads((tune_dir / "gpu_tune.json").read_text())["cells"]
    floors = sorted(r["floor_gbps"] for r in forms["rows"])
    floor = round(floors[len(floors) // 2])
    assert f"({floor} GB/s, the median" in docs
    for sweep, setting in (("bwd", "backward_rows=16,programs_per_sm=2,elems_per_warp=1024"),
                           ("fwd", "tile=8192,elems_per_warp=256")):
        assert gpu_tune.pair_table(cells, sweep, setting, floor) in docs, sweep
