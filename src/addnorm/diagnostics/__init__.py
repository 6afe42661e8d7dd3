"""Measure what Add & Norm does inside any PyTorch model, through hooks that never change the math.

    with addnorm.diagnostics.record(model) as rec:
        loss = model(idx, idx)[1]
        loss.backward()
    rec.to_csv("flow.csv"); rec.frame()  # tidy records: step, block, site, quantity, value

Per block (and per sub-layer for addnorm models): the gradient norm w.r.t. the residual stream
entering it, parameter-gradient norms, residual-stream mean/std/RMS/max|x|; for every norm layer,
the statistics of its input and output (``QUANTITIES`` names them all; any other name is refused). Hooks are removed when the context exits, so a detached
model runs at full speed.
"""

from .blocks import find_blocks
from .recorder import Recorder, depth_profile, record
from .mixing import amax_gain, composite_gains
from .quantities import QUANTITIES
from .stats import per_stream_rms, tensor_stats

__all__ = ["record", "Recorder", "depth_profile", "find_blocks", "tensor_stats", "per_stream_rms", "amax_gain",
           "composite_gains", "QUANTITIES"]
