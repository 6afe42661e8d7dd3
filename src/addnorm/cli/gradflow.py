"""`addnorm gradflow`: measured gradient flow and activation statistics through deep stacks."""

from __future__ import annotations

from pathlib import Path

from rich.markdown import Markdown
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from ..experiments.gradflow import DEFAULT_PLACEMENTS, ConfigError, GradflowConfig, run_gradflow
from ..harness.corpus import load_corpus
from ..harness.store import check_writable_dir
from .output import console as make_console
from .output import add_out, error

# the option that sets each configuration field
FLAGS = {"placements": "--placements", "depth": "--depth", "d_model": "--d-model", "n_head": "--heads",
         "seq_len": "--seq-len", "batch": "--batch", "norm": "--norm", "steps": "--steps", "lr": "--lr",
         "seed": "--seed", "data": "--data",
         "n_streams": "--n-streams"}


def add_arguments(p) -> None:
    p.add_argument("--placements", default=",".join(DEFAULT_PLACEMENTS), help="comma separated (default %(default)s)")
    p.add_argument("--depth", type=int, default=GradflowConfig.depth, help="blocks per stack (default %(default)s)")
    p.add_argument("--d-model", type=int, default=GradflowConfig.d_model, help="model width")
    p.add_argument("--heads", type=int, default=GradflowConfig.n_head, help="attention heads")
    p.add_argument("--seq-len", type=int, default=GradflowConfig.seq_len,
                   help="tokens per sequence, at most the model's context (1024)")
    p.add_argument("--batch", type=int, default=GradflowConfig.batch, help="sequences per batch")
    p.add_argument("--norm", default=GradflowConfig.norm, choices=["layer", "rms", "dyt", "derf"], help="norm kind")
    p.add_argument("--n-streams", type=int, default=None,
                   help="width of the widened stream of hc, mhc, mhc_lite (default 4)")
    p.add_argument("--value-residual", action="store_true", help="ResFormer's value residual in every placement")
    p.add_argument("--steps", type=int, default=0, help="also record the first N training steps (default 0)")
    p.add_argument("--lr", type=float, default=GradflowConfig.lr, help="AdamW learning rate for --steps")
    p.add_argument("--seed", type=int, default=0, help="random seed")
    p.add_argument("--data", default=None, help="a text file or folder (default: the Python standard library)")
    add_out(p, "gradflow", "results directory")


def _error(msg: str) -> int:
    return error("gradflow", msg)


def run(args) -> int:
    """Every argument checked before any work: a one-line error naming the option, exit 2."""
    placements = tuple(dict.fromkeys(p for p in args.placements.split(",") if p))  # each once, in order
    try:
        cfg = GradflowConfig(placements=placements, depth=args.depth,
                             d_model=args.d_model, n_head=args.heads, seq_len=args.seq_len, batch=args.batch,
                             norm=args.norm, steps=args.steps, lr=args.lr, seed=args.seed, data=args.data,
                             n_streams=args.n_streams, value_residual=args.value_residual)
    except ConfigError as e:
        return _error(f"{FLAGS.get(e.field, e.field)} {e.message}")
    try:
        corpus = load_corpus(cfg.data)
        if len(corpus.data) <= cfg.seq_len + 1:
            return _error(f"--seq-len {cfg.seq_len} is longer than the data ({len(corpus.data)} bytes)")
    except (OSError, ValueError) as e:
        return _error(f"--data: {e}")
    try:
        check_writable_dir(Path(args.out))
    except OSError as e:
        return _error(f"--out: {e}")
    console = make_console()
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console) as progress:
        summary = run_gradflow(cfg, Path(args.out), progress)
    if summary["reused"]:
        console.print(f"reused finished runs: {', '.join(summary['reused'])}", markup=False)
    console.print(Markdown((Path(args.out) / "summary.md").read_text(encoding="utf-8")))
    console.print(f"figures and data in {escape(args.out)}/: {', '.join(summary['figures'])}")
    return 0
