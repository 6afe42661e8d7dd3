"""Where the time of a small call goes (64 x 768 float32, the size of one decode step): the fused forms'
C kernel alone, the host call around it, the public function (validation and the backend decision), and a
training step of the unit (forward + autograd.grad), beside eager PyTorch doing the same. The public
function's rows are timed twice: on the C++ autograd nodes and entries (``kernels/cpu/autograd_nodes.cpp``,
the default where they are built), and on the Python path they replace ("python path" rows: the Python
autograd nodes, and the Python host calls for inference).

    python benchmarks/bench_fused_overhead.py [--threads 2]

Each layer's cost is the difference to the one inside it. Every method is timed interleaved with the others
(``measure_interleaved``: medians, p10-p90); results go to benchmarks/results/fused_overhead.{json,md}.
"""

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

import addnorm
import addnorm.functional.norm as A
import addnorm.functional.fused as B
from addnorm.bench.cpu_cells import conditions
from addnorm.harness.timing import measure_interleaved
from addnorm.kernels.cpu import fused as host
from addnorm.kernels.cpu import mhc as mhc_host
from addnorm.ops.mhc import formulas as mhc_formulas
from addnorm.ops.native_nodes import NODES
from addnorm.kernels.cpu.library import library
from addnorm.harness.store import atomic_write_text
from addnorm.kernels.cpu.norm import num_threads as _num_threads

N, D = 64, 768


