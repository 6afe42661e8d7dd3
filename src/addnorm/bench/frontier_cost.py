"""What each frontier form costs at GPT-2-small width: parameters, residual-stream bytes per token, and a
measured training step (forward, backward, AdamW step, and nGPT's renormalization) with its peak memory,
each against ``"pre"``.

Every form runs in its own child process so that its peak resident memory (``ru_maxrss``) is its own;
every form runs once per round, the rounds in alternating order, so the table shows the spread and a
drifting machine favours no form. Each finished run is written to the results file at once, and a re-run
with the same settings reuses it.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import torch

from ..harness.store import atomic_write_text, read_json
from .cpu_cells import TUNED_MALLOC
from ..harness.timing import measure

N_STREAMS = 4
# form -> GPTConfig overrides (GPT-2-small otherwise: 12 layers, 768 wide, 12 heads, GPT-2's vocabulary)
FORMS = {
    "pre": {},
    "lns": {"placement": "lns"},
    "denseformer": {"placement": "denseformer"},
    "hybrid": {"placement": "hybrid"},
    "ngpt": {"placement": "ngpt"},
    "hc": {"placement": "hc", "n_streams": N_STREAMS},
    "mhc": {"placement": "mhc", "n_streams": N_STREAMS},
    "mhc_lite": {"placement": "mhc_lite", "n_streams": N_STREAMS},
    "pre+value_residual": {"value_residual": True},
    "pre+derf": {"norm": "derf"},
    "pre+dyt_llama7b": {"norm": "dyt", "dyt_alpha": (0.8, 0.2, 0.2)},  # DyT's LLaMA 7B alphas per slot
}


def stream_bytes_per_token(cfg, dtype_bytes: int = 4) -> int:
    """What the residual stream holds per token between sub-layers: n*C values for a widened stream;
    for DenseFormer every block output so far (L+1 of them by the last block)."""
    c = cfg.n_embd * dtype_bytes
    if cfg.placements()[0].dense:
        return (cfg.n_layer + 1) * c
    return cfg.streams * c


def _split(form: str) -> tuple[str, str]:
    """"mhc@torch" -> ("mhc", "torch"): a form run on one backend (default: "auto", the kernels)."""
    name, _, backend = form.partition("@")
    return name, backend or "auto"


def valid_form(form: str) -> bool:
    name, backend = _split(form)
    return name in FORMS and backend in ("auto", "torch")


def one_form(form: str, batch: int, seq: int, steps: int) -> dict:
    from .. import use_backend

    name, backend = _split(form)
    with use_backend(backend):  # "@torch": every addnorm op as torch ops -- the eager baseline of the same model
        out = _one_form(name, batch, seq, steps)
    return out | {"form": form, "backend": backend}


def _one_form(form: str, batch: int, seq: int, steps: int) -> dict:
    from ..model import GPT, GPTConfig

    torch.manual_seed(0)
    cfg = GPTConfig(**FORMS[form])
    model = GPT(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    idx = torch.randint(0, cfg.vocab_size, (batch, seq), generator=torch.Generator().manual_seed(0))
    rss_model = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

    def step():
        opt.zero_grad(set_to_none=True)
        _, loss = model(idx, idx)
        loss.backward()
        opt.step()
        model.normalize_()  # nGPT's weights back on the sphere; nothing for the other forms
        return loss

    loss = step().item()
    t = measure(step, min_runs=steps, max_runs=steps, budget_s=0.0, warmup=1)
    return {"form": form, "median_s": t.median_s, "p10_s": t.p10_s, "p90_s": t.p90_s, "runs": t.runs,
            "loss": loss, "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "rss_after_build_mb": rss_model, "params": model.num_parameters(),
            "stream_bytes_per_token": stream_bytes_per_token(cfg), "tokens": batch * seq,
            "threads": torch.get_num_threads()}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python benchmarks/bench_frontier_cost.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--rounds", type=int, default=2, help="every form runs once per round (default 2)")
    p.add_argument("--forms", default=",".join(FORMS),
                   help="comma-separated, from: " + ", ".join(FORMS) + "; a form ending in @torch runs with "
                        "use_backend('torch') (no kernels: the eager baseline of the same model)")
    p.add_argument("--out", default="benchmarks/results")
    p.add_argument("--one", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    for name, v, hi in (("--batch", args.batch, None), ("--seq", args.seq, 1024), ("--steps", args.steps, None),
                         ("--rounds", args.rounds, None)):
        if v < 1 or (hi is not None and v > hi):
            p.error(f"{name} must be an integer in [1, {hi}], got {v}" if hi else f"{name} must be >= 1, got {v}")
    forms = [f for f in dict.fromkeys(args.forms.split(",")) if f]
    bad = [f for f in forms if not valid_form(f)]
    if bad or not forms:
        p.error(f"--forms: unknown {bad or 'empty'}; valid: {', '.join(FORMS)}")
    if args.one:
        print(json.dumps(one_form(args.one, args.batch, args.seq, args.steps)))
        return 0
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "frontier_cost.json"
    settings = {"batch": args.batch, "seq": args.seq, "steps": args.steps, "rounds": args.rounds}
    old, why = read_json(path)
    if why:
        print(why)
    done = old["runs"] if old and old.get("settings") == settings else {}
    # rounds alternate direction, so a machine that drifts over the run biases no form
    order = []
    for r in range(args.rounds):
        keys = forms if r % 2 == 0 else forms[::-1]
        order += [f"{f}#{r}" for f in keys]
    env = dict(os.environ, **TUNED_MALLOC)
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()) as pr:
        task = pr.add_task("frontier cost", total=len(order))
        for key in order:
            if key not in done:
                pr.update(task, description=f"frontier cost: {key}")
                res = subprocess.run([sys.executable, "-m", "addnorm.bench.frontier_cost", "--one",
                                      key.split("#")[0], "--batch", str(args.batch), "--seq", str(args.seq),
                                      "--steps", str(args.steps)],
                                     env=env, check=True, capture_output=True, text=True).stdout
                done[key] = json.loads(res.strip().splitlines()[-1])
                atomic_write_text(path, json.dumps({"settings": settings, "runs": done}, indent=1))
            pr.advance(task)
    print(table({"settings": settings, "runs": done}))
    return 0


def table(result: dict) -> str:
    """The markdown table of a results file: per form, the mean over rounds of each run's median step and
    its peak RSS, against pre's."""
    forms: dict[str, list[dict]] = {}
    for key, r in result["runs"].items():
        forms.setdefault(key.split("#")[0], []).append(r)
    mean = lambda rs, k: sum(r[k] for r in rs) / len(rs)  # noqa: E731
    s = result["settings"]
    pre = forms["pre"][0]

    def base(f):  # each form against pre on the same backend
        b = forms.get("pre@torch" if f.endswith("@torch") else "pre", forms["pre"])
        return mean(b, "median_s"), mean(b, "peak_rss_mb")

    lines = [f"GPT-2-small width (12 x 768, 12 heads), batch {s['batch']} x {s['seq']} tokens, AdamW, "
             f"{pre['threads']} threads; each form in its own process, median of {s['steps']} steps after one "
             f"warm-up, {s['rounds']} rounds in alternating order (the spread is the rounds' range); a form "
             "marked @torch ran with use_backend('torch') (addnorm's ops as torch ops, no kernels) and is "
             "compared with pre@torch",
             "",
             "| form | parameters | stream bytes / token | step (ms) | step / pre | peak RSS (MB) | peak − pre (MB) |",
             "|---|---|---|---|---|---|---|"]
    for f, rs in forms.items():
        base_t, base_m = base(f)
        ts = [r["median_s"] * 1e3 for r in rs]
        lines.append(f"| {f} | {rs[0]['params'] / 1e6:.3f} M | {rs[0]['stream_bytes_per_token']:,} | "
                     f"{mean(rs, 'median_s') * 1e3:.0f} ({min(ts):.0f}–{max(ts):.0f}) | "
                     f"{mean(rs, 'median_s') / base_t:.3f} | {mean(rs, 'peak_rss_mb'):.0f} | "
                     f"{mean(rs, 'peak_rss_mb') - base_m:+.0f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
