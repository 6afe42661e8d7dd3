"""Every instruction-set path of the CPU kernels side by side: ``addnorm bench`` (addnorm alone) run under each
``ADDNORM_CPU_ISA`` cap in turn, rounds alternating, and each cell's time over the AVX2 path's.

The picked path is the only one a machine runs, so a path that falls off its vector loops shows in no other table:
the AVX-512 path without AVX512_BF16 (Intel's Skylake-SP to Ice Lake) once ran the bfloat16 norms 3-7 times slower
than AVX2 on the same machine, through the portable loops, and nothing measured it. A path with more instructions
than AVX2 (native, avx512) should not be slower than it; the table marks such a cell whose time is over 1.25 times
AVX2's. The baseline build (SSE2, no F16C: float16 converts through a library call) is expected to be slower.

    python benchmarks/bench_isa_paths.py [--isa native,avx512,avx2,baseline] [--ops ...] [--shapes 2048x1024] \
        [--dtypes bfloat16,float16,float32] [--modes fwd,fwdbwd] [--rounds 2] [--out benchmarks/results/isa_paths]

``native`` is the path the CPU picks (here AVX-512 with AVX512_BF16), ``avx512`` caps it below AVX512_BF16.
Writes ``isa_paths.json`` and ``isa_paths.md`` under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_build_ab import bench_once  # noqa: E402

SLOW = 1.25  # a cell of a path above AVX2 over this many times AVX2's time is marked
ABOVE_AVX2 = ("native", "avx512")


def markdown(isas: list[str], rounds: int, rows: list[dict]) -> str:
    head = " | ".join(f"{i} ms" for i in isas) + " | " + " | ".join(f"{i} / avx2" for i in isas if i != "avx2")
    lines = [f"medians of {rounds} alternating rounds; ⚠ marks a path above AVX2 (native, avx512) over {SLOW}× AVX2's "
             "time", "",
             f"| op | norm | dtype | shape | mode | {head} |", "|---" * (5 + 2 * len(isas) - 1) + "|"]
    for r in rows:
        ms = " | ".join(f"{r['ms'][i]:.3f}" for i in isas)
        ratios = " | ".join(f"{r['over_avx2'][i]:.2f}{' ⚠' if i in ABOVE_AVX2 and r['over_avx2'][i] > SLOW else ''}"
                            for i in isas if i != "avx2")
        lines.append(f"| {r['op']} | {r['kind']} | {r['dtype']} | {r['shape'].replace('x', '×')} | {r['mode']} | "
                     f"{ms} | {ratios} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--isa", default="native,avx512,avx2,baseline")
    p.add_argument("--ops", default="add_norm,norm_add,parallel,parallel2,dyt")
    p.add_argument("--shapes", default="2048x1024")
    p.add_argument("--dtypes", default="bfloat16,float16,float32")
    p.add_argument("--modes", default="fwd,fwdbwd")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/isa_paths"))
    p.add_argument("--table-only", action="store_true", help="rewrite isa_paths.md from --out's isa_paths.json")
    args = p.parse_args()
    if args.table_only:
        saved = json.loads((args.out / "isa_paths.json").read_text())
        isas = list(saved["rows"][0]["ms"])
        text = f"CPU: {saved['cpu']}\n\n" + markdown(isas, saved["rounds"], saved["rows"])
        (args.out / "isa_paths.md").write_text(text)
        print(text, end="")
        return
    isas = args.isa.split(",")
    if "avx2" not in isas:
        raise SystemExit("--isa: the ratios are over the avx2 path's time; include avx2")
    src = str(Path(__file__).resolve().parent.parent / "src")
    runs: dict[tuple, dict[str, list[float]]] = {}
    for r in range(args.rounds):
        for isa in isas if r % 2 == 0 else isas[::-1]:
            for cell, ms in bench_once(src, isa, args).items():
                runs.setdefault(cell, {i: [] for i in isas})[isa].append(ms)
            print(f"round {r + 1} {isa} done", flush=True)
    rows = []
    for (op, kind, dtype, shape, mode), v in runs.items():
        med = {i: statistics.median(v[i]) for i in isas}
        rows.append(dict(op=op, kind=kind, dtype=dtype, shape=shape, mode=mode, runs_ms=v, ms=med,
                         over_avx2={i: med[i] / med["avx2"] for i in isas}))
    args.out.mkdir(parents=True, exist_ok=True)
    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), "?") \
        if os.path.exists("/proc/cpuinfo") else "?"
    (args.out / "isa_paths.json").write_text(json.dumps({"cpu": cpu, "rounds": args.rounds, "rows": rows}, indent=1))
    text = f"CPU: {cpu}\n\n" + markdown(isas, args.rounds, rows)
    (args.out / "isa_paths.md").write_text(text)
    print(text, end="")


if __name__ == "__main__":
    main()