def _cases():
    g = torch.Generator().manual_seed(0)
    x, x2, r, up = (torch.randn(N, D, generator=g) for _ in range(4))
    w, b, w2, b2 = (torch.randn(D, generator=g) for _ in range(4))
    out, stats = torch.empty(N, D), torch.empty(2, N)
    y2, s = torch.empty(N, D), torch.empty(N, D)
    lib = library()
    ptr = torch.Tensor.data_ptr
    na_args = (0, 0, 0, 0, 0, 0, 0, 0, 0, 0, N, D, ptr(x), D, None, 0, None, 0, ptr(r), D, ptr(w), ptr(b), None, None,
               0, 0.0, 1e-5, ptr(out), D, None, 0, None, 0, None, None, _num_threads())
    par_args = (0, 0, 0, 0, 0, 0, 0, 0, 0, 0, N, D, ptr(r), D, ptr(x), D, ptr(x2), D, None, 0, ptr(w), ptr(b),
                ptr(w2), ptr(b2), 0, 0.0, 1e-5, ptr(out), D, ptr(y2), D, ptr(s), D, None, None, _num_threads())
    xg, x2g, rg, wg, bg, w2g, b2g = (t.clone().requires_grad_() for t in (x, x2, r, w, b, w2, b2))

    def eager_na(x, r, w, b):
        return r + F.layer_norm(x, (D,), w, b)

    def eager_par(x, x2, r, w, b, w2, b2):
        s = x2 + x + r
        return F.layer_norm(s, (D,), w, b), F.layer_norm(s, (D,), w2, b2), s

    def step(fn, ins, n_out):
        outs = fn(*ins)
        outs = outs if isinstance(outs, tuple) else (outs,)
        torch.autograd.grad(outs[:n_out], [t for t in ins if t is not None], [up] * n_out)

    # mHC's pre step at n = 4 (64 tokens of a 4 x 768 stream): the C kernel is mostly its 64 x 3072 x 24 projection
    X = torch.randn(N, 4, D, generator=g)
    phi = torch.randn(4 * D, 24, generator=g) / (4 * D) ** 0.5
    coeffs = (torch.tensor(0.01), torch.tensor(0.01), torch.tensor(0.01), torch.zeros(4), torch.zeros(4),
              torch.zeros(4, 4))
    scal, bias = torch.tensor([0.01] * 3), torch.zeros(24)
    Xg, phig = X.clone().requires_grad_(), phi.clone().requires_grad_()
    cg = [c.clone().requires_grad_() for c in coeffs]
    mhc_ups = [torch.randn(N, D, generator=g), torch.randn(N, 4, generator=g), torch.randn(N, 4, 4, generator=g)]

    def mhc_step(fn):  # what a block differentiates: h (the branch input), H_post and H_res (the write)
        h, _, hpo, hr = fn(Xg, phig, *cg)[:4]
        torch.autograd.grad((h, hpo, hr), [Xg, phig, *cg], mhc_ups)

    def python_nodes(fn):  # the same call with the C++ nodes switched off
        def run():
            A._NODES = B._NODES = None
            try:
                return fn()
            finally:
                A._NODES = B._NODES = NODES

        return run

    def eager_an(x, r, w, b):
        s = x + r
        return F.layer_norm(s, (D,), w, b), s

    an = {
        "add_layer_norm (inference)": lambda: addnorm.add_layer_norm(x, r, D, w, b),
        "eager (inference)": lambda: eager_an(x, r, w, b),
        "add_layer_norm fwd+bwd": lambda: step(lambda *a: addnorm.add_layer_norm(a[0], a[1], D, *a[2:]),
                                                (xg, rg, wg, bg), 2),
        "eager fwd+bwd": lambda: step(eager_an, (xg, rg, wg, bg), 2),
    }
    cases = {
        "mhc_pre": {
            "host call (C kernel)": lambda: mhc_host.mhc_pre(X, phi, scal, bias, None, 1e-6, 20),
            "mhc_pre (inference)": lambda: addnorm.mhc_pre(X, phi, *coeffs),
            "eager (inference)": lambda: mhc_formulas.pre(X, phi, *coeffs, None, 1e-6, 20),
            "mhc_pre fwd+bwd": lambda: mhc_step(addnorm.mhc_pre),
            "eager fwd+bwd": lambda: mhc_step(lambda *a: mhc_formulas.pre(*a, None, 1e-6, 20)),
        },
        "norm_add": {
            "C kernel": lambda keep=(x, r, w, b, out): lib.fused_forward(*na_args),  # keep: the pointers' tensors
            "host call": lambda: host.norm_add_contiguous(x, r, w, b, "layer", 1e-5, 0.0, False, False),
            "layer_norm_add (inference)": lambda: addnorm.layer_norm_add(x, r, D, w, b),
            "eager (inference)": lambda: eager_na(x, r, w, b),
            "layer_norm_add fwd+bwd": lambda: step(lambda *a: addnorm.layer_norm_add(a[0], a[1], D, *a[2:]),
                                                    (xg, rg, wg, bg), 1),
            "eager fwd+bwd": lambda: step(eager_na, (xg, rg, wg, bg), 1),
        },
        "parallel2": {
            "C kernel": lambda keep=(x, x2, r, w, b, w2, b2, out, y2, s): lib.fused_forward(*par_args),
            "host call": lambda: host.parallel_contiguous(x, x2, r, w, b, w2, b2, "layer", 1e-5, 0.0, False, True,
                                                          False),
            "parallel_add_layer_norm (inference)": lambda: addnorm.parallel_add_layer_norm(x, x2, r, D, w, b, w2,
                                                                                           b2),
            "eager (inference)": lambda: eager_par(x, x2, r, w, b, w2, b2),
            "parallel_add_layer_norm fwd+bwd": lambda: step(
                lambda *a: addnorm.parallel_add_layer_norm(a[0], a[1], a[2], D, *a[3:]), (xg, x2g, rg, wg, bg, w2g,
                                                                                          b2g), 3),
            "eager fwd+bwd": lambda: step(eager_par, (xg, x2g, rg, wg, bg, w2g, b2g), 3),
        },
        "add_norm": an,
    }
    if NODES is not None:  # the public rows again, on the Python nodes, timed in the same interleaving
        for op in ("norm_add", "parallel2", "add_norm"):
            for name in [m for m in cases[op] if m.startswith(("layer_norm_add", "parallel_add", "add_layer"))]:
                cases[op][name.replace(" (", " python path (").replace(" fwd+bwd", " python path fwd+bwd")] = \
                    python_nodes(cases[op][name])
    return cases


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=torch.get_num_threads())
    p.add_argument("--out", default="benchmarks/results")
    args = p.parse_args(argv)
    if args.threads < 1:
        p.error(f"--threads must be >= 1, got {args.threads}")
    torch.set_num_threads(args.threads)
    results = {}
    lines = [f"64 x 768 float32 LayerNorm, {args.threads} threads: median µs (p10–p90)", "",
             "| op | layer | µs | p10–p90 |", "|---|---|---|---|"]
    for op, methods in _cases().items():
        t = measure_interleaved(methods, min_runs=200, budget_s=1.0)
        results[op] = {m: {"median_us": v.median_s * 1e6, "p10_us": v.p10_s * 1e6, "p90_us": v.p90_s * 1e6}
                       for m, v in t.items()}
        for m, v in results[op].items():
            lines.append(f"| {op} | {m} | {v['median_us']:.1f} | {v['p10_us']:.1f}–{v['p90_us']:.1f} |")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "fused_overhead.json", json.dumps({"conditions": conditions("current"),
                                                               "results": results}, indent=1))
    atomic_write_text(out / "fused_overhead.md", "\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
