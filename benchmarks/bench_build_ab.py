"""A/B two builds of addnorm's kernels: ``addnorm bench`` run alternately from two source trees (each with its
kernels built in place), several rounds, and each cell's median over the rounds beside the other's.

One run of ``addnorm bench`` per build is not enough to compare two builds on a VM whose memory bandwidth moves
between runs (docs/performance.md, "Read the floor fractions"); alternating them, round after round, puts both
under the same conditions, and the median over rounds drops the odd slow run.

    python benchmarks/bench_build_ab.py --a OLD/src --b src --rounds 3 --isa avx512,avx2 \
        --ops dyt,derf --shapes 8192x1024 --out benchmarks/results/erf/ab

``--a`` and ``--b`` are directories put first on PYTHONPATH (a checkout's ``src`` with its kernels built by
``python setup.py build_ext --inplace``); ``--labels`` names them in the results (the paths are not written).
Writes ``ab.json`` and ``ab.md`` under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

RUN = "import sys; from addnorm.cli.main import main; sys.exit(main())"


def bench_once(src: str, isa: str, args) -> dict[tuple, float]:
    """{(op, norm, dtype, shape, mode): median ms} of one ``addnorm bench`` run from ``src`` (Add & Norm's rows,
    written to their own file, carry no op: theirs is add_norm)."""
    with tempfile.TemporaryDirectory() as out:
        env = dict(os.environ, PYTHONPATH=src, ADDNORM_CPU_ISA=isa)
        cmd = [sys.executable, "-c", RUN, "bench", "--ops", args.ops, "--shapes", args.shapes, "--dtypes", args.dtypes,
               "--modes", args.modes, "--methods", "addnorm", "--allocator", "current", "--out", out]
        subprocess.run(cmd, env=env, check=True, capture_output=True, cwd=src)
        rows = [r for f in sorted(Path(out).glob("*_current.json")) for r in json.loads(f.read_text())["rows"]]
    return {(r.get("op", "add_norm"), r["kind"], r["dtype"], f"{r['rows']}x{r['hidden']}", r["mode"]): r["median_ms"]
            for r in rows if r["method"] == "addnorm"}


def markdown(label_a: str, label_b: str, rounds: int, rows: list[dict]) -> str:
    lines = [f"A: {label_a}; B: {label_b}; medians of {rounds} alternating rounds", "",
             "| path | op | norm | dtype | shape | mode | A ms (median) | B ms (median) | B time / A time |",
             "|---|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['isa']} | {r['op']} | {r['kind']} | {r['dtype']} | {r['shape'].replace('x', '×')} | {r['mode']} | "
              f"{r['a_median_ms']:.3f} | {r['b_median_ms']:.3f} | {r['b_over_a']:.2f} |" for r in rows]
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--a", required=True, help="PYTHONPATH of build A (the baseline)")
    p.add_argument("--b", required=True, help="PYTHONPATH of build B")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--isa", default="avx512,avx2")
    p.add_argument("--ops", default="dyt,derf")
    p.add_argument("--shapes", default="8192x1024")
    p.add_argument("--dtypes", default="float32,bfloat16")
    p.add_argument("--modes", default="fwd,fwdbwd")
    p.add_argument("--labels", default="A,B", help="what A and B are, for the results (not their paths)")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    label_a, label_b = args.labels.split(",", 1)
    runs: dict[tuple, dict[str, list[float]]] = {}
    for isa in args.isa.split(","):
        for r in range(args.rounds):
            for label, src in (("a", args.a), ("b", args.b)) if r % 2 == 0 else (("b", args.b), ("a", args.a)):
                for cell, ms in bench_once(os.path.abspath(src), isa, args).items():
                    runs.setdefault((isa, *cell), {"a": [], "b": []})[label].append(ms)
                print(f"{isa} round {r + 1} {label} done", flush=True)
    rows = []
    for (isa, op, kind, dtype, shape, mode), v in runs.items():
        a, b = statistics.median(v["a"]), statistics.median(v["b"])
        rows.append(dict(isa=isa, op=op, kind=kind, dtype=dtype, shape=shape, mode=mode, a_ms=v["a"], b_ms=v["b"],
                         a_median_ms=a, b_median_ms=b, b_over_a=b / a))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "ab.json").write_text(json.dumps({"a": label_a, "b": label_b, "rounds": args.rounds, "rows": rows},
                                                 indent=1))
    text = markdown(label_a, label_b, args.rounds, rows)
    (args.out / "ab.md").write_text(text)
    print(text, end="")


if __name__ == "__main__":
    main()
