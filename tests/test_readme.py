"""The README is a front page and the docs hold the rest: what that promises, checked.

- at most 250 lines, the two quick-start commands (real Makefile targets) in the first 40;
- its one table of headline numbers, the journal's full CPU tables, docs/exactness.md's HF parity table,
  docs/performance.md's tables beside the CPU engines and docs/hf.md's widened-stream decoders' table are what benchmarks/readme_table.py makes from the committed
  results (regenerate with `python benchmarks/readme_table.py`);
- no line quotes one CI run's time or test count (they change with every commit);
- no page cites an issue number (it means nothing to a reader: say what happened);
- every relative link of README.md and docs/*.md reaches a file, and every #anchor a heading of it;
- docs/architecture.md lists every moved module path of the alias table.

The snippets themselves run in tests/test_doc_snippets.py.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]


def _readme_table():
    spec = importlib.util.spec_from_file_location("readme_table", ROOT / "benchmarks" / "readme_table.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_readme_is_a_front_page():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines; move the manual to docs/"
    head = "\n".join(lines[:40])
    targets = re.findall(r"^([a-z]+):", (ROOT / "Makefile").read_text(), re.M)
    for command in ("make tour", "make test"):
        assert command in head, f"{command!r} is not in the README's first 40 lines"
        assert command.split()[1] in targets, f"the Makefile has no target for {command!r}"


@pytest.mark.parametrize("which", [0, 1, 2, 3, 4], ids=["README headline table", "journal CPU tables",
                                              "exactness parity", "performance CPU engines", "hf widened streams"])
def test_tables_are_the_scripts_output(which):
    rt = _readme_table()
    path, markers, body = rt.regions()[which]
    shown = rt.between(path.read_text(encoding="utf-8"), markers)
    assert shown == body, f"{path.name} differs from `python benchmarks/readme_table.py`: run it"


def test_readme_table_reads_only_committed_results():
    """Each line names its results file, and that file is committed under benchmarks/results/."""
    rt = _readme_table()
    rows = [r for r in rt.headline_table().splitlines()[2:]]
    assert len(rows) >= 6
    for row in rows:
        name = row.rstrip(" |").rsplit("`", 2)[-2]
        assert (ROOT / "benchmarks" / "results" / name).is_file(), row


CI_QUOTE = re.compile(r"\b\d[\d,]* (tests|passed|skipped|failed)\b|\b\d+ min \d+ s\b", re.I)


def test_readme_quotes_no_ci_run():
    for n, line in enumerate(README.read_text(encoding="utf-8").splitlines(), 1):
        assert not CI_QUOTE.search(line), f"README.md:{n} quotes a run's count or time: {line.strip()}"


ISSUE = re.compile(r"\bissues? #?\d+|(?<![\w&/])#\d+\b|\bPR #?\d+", re.I)


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_no_page_cites_an_issue_number(page):
    for n, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
        assert not ISSUE.search(line), f"{page.name}:{n} cites an issue number: {line.strip()}"


def test_issue_pattern_catches_the_forms_people_write():
    for text in ("(issue 24)", "see issue #22", "fixed in #24", "Issues 22 and 24"):
        assert ISSUE.search(text), text
    for text in ("seed 001", "H100 #", "line 24", "&#x27;", "index.html#12"):
        assert not ISSUE.search(text), text


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"`|\*\*?|\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    text = re.sub(r"^```.*?^```", "", page.read_text(encoding="utf-8"), flags=re.M | re.S)
    return {_slug(h) for h in re.findall(r"^#+ (.+)$", text, re.M)}


LINK = re.compile(r"\]\(([^)\s]+)\)")


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_links_reach_files_and_headings(page):
    text = re.sub(r"^```.*?^```", "", page.read_text(encoding="utf-8"), flags=re.M | re.S)
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target):
            continue  # https:, mailto:
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        assert dest.exists(), f"{page.name}: link to {target} reaches no file"
        if anchor and dest.suffix == ".md":
            assert anchor in _anchors(dest), f"{page.name}: link to {target}: no such heading in {dest.name}"


def test_slug_is_githubs():
    assert _slug("The allocation-free path: `out=` and `residual_out=`") == "the-allocation-free-path-out-and-residual_out"
    assert _slug("64×768 after the C++ autograd nodes") == "64768-after-the-c-autograd-nodes"
    assert _slug("The fused forms beyond Add & Norm") == "the-fused-forms-beyond-add--norm"


def test_architecture_lists_every_moved_path():
    from addnorm import _moved

    page = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    for old, new in _moved.MOVED.items():
        assert f"`{old}`" in page and f"`{new}`" in page, f"docs/architecture.md does not list {old} -> {new}"
