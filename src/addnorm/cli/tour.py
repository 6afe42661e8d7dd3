"""`addnorm tour`: the main job -- every demonstration of the seeds, measured, written as a report."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from ..experiments.walkthrough import WalkthroughConfig, run_walkthrough
from .output import console as make_console
from .output import add_out, error


def add_arguments(p) -> None:
    p.add_argument("--seed", type=int, default=0, help="random seed (default %(default)s)")
    p.add_argument("--depth", type=int, default=48, help="blocks in the gradient-flow stacks (default %(default)s)")
    add_out(p, "tour", "report directory")


def print_walkthrough(w, console: Console) -> None:
    console.rule("[bold]Add & Norm on one real tensor")
    c = w.config
    console.print(f"sentence {escape(repr(c.text))} -> {len(w.tokens)} positions x d_model={c.d_model}; "
                  f"F = causal self-attention ({c.n_head} heads); norm = LayerNorm(eps={c.eps}) "
                  f"on the [bold]{w.backend}[/bold] backend")
    table = Table(show_header=True, header_style="bold")
    table.add_column("position")
    for s in w.stages:
        table.add_column(f"{s.name}\nmean / std", justify="right")
    for i, tok in enumerate(w.tokens):
        table.add_row(f"{i} {tok}", *[f"{s.mean[i]:+.4f} / {s.std[i]:.4f}" for s in w.stages])
    console.print(table)
    last = w.stages[-1]
    console.print(f"after the norm every position has mean within {max(abs(m) for m in last.mean):.1e} of 0 "
                  f"and std within {max(abs(s - 1) for s in last.std):.1e} of 1 (eps keeps it just below 1)")


def run(args) -> int:
    from ..harness.store import check_writable_dir
    from ..experiments.tour import run_tour

    # checked before any work: the gradient-flow section compares block 1 with the last
    problem = None
    if args.depth < 2:
        problem = f"--depth must be >= 2 (the report compares block 1 with the last block), got {args.depth}"
    elif args.seed < 0:
        problem = f"--seed must be >= 0, got {args.seed}"
    else:
        try:
            check_writable_dir(Path(args.out))
        except OSError as e:
            problem = f"--out: {e}"
    if problem:
        return error("tour", problem)
    console = make_console()
    print_walkthrough(run_walkthrough(WalkthroughConfig(seed=42 + args.seed)), console)
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console) as progress:
        res = run_tour(Path(args.out), seed=args.seed, depth=args.depth, progress=progress)
    d = res["data"]
    console.rule("[bold]Measured")
    flow = {r["placement"]: r for r in d["gradient_flow"]["placements"]}
    console.print(f"‖∂loss/∂stream‖, block 1 ÷ last of {d['gradient_flow']['depth']} blocks: " +
                  ", ".join(f"{p} {r['grad_second_over_last']:.3g}" for p, r in flow.items()))
    bn = d["batchnorm"]
    console.print(f"one token's output when the rest of the batch changes: LayerNorm "
                  f"{bn['composition']['layer_batch_a_vs_batch_b_max_diff']:.1e}, BatchNorm "
                  f"{bn['composition']['batch_batch_a_vs_batch_b_max_diff']:.3f}")
    t = d["training"]
    console.print(f"training ({t['depth']} layers, {t['steps']} steps), final validation loss: " + ", ".join(
        f"{r['placement']} warmup {r['warmup']} " + (f"{r['failure']} at step {r['steps_done']}" if r["failed"]
                                                     else f"{r['final_val_loss']:.3f}") for r in t["runs"]))
    b = d["block"]
    console.print(f"transformer block (512, 8 heads): {b['block_parameters']:,} parameters, shape preserved: "
                  f"{b['shape_preserved']}; seed 002's attention sub-layer: {b['attention_sublayer_parameters']:,}")
    console.print(f"report: [bold]{escape(str(res['index']))}[/bold] ({len(res['shown'])} numbers, also in tour.json), "
                  f"{d['meta']['seconds']:.0f} s")
    return 0
