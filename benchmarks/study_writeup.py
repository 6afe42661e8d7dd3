"""Regenerate the study's write-up from the committed results: the section of docs/study.md between its markers
and benchmarks/results/study/index.html (each claim, its measured answer with intervals, its figure, the
published number and the command). Trains nothing; run it after committing a results directory.

    python benchmarks/study_writeup.py
"""

from pathlib import Path

from addnorm.report.study_writeup import update_docs, write_page

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "study"

if __name__ == "__main__":
    changed = update_docs(ROOT / "docs" / "study.md", RESULTS)
    page = write_page(RESULTS)
    print(f"docs/study.md {'updated' if changed else 'already up to date'}; {page.relative_to(ROOT)} written")
