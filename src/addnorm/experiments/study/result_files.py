"""Where the study's committed results live, and the command line of the modules that recompute one file from them
(``claims``, ``method``): ``--results``, the results root, which must be a directory, and ``--out``, the file to
write. One parser for both, so their command lines cannot drift apart."""

from __future__ import annotations

import argparse
from pathlib import Path

RESULTS = Path("benchmarks/results/study")


def parse_results_and_out(module: str, description: str, out_name: str,
                          argv: list[str] | None = None) -> argparse.Namespace:
    """``--results`` (default ``RESULTS``) and ``--out`` (default ``RESULTS / out_name``) of
    ``python -m addnorm.experiments.study.<module>``. A ``--results`` that is not a directory exits with argparse's
    usage error (status 2), naming it."""
    ap = argparse.ArgumentParser(prog=f"python -m addnorm.experiments.study.{module}", description=description)
    ap.add_argument("--results", type=Path, default=RESULTS, help="the results root (default: %(default)s)")
    ap.add_argument("--out", type=Path, default=RESULTS / out_name, help="where to write (default: %(default)s)")
    args = ap.parse_args(argv)
    if not args.results.is_dir():
        ap.error(f"--results {args.results}: not a directory")
    return args
