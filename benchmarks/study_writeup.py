"""Regenerate the study's write-up from the committed results: the section of docs/study.md between its markers
and benchmarks/results/study/index.html (each claim, its measured answer with intervals, its figure, the
published number and the command); and the Method and Limitations of docs/study.md, from method.json (written here
from the code: the split, the claims presets' models, the optimizer, the measured step times) and claims.json.
Trains nothing; run it after committing a results directory (and after benchmarks/study_claims.py).

    python benchmarks/study_writeup.py
"""

from pathlib import Path

from addnorm.experiments.study import method
from addnorm.report import study_method
from addnorm.report.study_writeup import update_docs, write_page

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "study"

if __name__ == "__main__":
    method.main(["--results", str(RESULTS), "--out", str(RESULTS / "method.json")])
    changed = study_method.update_docs(ROOT / "docs" / "study.md", RESULTS, before="## What a run is")
    print(f"docs/study.md's Method and Limitations {'updated' if changed else 'already up to date'}")
    changed = update_docs(ROOT / "docs" / "study.md", RESULTS)
    page = write_page(RESULTS)
    print(f"docs/study.md {'updated' if changed else 'already up to date'}; {page.relative_to(ROOT)} written")
