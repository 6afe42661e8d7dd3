"""The documentation's tables are the generated ones: they cannot drift from the code or the results."""

import json
from pathlib import Path

from addnorm.bench.frontier_cost import table
from addnorm.model.placement import FRONTIER, NAMES, PLACEMENTS, markdown_table

ROOT = Path(__file__).resolve().parents[2]


def test_docs_and_readme_show_the_generated_placement_tables():
    assert markdown_table(FRONTIER) in (ROOT / "docs" / "frontier.md").read_text()
    assert markdown_table() in (ROOT / "docs" / "model.md").read_text()  # the placements page (the README links it)
    assert set(FRONTIER) <= set(NAMES) and all(n in NAMES for n in PLACEMENTS)


def test_docs_cost_table_is_the_committed_benchmark_result():
    result = json.loads((ROOT / "benchmarks" / "results" / "frontier_cost.json").read_text())
    assert table(result) in (ROOT / "docs" / "frontier.md").read_text()
    assert {f"{f}#0" for f in FRONTIER if f != "hybrid_star"} | {"pre#1"} <= set(result["runs"])
