"""`addnorm tour`: the main job -- the Add & Norm walk-through of a real tensor."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from ..experiments.walkthrough import WalkthroughConfig, run_walkthrough


def add_parser(sub) -> None:
    p = sub.add_parser("tour", help="walk through Add & Norm on real tensors")
    p.add_argument("--seed", type=int, default=WalkthroughConfig.seed, help="random seed (default %(default)s)")
    p.add_argument("--text", default=WalkthroughConfig.text, help="sentence to embed (default %(default)r)")


def print_walkthrough(w, console: Console) -> None:
    console.rule("[bold]Add & Norm on one real tensor")
    c = w.config
    console.print(f"sentence {c.text!r} -> {len(w.tokens)} positions x d_model={c.d_model}; "
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
    console = Console()
    w = run_walkthrough(WalkthroughConfig(text=args.text, seed=args.seed))
    print_walkthrough(w, console)
    return 0
