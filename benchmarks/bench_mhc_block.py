"""One transformer block at GPT-2-small width (768 wide, 12 heads, n = 4 streams), a training step of it
(forward, backward), for pre-norm and the widened-stream forms -- with addnorm's kernels and with every
addnorm op as torch ops (``use_backend("torch")``) -- timed interleaved in one process, so the ratios to
pre are side by side and a drifting machine favours none.

    python benchmarks/bench_mhc_block.py [--tokens 512] [--budget 3] [--upstream loss|gradient]
                                         [--allocator current|tuned]

A block isolates what the stream form adds (the n x C stream read and written around each sub-layer, the
coefficients) from what every form shares (the embeddings, the vocabulary projection) -- a whole-model step
dilutes it. The backward starts from ``--upstream``: ``loss`` (the default) differentiates y.square().mean() of
the block's output, which for a widened form is n times pre's (B, T, n, C) and costs the loss and its backward n
times over -- a cost a model pays once, after the streams are summed, not per block; ``gradient`` hands the block a
fixed gradient of its output's shape (what the next block would give it), so that only the block is timed.
``--allocator tuned`` runs the timing in a process whose glibc keeps freed memory (``addnorm bench``'s setting):
under the defaults a step's large tensors (the widened stream's are n times pre's) can come back as fresh pages,
faulted in and zeroed by the OS, a cost that lands on the wider forms most.
Results: benchmarks/results/mhc_block.json (mhc_block_gradient.json with ``--upstream gradient``; ``_tuned`` before
``.json`` with ``--allocator tuned``).
"""

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import torch

import addnorm
from addnorm.bench.cpu_cells import TUNED_MALLOC, conditions
from addnorm.harness.timing import measure_interleaved
from addnorm.model import GPTConfig
from addnorm.model.block import TransformerBlock
from addnorm.harness.store import atomic_write_text

FORMS = ("pre", "hc", "mhc", "mhc_lite", "mhc_sk1")  # mhc_sk1: mHC with one Sinkhorn iteration (what 19 cost)


def step_fn(form: str, backend: str, tokens: int, upstream: str = "loss"):
    torch.manual_seed(0)
    extra = {"sinkhorn_iters": 1} if form == "mhc_sk1" else {}
    placement = "mhc" if form == "mhc_sk1" else form
    cfg = GPTConfig(placement=placement, n_streams=4 if form != "pre" else None, **extra)
    block = TransformerBlock(cfg, layer_idx=1)
    n = cfg.streams
    seq = 128
    shape = (tokens // seq, seq) + ((n,) if form != "pre" else ()) + (cfg.n_embd,)
    x = torch.randn(shape, requires_grad=True)
    dy = torch.randn(shape) / shape[-1] ** 0.5  # the output's gradient (--upstream gradient)
    params = [x, *block.parameters()]

    def step():
        with addnorm.use_backend(backend):
            y = block(x)
            if upstream == "loss":
                torch.autograd.grad(y.square().mean(), params)
            else:
                torch.autograd.grad(y, params, dy)

    return step


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens", type=int, default=512)
    p.add_argument("--budget", type=float, default=3.0, help="seconds of timing per method (default 3)")
    p.add_argument("--upstream", choices=("loss", "gradient"), default="loss",
                   help="what the backward starts from: y.square().mean() of the block's output (default), or a fixed "
                        "gradient of the output's shape (the block alone)")
    p.add_argument("--allocator", choices=("current", "tuned"), default="current",
                   help="glibc as this process found it (default), or told to keep freed memory (addnorm bench's "
                        "--allocator tuned)")
    p.add_argument("--out", default="benchmarks/results")
    args = p.parse_args(argv)
    if args.allocator == "tuned" and any(os.environ.get(k) != v for k, v in TUNED_MALLOC.items()):
        # glibc reads these once, at start-up: the timing runs in a process started with them
        return subprocess.call([sys.executable, __file__, *(sys.argv[1:] if argv is None else argv)],
                               env=dict(os.environ, **TUNED_MALLOC))
    if args.tokens < 128 or args.tokens % 128:
        p.error(f"--tokens must be a positive multiple of 128, got {args.tokens}")
    steps = {f"{f}@{b}": step_fn(f, b, args.tokens, args.upstream) for b in ("auto", "torch") for f in FORMS}
    t = measure_interleaved(steps, min_runs=10, budget_s=args.budget, block=2)
    rows = {k: {"median_ms": v.median_s * 1e3, "p10_ms": v.p10_s * 1e3, "p90_ms": v.p90_s * 1e3, "runs": v.runs}
            for k, v in t.items()}
    lines = [f"one block, GPT-2-small width, {args.tokens} tokens, n = 4, forward + backward "
             f"({'from y.square().mean()' if args.upstream == 'loss' else 'from a given output gradient'}), "
             f"{torch.get_num_threads()} threads, interleaved"
             f"{', glibc keeping freed memory' if args.allocator == 'tuned' else ''}", "",
             "| form | kernels (ms) | / pre | torch ops (ms) | / pre@torch |", "|---|---|---|---|---|"]
    for f in FORMS:
        a, b = rows[f"{f}@auto"], rows[f"{f}@torch"]
        lines.append(f"| {f} | {a['median_ms']:.1f} ({a['p10_ms']:.1f}–{a['p90_ms']:.1f}) | "
                     f"{a['median_ms'] / rows['pre@auto']['median_ms']:.3f} | {b['median_ms']:.1f} "
                     f"({b['p10_ms']:.1f}–{b['p90_ms']:.1f}) | {b['median_ms'] / rows['pre@torch']['median_ms']:.3f} |")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    name = ("mhc_block" if args.upstream == "loss" else "mhc_block_gradient") + (
        "_tuned" if args.allocator == "tuned" else "") + ".json"
    # what glibc ran under: "tuned" where its settings came with the environment too
    alloc = "tuned" if all(os.environ.get(k) == v for k, v in TUNED_MALLOC.items()) else "current"
    atomic_write_text(out / name, json.dumps({"conditions": conditions(alloc), "tokens": args.tokens,
                                              "upstream": args.upstream, "rows": rows, "table": lines}, indent=1))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
