"""`addnorm trace`: seed 001's detailed step-by-step calculation for one position, in pure Python."""

from __future__ import annotations

import sys

from ..experiments.seed001 import TOKEN_NAMES, cross_check, run_seed001, trace_position


def add_arguments(p) -> None:
    p.add_argument("--position", type=int, default=0, help="position 0-4 in '<BOS> I like transformers <EOS>'")
    p.add_argument("--check", action="store_true", help="also recompute everything with PyTorch and compare")


def run(args) -> int:
    r = run_seed001()
    try:
        lines = trace_position(r, args.position)
    except ValueError as e:  # as argparse and every other command report a bad option: exit 2
        print(f"addnorm trace: error: --position: {e}", file=sys.stderr)
        return 2
    print("\n".join(lines))
    print()
    print("Verification: mean and variance after LayerNorm")
    for i, out in enumerate(r.layer_norm_output):
        m = sum(out) / len(out)
        v = sum((x - m) ** 2 for x in out) / len(out)
        print(f"Position {i} ({TOKEN_NAMES[r.config.tokens[i]]:12s}): mean = {m:9.6f}, variance = {v:.6f}")
    if args.check:
        print()
        for k, v in cross_check(r).items():
            print(f"max |pure Python - PyTorch| {k}: {v:.2e}")
    return 0
