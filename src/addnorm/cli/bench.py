"""`addnorm bench`: fused Add & Norm vs eager PyTorch vs torch.compile vs the memory-bandwidth floor."""

from __future__ import annotations

from .output import out_help, results_dir


def add_arguments(p) -> None:
    from ..bench.add_norm import add_arguments as benchmark_arguments

    benchmark_arguments(p)
    # the benchmark's own default is the committed results folder (benchmarks/bench_add_norm.py refreshes it);
    # the command writes under the current directory
    p.set_defaults(out=results_dir("bench"))
    next(a for a in p._actions if a.dest == "out").help = out_help("directory for CSV/JSON")


def run(args) -> int:
    from ..bench.add_norm import main_from_args

    return main_from_args(args)
