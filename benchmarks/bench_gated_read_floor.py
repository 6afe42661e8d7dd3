"""What fusing Qwen4-exp's gated read can win at most: one of its hyper-connection modules (layer 0's
``attn_hyper_connection``), HF's and the one ``patch_hf_model`` patched, forward and backward on the same stream,
timed interleaved, and the time each spends in its GEMMs (the low-rank gate's down and up projections and the
injection weights: ``aten::mm``/``addmm``, by the profiler).

The GEMMs are the same work in both modules -- the patched module runs the module's own Linear layers -- so the
patched module's time cannot fall below them: ``gemm_floor`` = the patched module's GEMM time over HF's module time
is the smallest patched / HF ratio any fusion of the rest could reach (the share goal of
``benchmarks/bench_hf_hyper.py`` is a third).

    python benchmarks/bench_gated_read_floor.py [--hidden 2048] [--tokens 1024] [--repeats 7] [--out FILE]
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from addnorm.bench.cpu_cells import conditions
from addnorm.bench.hf_hyper_models import HyperModelConfig, build
from addnorm.harness.store import atomic_write_text
from addnorm.interop import patch_hf_model

_GEMMS = ("aten::mm", "aten::addmm", "aten::bmm")


def _module_pair(hidden: int):
    hf = build(HyperModelConfig("qwen4_exp", hidden=hidden, layers=2, vocab=512, seed=0))
    patched = patch_hf_model(copy.deepcopy(hf))
    name = "model.layers.0.attn_hyper_connection"
    return dict(hf.named_modules())[name], dict(patched.named_modules())[name]


def _step(module, x):
    def run() -> float:
        x.grad = None
        module.zero_grad(set_to_none=True)
        t0 = time.perf_counter()
        h, _, a = module(x)
        (h.square().mean() + a.sum()).backward()
        return time.perf_counter() - t0
    return run


def _gemm_seconds(run) -> float:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        run()
    return sum(e.self_cpu_time_total for e in prof.key_averages() if e.key in _GEMMS) / 1e6


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--tokens", type=int, default=1024, help="B x T of the stream (default 1024: 4 x 256)")
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--out", default="addnorm-results/gated_read_floor.json")
    a = p.parse_args(argv)
    for name in ("hidden", "tokens", "repeats"):
        if getattr(a, name) < 1:
            p.error(f"--{name} must be a positive integer, got {getattr(a, name)}")
    torch.manual_seed(0)
    hf, patched = _module_pair(a.hidden)
    x = torch.randn(1, a.tokens, hf.hc_count * a.hidden, requires_grad=True)
    runs = {"hf": _step(hf, x), "patched": _step(patched, x)}
    times = {k: [] for k in runs}
    for fn in runs.values():
        fn()
    for r in range(a.repeats):  # interleaved, the first of a round alternating
        for k in (list(runs) if r % 2 == 0 else list(runs)[::-1]):
            times[k].append(runs[k]())
    gemm = {k: statistics.median(_gemm_seconds(fn) for _ in range(3)) for k, fn in runs.items()}
    med = {k: statistics.median(v) for k, v in times.items()}
    result = {
        "conditions": conditions("current"), "hidden": a.hidden, "tokens": a.tokens, "streams": hf.hc_count,
        "lowrank": hf.input_mix_weight_down.out_features, "repeats": a.repeats,
        "module_ms": {k: {"median": 1e3 * med[k], "min": 1e3 * min(v), "max": 1e3 * max(v)} for k, v in times.items()},
        "gemm_ms": {k: 1e3 * v for k, v in gemm.items()},
        "patched_over_hf": med["patched"] / med["hf"],
        "gemm_floor": gemm["patched"] / med["hf"],
    }
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out, json.dumps(result, indent=1))
    print(f"Qwen4-exp attn_hyper_connection, hidden {a.hidden}, {a.tokens} tokens, forward + backward, median of "
          f"{a.repeats} interleaved: HF {1e3 * med['hf']:.1f} ms (GEMMs {1e3 * gemm['hf']:.1f}), patched "
          f"{1e3 * med['patched']:.1f} ms (GEMMs {1e3 * gemm['patched']:.1f}); patched / HF "
          f"{result['patched_over_hf']:.3f}, its floor (the GEMMs alone) {result['gemm_floor']:.3f}")
    print(f"results: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
