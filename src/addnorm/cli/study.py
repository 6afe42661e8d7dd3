"""`addnorm study`: train a grid of real models and measure what the seeds claim (see experiments/study)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from rich.markup import escape
from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn,
                           TimeRemainingColumn)

from ..experiments.study import confirm
from ..experiments.study.claims import run_rows
from ..experiments.study.config import PRESETS, Study, StudyConfigError, as_study
from ..experiments.study.data import TEST_BYTES, SplitError, load_split
from ..experiments.study import tensorboard
from ..experiments.study.grid import report_only, run_study
from ..harness.store import check_writable_dir
from ..model.placement import parse_placement
from .output import console as make_console
from .output import add_out, error
from .study_summary import print_summary, run_line

FLAGS = {"placement": "--placements", "norm": "--norms", "depth": "--depths", "lr": "--lrs", "warmup": "--warmups",
         "seed": "--seeds", "clip": "--clips", "init": "--inits", "steps": "--steps", "n_streams": "--n-streams",
         "value_residual": "--value-residual", "dyt_alpha": "--dyt-alpha", "d_model": "--d-model",
         "embed_scale": "--embed-scale"}


def add_arguments(p) -> None:
    p.add_argument("--preset", default="default", choices=sorted(PRESETS),
                   help="quick: <= 3 min on 2 cores; default: <= 25 min; dyt: ~10 min; paper, frontier, depth, long, "
                        "wide, mixing: hours (times and sharding in docs/study.md) (default %(default)s)")
    for axis in ("placements", "norms", "depths", "lrs", "warmups", "seeds", "clips", "inits"):
        extra = "; a+b+c gives one placement per layer" if axis == "placements" else ""
        p.add_argument(f"--{axis}", default=None, help=f"comma separated; replaces the preset's {axis}{extra} "
                                                        "(default: the preset's)")
    p.add_argument("--n-streams", default=None, help="comma separated widths of the widened stream of hc, mhc, "
                                                      "mhc_lite (the other placements ignore it; default 4)")
    p.add_argument("--value-residual", nargs="?", const="on", default=None,
                   help="ResFormer's value residual: on, off or on,off for both (bare flag: on; default: off)")
    p.add_argument("--dyt-alpha", default=None,
                   help="comma separated DyT/Derf alpha0: one number for every slot or attention/FFN/final, e.g. "
                        "0.5,0.8/0.2/0.2 (the DyT paper's LLaMA-7B values) (default 0.5)")
    p.add_argument("--embed-scale", default=None,
                   help="comma separated initial values of a learned scalar on the token embedding, or off: e.g. "
                        "off,8,50 (8 = sqrt(d_model), the DyT paper's LLaMA code; 50 = 1/0.02, embeddings at RMS 1) "
                        "(default: the preset's; off in most)")
    p.add_argument("--steps", type=int, default=None, help="steps per run (the cap under --preset long) "
                                                           "(default: the preset's)")
    p.add_argument("--d-model", type=int, default=None, help="model width (default: the preset's; 64 in most)")
    p.add_argument("--tensorboard", default=None, metavar="DIR",
                   help="also write each run's per-step metrics as TensorBoard scalars under DIR (needs the "
                        "tensorboard package; metrics.jsonl stays the record) (default: off)")
    p.add_argument("--data", default=None, help="a folder of text files, split by file into training, dev and "
                                                 "test (default: the Python standard library)")
    p.add_argument("--test-bytes", type=int, default=TEST_BYTES,
                   help="the held-out test split every final loss is measured on, in bytes; smaller only for a "
                        "corpus too small for the default, and the claims file judges no run measured on fewer "
                        "(default %(default)s)")
    add_out(p, "study", "results directory")
    p.add_argument("--shard", default="0/1", help="i/n: run every n-th run starting at i (default %(default)s)")
    p.add_argument("--list", action="store_true", help="print the grid and exit (default: off)")
    p.add_argument("--confirm", action="store_true",
                   help="train the confirmation runs of a claims preset into --out, after its study: the setting each "
                        "side of each claim paired by seed runs at (a tuned side's chosen on the finished runs' dev "
                        "losses) at --confirm-seeds; resumable and shardable as the preset's own runs, and the "
                        "outputs report both. With --list: the runs it would make (default: off)")
    p.add_argument("--confirm-seeds", default=None,
                   help="the confirmation seeds, a-b or comma separated; only with --confirm (default: 5-10)")
    p.add_argument("--report-only", action="store_true",
                   help="write summary.md, the figures and index.html again from what --out holds: nothing is "
                        "trained and no data is loaded. Without runs/ (a committed results directory) every run its "
                        "summary.json records, whatever the preset and axes; with runs/, the preset and axes pick "
                        "the runs, and a grid that would drop runs summary.json records is refused (default: off)")


def _init_distributed() -> int:
    """Under torchrun (WORLD_SIZE > 1): join the process group -- nccl on GPUs, gloo on CPUs -- and return
    this process's rank; every run of the grid then trains data-parallel over all of them."""
    import os

    import torch
    import torch.distributed as dist

    if int(os.environ.get("WORLD_SIZE", "1")) <= 1 or dist.is_initialized():
        return dist.get_rank() if dist.is_initialized() else 0
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    return dist.get_rank()


