"""addnorm's CPU kernels with the caches emptied before every call: each call reads its inputs from DRAM, as
a layer does after a matmul has swept the caches, and the copy floor is timed the same way.

`addnorm bench` times its methods interleaved, so what a call finds in the cache depends on what ran before it;
on a machine whose last-level cache holds a whole 8192x1024 cell (480 MiB here) a kernel timed alone runs from
cache. Here a read-only pass over 1 GiB precedes every timed call (it leaves no dirty lines to write back), so
every kernel and the floor start alike. This is how the bfloat16 kernels were found latency-bound: from DRAM
the stream read took as long in bfloat16 as in float32. No eager or compile columns: this times addnorm alone.

    python benchmarks/bench_cold.py [--ops add_norm:layer,norm_add:rms,...] [--modes fwd,fwdbwd] [--tag NAME]
    python benchmarks/bench_cold.py --compare before,after   # two runs' tables side by side (compare_<a>_<b>.md)
    python benchmarks/bench_cold.py --warm-rows 128 ...       # and each cell's arithmetic alone (below)

--warm-rows K adds each cell's arithmetic time: the same call on K and on 2K rows, timed warm (in cache, no
flush; median of many calls), the difference scaled to the full shape -- the per-call overhead cancels in the
difference. Its column "arith bound" is the fraction of the floor the kernel could reach if its memory traffic
cost nothing: below 0.85 (0.75 fwd+bwd), the floor target is out of this machine's reach at that arithmetic.

It runs under the tuned allocator, as `addnorm bench --allocator tuned` does (cpu_cells.TUNED_MALLOC: glibc
keeps freed memory; it re-executes itself with them when they are not set). Writes
benchmarks/results/cold/cold_<tag>.{json,md}.
"""

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

from addnorm.bench import add_norm, cpu_cells, fused_forms
from addnorm.bench.gpu import addnorm_method
from addnorm.harness.store import atomic_write_text

OPS = ["add_norm:layer", "add_norm:rms", "norm_add:layer", "norm_add:rms", "parallel:layer", "parallel:rms",
       "parallel2:layer", "parallel2:rms", "dyt", "derf", "stream_read", "stream_write"]
FLUSH_FLOATS = 1 << 28  # 1 GiB of float32, read once before each call


def median_seconds(fn, runs: int, before=None) -> float:
    """Median seconds of ``fn()`` over ``runs`` calls, each after ``before()`` (untimed) where given."""
    times = []
    for _ in range(runs):
        if before is not None:
            before()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def cold_median(fn, flush: torch.Tensor, runs: int) -> float:
    """Median seconds of ``fn()`` over ``runs`` calls, each after a read-only pass over ``flush``."""
    return median_seconds(fn, runs, flush.sum)


def warm_median(fn, runs: int) -> float:
    """Median seconds of ``fn()`` over ``runs`` calls back to back, its data left in cache (3 calls first)."""
    for _ in range(3):
        fn()
    return median_seconds(fn, runs)


def arithmetic_seconds(op: str, kind: str, mode: str, n: int, d: int, dtype: torch.dtype, k: int) -> float:
    """The full shape's arithmetic alone: (time on 2k rows - time on k rows) * n / k, both warm."""
    with torch.set_grad_enabled(mode != "fwd"):
        t1, t2 = (warm_median(step_and_bytes(op, kind, mode, rows, d, dtype)[0], 201) for rows in (k, 2 * k))
    return max(t2 - t1, 0.0) * n / k


def step_and_bytes(op: str, kind: str, mode: str, n: int, d: int, dtype: torch.dtype):
    es = torch.tensor([], dtype=dtype).element_size()
    if op == "add_norm":
        return (add_norm.make_step(addnorm_method(kind), mode, n, d, dtype, kind),
                add_norm.min_bytes(mode, n, d, es))
    return (fused_forms.make_step(fused_forms.fused(op, kind), op, mode, n, d, dtype, kind),
            fused_forms.min_bytes(op, mode, n, d, es))


