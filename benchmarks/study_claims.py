"""Regenerate the study's claims file, benchmarks/results/study/claims.json, from the committed runs (one record per
claim: effect, 95 % interval, exact p, Holm-adjusted p, verdict, minimum detectable effect, the published number and
the command). Trains nothing; run it after committing a results directory, then commit claims.json -- a test
recomputes it and fails where the two differ.

    python benchmarks/study_claims.py
"""

from pathlib import Path

from addnorm.experiments.study.claims import main

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "study"

if __name__ == "__main__":
    raise SystemExit(main(["--results", str(RESULTS), "--out", str(RESULTS / "claims.json")]))