def _error(msg: str) -> int:
    return error("study", msg)


def _axis(name: str, text: str, kind):
    items = [t for t in text.split(",") if t]
    if not items:
        raise ValueError(f"--{name}: empty")
    out = []
    for t in items:
        try:
            out.append(kind(t))
        except ValueError:
            raise ValueError(f"--{name}: {t!r} is not a valid {kind.__name__}") from None
    return tuple(dict.fromkeys(out))  # each value once, in the order given


def _switch(text: str) -> bool:
    if text not in ("on", "off"):
        raise ValueError
    return text == "on"


def _alpha(text: str) -> float | tuple[float, float, float]:
    """'0.5' or 'attention/FFN/final' ('0.8/0.2/0.2')."""
    values = tuple(float(v) for v in text.split("/"))
    if len(values) not in (1, 3):
        raise ValueError
    return values[0] if len(values) == 1 else values


def _scale(text: str) -> float | None:
    """'off' or a number."""
    return None if text == "off" else float(text)


_switch.__name__ = "on or off"
_scale.__name__ = "scale (a number, or off)"
_alpha.__name__ = "alpha (one number, or attention/FFN/final such as 0.8/0.2/0.2)"


def grid_from_args(args) -> Study:
    """The preset's grid (every part of it, for a union), with the command line's axes replacing its own."""
    kinds = {"placements": str, "norms": str, "depths": int, "lrs": float, "warmups": int, "seeds": int,
             "clips": float, "inits": str}
    over = {k: _axis(k, getattr(args, k), kinds[k]) for k in kinds if getattr(args, k) is not None}
    if "placements" in over:  # "post+post+pre+pre": one placement per layer
        over["placements"] = tuple(parse_placement(p) for p in over["placements"])
    for option, axis, kind in (("n_streams", "n_streams", int), ("value_residual", "value_residuals", _switch),
                               ("dyt_alpha", "dyt_alphas", _alpha), ("embed_scale", "embed_scales", _scale)):
        if getattr(args, option) is not None:
            over[axis] = _axis(option.replace("_", "-"), getattr(args, option), kind)
    parts = []
    for grid in as_study(PRESETS[args.preset]).parts:
        if args.steps is not None:
            grid = replace(grid, base=replace(grid.base, steps=args.steps))
        if args.d_model is not None:
            grid = replace(grid, base=replace(grid.base, d_model=args.d_model))
        parts.append(replace(grid, **over))
    study = Study(tuple(parts))
    study.runs()  # validates every combination
    return study


def _seeds(text: str) -> tuple[int, ...]:
    """'5-10' or '5,6,7': ValueError naming --confirm-seeds otherwise."""
    try:
        if "-" in text:
            first, last = (int(v) for v in text.split("-"))
            seeds = tuple(range(first, last + 1))
        else:
            seeds = _axis("confirm-seeds", text, int)
        if not seeds or min(seeds) < 0:
            raise ValueError
    except ValueError:
        raise ValueError(f"--confirm-seeds must be a-b or comma separated seeds >= 0, e.g. 5-10, got "
                         f"{text!r}") from None
    return seeds


_GRID_OPTIONS = ("placements", "norms", "depths", "lrs", "warmups", "seeds", "clips", "inits", "n_streams",
                 "value_residual", "dyt_alpha", "embed_scale", "steps", "d_model")


def confirmation(args, grid: Study, console) -> tuple[Study, Study, bool]:
    """(the confirmation runs, the grid the outputs report: the preset's and those, whether a claim waits for its
    selection runs), the plan printed. ValueError naming the option for a call that cannot be planned."""
    given = [f"--{k.replace('_', '-')}" for k in _GRID_OPTIONS if getattr(args, k) is not None]
    if given:
        raise ValueError(f"--confirm plans from the preset's own grid (the settings its finished runs chose): drop "
                         f"{', '.join(given)}")
    seeds = _seeds(args.confirm_seeds or "5-10")
    overlap = sorted({r.seed for r in grid.runs()} & set(seeds))
    if overlap:
        raise ValueError(f"--confirm-seeds {args.confirm_seeds}: seeds {overlap} are the preset's own (its "
                         "selection seeds choose each tuned setting); give seeds beyond them")
    p = confirm.plan(args.preset, run_rows(Path(args.out)), seeds)
    if not (p.claims or p.skipped or p.waiting):
        raise ValueError(f"--confirm: no claim of the claims file pairs runs of the {args.preset} preset by seed: "
                         "nothing to confirm")
    for line in p.skipped:
        console.print(f"[yellow]not confirmed: {escape(line)}[/yellow]")
    for line in p.waiting:
        console.print(f"[yellow]not yet: {escape(line)}[/yellow]")
    runs = p.runs()
    console.print(f"[bold]{len(runs)} confirmation runs[/bold] ({len(p.grids)} settings x {len(seeds)} seeds) of "
                  f"the {args.preset} preset, for {', '.join(p.claims) or 'no claim yet'}")
    return p.study, Study(grid.parts + p.grids), bool(p.waiting)


