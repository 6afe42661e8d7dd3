"""Fill MAX's on-disk kernel cache once with every op addnorm.max uses, and report the times.

    python -m addnorm.max.warm

MAX compiles each op the first time a process on a machine uses it (tens of seconds per op on 2
cores); the artifacts land in an on-disk cache that later processes reuse. Running every module once
here means no test (and no learner) pays that cost mid-run. ``max warm-interpreter-cache`` compiles
every op family MAX has, which takes far longer; this warms just what addnorm needs.
"""

from __future__ import annotations

import json
import sys
import time

import numpy as np


def warm() -> dict:
    t0 = time.perf_counter()
    from . import AddLayerNorm, AddRMSNorm, LayerNorm, ResidualBlock, RMSNorm, apply_residual_connection, to_max

    times = {"import_s": time.perf_counter() - t0}
    x = to_max(np.random.default_rng(0).normal(size=(2, 8, 768)).astype(np.float32))
    r = to_max(np.random.default_rng(1).normal(size=(2, 8, 768)).astype(np.float32))
    for name, fn in [("layer_norm", lambda: LayerNorm(768)(x)), ("rms_norm", lambda: RMSNorm(768)(x)),
                     ("rms_norm_gemma", lambda: RMSNorm(768, weight_offset=1.0)(x)),
                     ("add_layer_norm", lambda: AddLayerNorm(768)(x, r)[0]), ("add_rms_norm", lambda: AddRMSNorm(768)(x, r)[0]),
                     ("residual", lambda: ResidualBlock(768)(x, r)), ("apply_residual", lambda: apply_residual_connection(x, r))]:
        t = time.perf_counter()
        fn().to_numpy()
        times[name + "_s"] = time.perf_counter() - t
    times["total_s"] = time.perf_counter() - t0
    return times


if __name__ == "__main__":
    print(json.dumps(warm(), indent=1))
    sys.exit(0)
