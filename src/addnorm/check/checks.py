"""Which checks a target gets: a norm's (``norm.py``) or a residual connection's (``residual.py``)."""

from __future__ import annotations

from .adapters import Adapted, adapt
from .blocks import as_block
from .norm import SHAPE, check_norm
from .residual import check_residual
from .result import CheckResult

__all__ = ["SHAPE", "CheckResult", "check_target"]


def check_target(target, d: int = 768, extra_adapters=()) -> tuple[Adapted, list[CheckResult]]:
    a = adapt(target, d, extra_adapters)
    if a.n_inputs == 2:
        return a, check_residual(a, d)
    block = as_block(a, d)
    if block is not None:
        return block, check_residual(block, d)
    return a, check_norm(a, d)
