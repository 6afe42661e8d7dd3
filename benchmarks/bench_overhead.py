"""Per-call cost at a small shape (64 x 768, where Python and autograd overhead is most of the time):
addnorm's eager fast path vs the same operator through PyTorch's dispatcher vs eager PyTorch.

    python benchmarks/bench_overhead.py [--threads 1]

The fast path calls the CPU implementation of ``addnorm::add_norm`` directly; ``torch.ops.addnorm.add_norm``
is what torch.compile, make_fx and export record -- the difference is what the fast path saves per call.
Methods are timed interleaved (``measure_interleaved``), medians with p10-p90. Writes
benchmarks/results/overhead.{csv,json}.
"""

import argparse
import csv
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

import addnorm
from addnorm.bench.cpu_cells import conditions
from addnorm.harness.timing import measure_interleaved

N, D = 64, 768


def methods(kind: str):
    g = torch.Generator().manual_seed(0)
    x, r, dy = (torch.randn(N, D, generator=g) for _ in range(3))
    w, b = torch.randn(D, generator=g), torch.randn(D, generator=g)
    xg, wg, bg = (t.clone().requires_grad_() for t in (x, w, b))
    eps = 1e-5
    bias = b if kind == "layer" else None
    bias_g = bg if kind == "layer" else None
    fused = addnorm.add_layer_norm if kind == "layer" else addnorm.add_rms_norm
    op = torch.ops.addnorm.add_norm

    def eager(x, w, b):
        s = x + r
        return F.layer_norm(s, (D,), w, b, eps) if kind == "layer" else F.rms_norm(s, (D,), w, eps)

    def step(fn, leaves):
        y = fn()
        torch.autograd.grad(y, leaves, dy)

    extra = (bias,) if kind == "layer" else ()
    extra_g = (bias_g,) if kind == "layer" else ()
    leaves = (xg, wg) + extra_g
    return {
        "inference": {
            "addnorm": lambda: fused(x, r, D, w, *extra, eps=eps),
            "operator": lambda: op(x, r, w, bias, kind, 1, eps, 0.0, False, None, False),
            "eager": lambda: eager(x, w, bias),
        },
        "fwdbwd": {
            "addnorm": lambda: step(lambda: fused(xg, r, D, wg, *extra_g, eps=eps)[0], leaves),
            "operator": lambda: step(lambda: op(xg, r, wg, bias_g, kind, 1, eps, 0.0, False, None, False)[0], leaves),
            "eager": lambda: step(lambda: eager(xg, wg, bias_g), leaves),
        },
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1: least noise)")
    p.add_argument("--out", default="benchmarks/results")
    args = p.parse_args()
    if args.threads < 1:
        raise SystemExit("--threads must be >= 1")
    torch.set_num_threads(args.threads)
    rows = []
    for kind in ("layer", "rms"):
        for mode, fns in methods(kind).items():
            for name, t in measure_interleaved(fns, min_runs=200, budget_s=1.5).items():
                rows.append({"kind": kind, "mode": mode, "method": name, "median_us": t.median_s * 1e6,
                             "p10_us": t.p10_s * 1e6, "p90_us": t.p90_s * 1e6, "runs": t.runs})
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with (out / "overhead.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    cond = conditions("current") | {"shape": [N, D], "dtype": "float32"}
    (out / "overhead.json").write_text(json.dumps({"conditions": cond, "rows": rows}, indent=1))
    for r in rows:
        print(f"{r['kind']:5s} {r['mode']:9s} {r['method']:8s} {r['median_us']:8.1f} us "
              f"(p10-p90 {r['p10_us']:.1f}-{r['p90_us']:.1f})")
    print(f"results: {out / 'overhead.csv'}  {out / 'overhead.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