def compare(out: Path, a: str, b: str) -> str:
    """Two runs' cells side by side: each one's fraction of its own floor, and b's time over a's."""
    ra, rb = (json.loads((out / f"cold_{t}.json").read_text())["rows"] for t in (a, b))
    key = lambda r: (r["op"], r["kind"], r["dtype"], r["mode"])  # noqa: E731
    before = {key(r): r for r in ra}
    md = [f"| op | norm | dtype | mode | {a} ms | of floor | {b} ms | of floor | {b} / {a} |", "|---|" * 1 + "---|" * 8]
    for r in rb:
        o = before.get(key(r))
        if o is not None:
            md.append(f"| {r['op']} | {r['kind']} | {r['dtype']} | {r['mode']} | {o['ms']:.2f} | {o['of_floor']:.2f} | "
                      f"{r['ms']:.2f} | {r['of_floor']:.2f} | {r['ms'] / o['ms']:.2f} |")
    text = "\n".join(md) + "\n"
    atomic_write_text(out / f"compare_{a}_{b}.md", text)
    return text


def main() -> int:
    p = argparse.ArgumentParser(prog="bench_cold.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ops", default=",".join(OPS), help="comma separated op[:kind]")
    p.add_argument("--modes", default="fwd,fwdbwd")
    p.add_argument("--dtypes", default="bfloat16,float32")
    p.add_argument("--shape", default="8192x1024")
    p.add_argument("--runs", type=int, default=15)
    p.add_argument("--tag", default="now", help="names the output files (a build to compare: before, after)")
    p.add_argument("--out", default="benchmarks/results/cold")
    p.add_argument("--compare", help="two tags, comma separated: print and write their tables side by side")
    p.add_argument("--warm-rows", type=int, default=0,
                   help="K > 0: add each cell's arithmetic time, from warm calls on K and 2K rows")
    args = p.parse_args()
    if args.compare:
        a, b = args.compare.split(",")
        print(compare(Path(args.out), a, b), end="")
        return 0
    if any(os.environ.get(k) != v for k, v in cpu_cells.TUNED_MALLOC.items()):  # glibc reads them at start-up
        os.execve(sys.executable, [sys.executable, *sys.argv], dict(os.environ, **cpu_cells.TUNED_MALLOC))
    n, d = (int(v) for v in args.shape.split("x"))
    flush = torch.ones(FLUSH_FLOATS)
    floor_bytes = cpu_cells.FLOOR_BYTES
    floor = 2 * floor_bytes / cold_median(cpu_cells.copy_step(floor_bytes), flush, args.runs) / 1e9
    rows = []
    for spec in args.ops.split(","):
        op, _, kind = spec.partition(":")
        kind = kind or "-"
        for mode in args.modes.split(","):
            for dt in args.dtypes.split(","):
                step, nbytes = step_and_bytes(op, kind, mode, n, d, getattr(torch, dt))
                with torch.set_grad_enabled(mode != "fwd"):
                    t = cold_median(step, flush, args.runs)
                rows.append({"op": op, "kind": kind, "dtype": dt, "mode": mode, "ms": t * 1e3,
                             "gbps": nbytes / t / 1e9, "of_floor": nbytes / t / 1e9 / floor})
                note = ""
                if args.warm_rows:
                    a = arithmetic_seconds(op, kind, mode, n, d, getattr(torch, dt), args.warm_rows)
                    rows[-1] |= {"arith_ms": a * 1e3, "arith_bound": nbytes / a / 1e9 / floor if a else None}
                    note = f"; arithmetic {a * 1e3:.2f} ms, bound {rows[-1]['arith_bound'] or 0:.2f} of the floor"
                print(f"{op} {kind} {dt} {mode}: {t * 1e3:.2f} ms, {rows[-1]['of_floor']:.2f} of the floor{note}",
                      flush=True)
    cond = cpu_cells.conditions("tuned") | {
        "shape": args.shape, "runs": args.runs, "floor_gbps": floor, "warm_rows": args.warm_rows,
        "timing": "median of runs, each call after a read-only pass over 1 GiB; the floor: torch copy_ of "
                  f"{floor_bytes >> 20} MiB timed the same way (bytes read + written)"}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / f"cold_{args.tag}.json", json.dumps({"conditions": cond, "rows": rows}, indent=1))
    warm = bool(args.warm_rows)
    md = ["| op | norm | dtype | mode | ms | of floor |" + (" arithmetic ms | arith bound |" if warm else ""),
          "|---|---|---|---|---|---|" + ("---|---|" if warm else "")]
    md += [f"| {r['op']} | {r['kind']} | {r['dtype']} | {r['mode']} | {r['ms']:.2f} | {r['of_floor']:.2f} |"
           + (f" {r['arith_ms']:.2f} | {r['arith_bound'] or 0:.2f} |" if warm else "") for r in rows]
    atomic_write_text(out / f"cold_{args.tag}.md", "\n".join(md) + "\n")
    print(f"floor {floor:.1f} GB/s; results: {out / f'cold_{args.tag}.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
