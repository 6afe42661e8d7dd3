"""The names of what the recorder measures. A name outside them is refused, naming them: a misspelt quantity
(``"grad_nrom"``) matched no record and read as a depth profile of NaN."""

from __future__ import annotations

import re

STATS = ("mean", "std", "rms", "max_abs")  # stats.tensor_stats, of the stream and of each norm's input and output
GRADIENTS = ("grad_norm", "grad_rms", "param_grad_norm")  # w.r.t. the stream entering a block; of its parameters
MIXING = ("h_res_gain_fwd", "h_res_gain_bwd", "composite_gain_fwd", "composite_gain_bwd")  # mixing.composite_gains
QUANTITIES = (*(f"{where}_{q}" for where in ("stream", "norm_in", "norm_out") for q in STATS), *GRADIENTS, *MIXING)
_PER_STREAM = re.compile(r"stream\d+_rms")  # a widened stream's i-th stream: stream0_rms, stream1_rms, ...


def check_quantity(name) -> None:
    """Raise ``ValueError`` naming the known quantities unless ``name`` is one."""
    if isinstance(name, str) and (name in QUANTITIES or _PER_STREAM.fullmatch(name)):
        return
    raise ValueError(f"unknown diagnostics quantity {name!r}; known: {', '.join(QUANTITIES)}, and stream<i>_rms "
                     "(stream i of a widened stream: stream0_rms, stream1_rms, ...)")
