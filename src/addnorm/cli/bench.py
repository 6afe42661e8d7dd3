"""`addnorm bench`: fused Add & Norm vs eager PyTorch vs torch.compile vs the memory-bandwidth floor."""

from __future__ import annotations


def add_parser(sub) -> None:
    from ..bench.add_norm import add_arguments

    p = sub.add_parser("bench", help="benchmark the fused Add & Norm kernels")
    add_arguments(p)


def run(args) -> int:
    from ..bench.add_norm import main_from_args

    return main_from_args(args)
