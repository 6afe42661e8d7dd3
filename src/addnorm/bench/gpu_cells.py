"""What both GPU benchmarks' cells share (Add & Norm's, ``gpu``, and the other fused forms', ``gpu_forms``): the
copy they are judged against, CUDA-event timing, the Triton launch parameters in force, the journal of finished
cells a cut-short run resumes from, and the conditions recorded with the results. Neither benchmark imports the
other; the command (``gpu.main_from_args``) runs both.
"""

from __future__ import annotations

import json
import platform
from dataclasses import asdict
from pathlib import Path

import torch

from ..harness.store import read_journal
from ..harness.timing import Timing, measure_interleaved, summary_of

FLOOR_BYTES = 512 << 20  # the device-to-device copy timed beside every cell (bytes read + written: twice this)


def cuda_interleaved(fns: dict, *, rounds: int = 30, block: int = 10, warmup: int = 5) -> dict:
    """{name: Timing} per call: ``rounds`` rounds of ``block`` calls of each in turn (the starting one
    rotates), each block timed between CUDA events."""
    names = list(fns)
    for name in names:
        for _ in range(warmup):
            fns[name]()
    torch.cuda.synchronize()
    times = {name: [] for name in names}
    for rnd in range(rounds):
        for name in names[rnd % len(names):] + names[: rnd % len(names)]:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(block):
                fns[name]()
            end.record()
            end.synchronize()
            times[name].append(start.elapsed_time(end) / 1e3 / block)
    return {name: summary_of(ts) for name, ts in times.items()}


def timed(fns: dict, device: str) -> dict[str, Timing]:
    """{name: Timing}: CUDA events on a GPU; on the CPU (``--device cpu``) a short timing that checks the
    scripts themselves, its numbers meaningless for a GPU."""
    if device == "cuda":
        return cuda_interleaved(fns)
    return measure_interleaved(fns, min_runs=5, budget_s=0.05)


def launch_label() -> str | None:
    """The Triton kernels' launch parameters in force, as ADDNORM_TRITON_LAUNCH writes them (None without Triton):
    the results' conditions say it, and a journalled cell measured under other parameters is measured again."""
    from ..kernels.triton import availability

    if not availability().available:
        return None
    from ..kernels.triton import norm as triton_ops

    return ",".join(f"{k}={v}" for k, v in triton_ops.launch().items())


def read_cells(journal: Path | None, row_type) -> dict:
    """{(cell key, methods): (rows, skipped)} from a GPU benchmark's journal (``append_cell``'s lines)."""
    return dict(read_journal(journal, lambda rec: ((rec["cell"], tuple(rec["methods"])),
                                                   ([row_type(**r) for r in rec["rows"]], rec["skipped"]))))


def append_cell(journal: Path | None, key: str, methods, skipped: dict, rows: list) -> None:
    """One finished cell, a JSON line, so that a run cut short resumes after it (``read_cells``)."""
    if journal is not None:
        with Path(journal).open("a") as f:
            f.write(json.dumps({"cell": key, "methods": list(methods), "skipped": skipped,
                                "rows": [asdict(r) for r in rows]}) + "\n")


def conditions(device: str, skipped: dict) -> dict:
    """What a GPU measurement ran under: the device, torch, Triton and its launch parameters, and {what: why} for
    each method not timed."""
    from ..kernels.triton import availability

    cond = {"device": device, "torch": torch.__version__, "python": platform.python_version(),
            "triton": availability().reason, "skipped": skipped,
            "timing": "CUDA events around blocks of 10 calls, methods interleaved, 30 rounds; median per call"}
    if availability().available:  # the Triton kernels' launch parameters in force (ADDNORM_TRITON_LAUNCH)
        cond["launch"] = launch_label()
    if device == "cuda":
        p = torch.cuda.get_device_properties(0)
        cond |= {"gpu": p.name, "sms": p.multi_processor_count, "memory_gib": round(p.total_memory / 2**30, 1),
                 "cuda": torch.version.cuda}
    return cond
