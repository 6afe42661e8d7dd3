"""What Attention Residuals cost per step against pre-norm, beside the paper's figures.

The paper (Kimi Team 2026, arXiv:2603.15031) reports Block AttnRes at under 4 % end-to-end training overhead (with
pipeline parallelism; negligible without) and under 2 % inference latency, at Kimi Linear's scale. This measures
addnorm's GPT at GPT-2-small width by default: a training step (forward, backward, AdamW) and an inference forward
of each form, the forms timed side by side in one process (``harness.timing.measure_interleaved``: rounds of a few
calls of each in turn, the starting one rotating), the whole repeated ``--repeats`` times. Forms:

    pre                 the baseline
    attn_res            Full AttnRes (every earlier sub-layer output a source)
    attn_res_block      Block AttnRes, S = --block sub-layers per block (default: the paper's ~8 blocks)
    <form>@torch        the same with use_backend("torch"): the depth mix as torch ops rather than the fused kernel
                        (compare with pre@torch, which runs pre's norms as torch ops too)

    python benchmarks/bench_attn_res.py                         # writes benchmarks/results/attn_res_cost.json
    python benchmarks/bench_attn_res.py --n-layer 2 --n-embd 32 --n-head 2 --batch 1 --seq 8 --repeats 1 \\
        --min-runs 2 --budget-s 0 --out /tmp/smoke.json       # a smoke run
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import sys
from pathlib import Path

import torch

from addnorm import use_backend
from addnorm.harness.store import atomic_write_text
from addnorm.harness.timing import measure_interleaved
from addnorm.model import GPT, GPTConfig

OUT = Path(__file__).resolve().parent / "results" / "attn_res_cost.json"
PAPER = {"training_overhead_below": 0.04, "inference_overhead_below": 0.02,
         "what": "Block AttnRes in Kimi Linear (48B total / 3B active): end-to-end training overhead under 4 % with "
                 "pipeline parallelism (negligible without), inference latency under 2 % on typical workloads "
                 "(arXiv:2603.15031)"}
FORMS = ("pre", "attn_res", "attn_res_block", "pre@torch", "attn_res@torch", "attn_res_block@torch")


def paper_block_size(n_layer: int) -> int:
    """S for about 8 blocks over the 2 n_layer sub-layers (the paper: N ~ 8 recovers most of Full AttnRes)."""
    return max(1, math.ceil(2 * n_layer / 8))


def form_config(form: str, base: dict, block: int) -> GPTConfig:
    name = form.split("@")[0]
    extra = {"pre": {}, "attn_res": {"placement": "attn_res"},
             "attn_res_block": {"placement": "attn_res", "attn_res_block": block}}[name]
    return GPTConfig(**base, **extra)


class _Form:
    """One model with its optimizer and batch: ``train()`` one step, ``infer()`` one forward."""

    def __init__(self, form: str, cfg: GPTConfig, idx: torch.Tensor):
        torch.manual_seed(0)
        self.backend = form.partition("@")[2] or None
        self.model = GPT(cfg)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-4)
        self.idx = idx

    def _ctx(self):
        return use_backend(self.backend) if self.backend else contextlib.nullcontext()

    def train(self):
        self.model.train()
        with self._ctx():
            self.opt.zero_grad(set_to_none=True)
            _, loss = self.model(self.idx, self.idx)
            loss.backward()
            self.opt.step()

    @torch.no_grad()
    def infer(self):
        self.model.eval()
        with self._ctx():
            self.model(self.idx)


def run(args) -> dict:
    base = dict(vocab_size=args.vocab, block_size=args.seq, n_layer=args.n_layer, n_head=args.n_head,
                n_embd=args.n_embd)
    block = args.block or paper_block_size(args.n_layer)
    idx = torch.randint(0, args.vocab, (args.batch, args.seq), generator=torch.Generator().manual_seed(0))
    forms = {f: _Form(f, form_config(f, base, block), idx) for f in args.forms}
    timing = dict(min_runs=args.min_runs, max_runs=max(args.min_runs, args.max_runs), budget_s=args.budget_s,
                  block=args.calls)
    out = {f: {"params": forms[f].model.num_parameters(), "train_step_s": [], "infer_s": []} for f in forms}
    for _ in range(args.repeats):  # each repeat times every form side by side, training then inference
        for kind, attr in (("train_step_s", "train"), ("infer_s", "infer")):
            t = measure_interleaved({f: getattr(m, attr) for f, m in forms.items()}, **timing)
            for f in forms:
                out[f][kind].append({"median": t[f].median_s, "p10": t[f].p10_s, "p90": t[f].p90_s,
                                     "runs": t[f].runs})
    for f, r in out.items():  # each against pre on the same backend, repeat by repeat
        b = "pre@torch" if f.endswith("@torch") and "pre@torch" in out else "pre"
        if b in out:
            for kind in ("train_step", "infer"):
                r[f"{kind}_vs_pre"] = [x["median"] / y["median"] for x, y in zip(r[f"{kind}_s"], out[b][f"{kind}_s"])]
    settings = {k: getattr(args, k) for k in ("n_layer", "n_embd", "n_head", "vocab", "batch", "seq", "repeats",
                                              "min_runs", "max_runs", "budget_s", "calls")} | {"block": block}
    return {"settings": settings, "threads": torch.get_num_threads(), "torch": torch.__version__,
            "cpu_kernels": __import__("addnorm").cpu_kernel_availability().isa, "paper": PAPER, "forms": out}


def table(result: dict) -> str:
    """Per form: the mean over repeats of the median step, its range, and the ratio to pre."""
    s = result["settings"]
    lines = [f"{s['n_layer']} x {s['n_embd']}, batch {s['batch']} x {s['seq']}, {result['threads']} threads; Block "
             f"AttnRes S = {s['block']}; {s['repeats']} repeats of interleaved timing (range over repeats)", "",
             "| form | train step (ms) | train / pre | inference (ms) | inference / pre |", "|---|---|---|---|---|"]
    for f, r in result["forms"].items():
        cells = []
        for kind in ("train_step", "infer"):
            ms = [x["median"] * 1e3 for x in r[f"{kind}_s"]]
            ratio = r.get(f"{kind}_vs_pre")
            cells.append(f"{sum(ms) / len(ms):.1f} ({min(ms):.1f}–{max(ms):.1f})")
            cells.append(f"{sum(ratio) / len(ratio):.3f}" if ratio else "—")
        lines.append(f"| {f} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python benchmarks/bench_attn_res.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--n-layer", type=int, default=12)
    p.add_argument("--n-embd", type=int, default=768)
    p.add_argument("--n-head", type=int, default=12)
    p.add_argument("--vocab", type=int, default=50257)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--block", type=int, default=None, help="Block AttnRes's S (default: ceil(2 n_layer / 8))")
    p.add_argument("--forms", default=",".join(FORMS), help="comma-separated, from: " + ", ".join(FORMS))
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--min-runs", type=int, default=10, help="timed calls of each form per repeat, at least")
    p.add_argument("--max-runs", type=int, default=200)
    p.add_argument("--budget-s", type=float, default=20.0, help="seconds per form per repeat, at least")
    p.add_argument("--calls", type=int, default=2, help="calls of a form in a row before the next form's")
    p.add_argument("--out", default=str(OUT))
    args = p.parse_args(argv)
    for name in ("n_layer", "n_embd", "n_head", "vocab", "batch", "seq", "repeats", "min_runs", "max_runs", "calls"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.block is not None and args.block < 1:
        p.error(f"--block must be >= 1, got {args.block}")
    if not (args.budget_s >= 0 and math.isfinite(args.budget_s)):
        p.error(f"--budget-s must be a finite number >= 0, got {args.budget_s}")
    args.forms = [f for f in dict.fromkeys(args.forms.split(",")) if f]
    bad = [f for f in args.forms if f not in FORMS]
    if bad or not args.forms:
        p.error(f"--forms: unknown {bad or 'empty'}; valid: {', '.join(FORMS)}")
    result = run(args)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out, json.dumps(result, indent=1))
    print(table(result))
    print(f"written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