def run(args) -> int:
    if args.confirm_seeds is not None and not args.confirm:
        return _error("--confirm-seeds needs --confirm")
    try:
        grid = grid_from_args(args)
    except StudyConfigError as e:
        return _error(f"{FLAGS.get(e.field, e.field)} {e.message}")
    except ValueError as e:
        return _error(str(e))
    try:
        i, n = (int(v) for v in args.shard.split("/"))
        if not 0 <= i < n:
            raise ValueError
    except ValueError:
        return _error(f"--shard must be i/n with 0 <= i < n, got {args.shard!r}")
    rank = _init_distributed()
    console = make_console(quiet=rank != 0)  # under torchrun, rank 0 speaks
    report, waiting = None, False
    if args.confirm:
        try:
            grid, report, waiting = confirmation(args, grid, console)
        except ValueError as e:
            return _error(str(e))
        runs = grid.runs()
    else:
        runs = grid.runs()
        console.print(f"[bold]{len(runs)} runs[/bold] ({args.preset} preset): {escape(grid.describe())}")
    if args.list:
        for r in runs:
            console.print(f"  {r.name()}", markup=False)
        return 0
    if args.report_only:
        try:
            study = report_only(grid if report is None else report, Path(args.out))
        except (OSError, ValueError) as e:
            return _error(f"--report-only: {e}")
        if study.get("source") == "summary.json":
            console.print(f"--report-only: {len(study['runs'])} runs from {escape(args.out)}/summary.json (no runs/ "
                          "there: the runs it records, whatever --preset and the axes say)")
        return _done(console, args.out, study)
    if not runs:  # --confirm before any claim could be planned
        return _waiting(console) if waiting else 0
    try:
        data = load_split(args.data, test_bytes=args.test_bytes)
    except SplitError as e:
        return _error(f"{'--test-bytes' if e.argument == 'test_bytes' else '--data'}: {e}")
    except (OSError, ValueError) as e:
        return _error(f"--data: {e}")
    if len(data.dev) <= grid.base.seq_len + 1:
        return _error(f"the dev split ({len(data.dev)} bytes) is too short for seq_len {grid.base.seq_len}")
    try:
        check_writable_dir(Path(args.out))
    except OSError as e:
        return _error(f"--out: {e}")
    if args.tensorboard is not None:
        if not tensorboard.available():
            return _error(f"--tensorboard {tensorboard.MISSING}")
        try:
            check_writable_dir(Path(args.tensorboard))
        except OSError as e:
            return _error(f"--tensorboard: {e}")
    console.print(f"data: {escape(data.source)} ({len(data.train_files)} training files; {len(data.dev_files)} dev "
                  f"files, {data.dev_bytes:,} bytes; {len(data.test_files)} test files, {data.val_bytes:,} bytes held "
                  f"out for the final losses; unigram plateau {data.unigram_nats:.3f} nats)")
    if data.val_bytes < TEST_BYTES:
        console.print(f"[yellow]--test-bytes {data.val_bytes:,}: the final losses are measured on fewer than "
                      f"{TEST_BYTES:,} held-out bytes, and the claims file judges none of these runs[/yellow]")
    # in a terminal the bars; in a log (stdout redirected) a line per finished run, as it finishes
    live = console.is_terminal
    on_run = None if live else (lambda k, total, row: console.print(run_line(k, total, row), markup=False))
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("loss {task.fields[loss]}"),
                  TimeElapsedColumn(), TimeRemainingColumn(), console=console, disable=rank != 0 or not live) as progress:
        study = run_study(grid, data, Path(args.out), progress, (i, n),
                          tensorboard=None if args.tensorboard is None else Path(args.tensorboard), on_run=on_run,
                          report=report)
    if rank != 0:
        return 0
    code = _done(console, args.out, study)
    return _waiting(console) if waiting else code


def _waiting(console) -> int:
    """Exit status 1 where a claim's confirmation runs could not be planned yet: the claims file must not be made
    before they are."""
    console.print("[yellow]--confirm: some claims wait for their selection runs (above): finish the preset's study, "
                  "then run this command again[/yellow]")
    return 1


def _done(console, out: str, study: dict) -> int:
    print_summary(console, study, out)  # the full Markdown tables are in summary.md
    console.print(f"results in {escape(out)}/: index.html (the report), summary.md (every table), summary.csv, "
                  f"summary.json, figures/{{{','.join(study['figures'])}}}")
    return 0
