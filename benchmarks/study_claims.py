"""Regenerate the study's claims file, benchmarks/results/study/claims.json, from the committed runs (one record per
claim: effect, 95 % interval, exact p, Holm-adjusted p, verdict, minimum detectable effect, the published number and
the command), and docs/study.md's claims table from it. Trains nothing; run it after committing a results
directory, then commit both -- a test recomputes them and fails where they differ.

    python benchmarks/study_claims.py
"""

from pathlib import Path

from addnorm.experiments.study.claims import main
from addnorm.report.claims_table import update_docs
from addnorm.report.study_writeup import START as WRITEUP

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "study"

if __name__ == "__main__":
    main(["--results", str(RESULTS), "--out", str(RESULTS / "claims.json")])
    changed = update_docs(ROOT / "docs" / "study.md", RESULTS / "claims.json", before=WRITEUP)
    print(f"docs/study.md's claims table {'updated' if changed else 'already up to date'}")
