"""What every CPU benchmark's cells share: the copy bandwidth they are judged against (the floor), the allocator
they run under, the conditions they were measured under, and journals that resume only under the same ones.

The Add & Norm benchmark (``add_norm``) and the fused forms' (``fused_forms``) both stand on this module; neither
imports the other's measurements.
"""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path

import torch

from ..harness.store import digest
from ..harness.timing import measure

# glibc told to keep freed memory (``--allocator tuned``): its environment, read at a process's start-up
TUNED_MALLOC = {"MALLOC_MMAP_THRESHOLD_": str(1 << 32), "MALLOC_TRIM_THRESHOLD_": str(1 << 36)}


# two buffers of this size (512 MiB) exceed the last-level cache, so the copy runs at DRAM bandwidth: on the
# 2-core Xeon, whose cache is 480 MiB, it ran at the same 26 GB/s with the caches emptied before each call
# (benchmarks/bench_cold.py) as without
FLOOR_BYTES = 256 << 20


# cells moving at least this many bytes time the floor again beside their methods: this machine's
# bandwidth drifts by tens of percent within a run, and a floor measured minutes earlier misjudges them
LOCAL_FLOOR_BYTES = 32 << 20


def copy_step(nbytes: int = FLOOR_BYTES):
    """One torch copy_ of nbytes between two pre-faulted buffers (bytes read + written: 2 * nbytes)."""
    src = torch.ones(nbytes // 4)
    dst = torch.empty_like(src)
    dst.copy_(src)  # pre-fault
    return lambda: dst.copy_(src)


def copy_floor_gbps(nbytes: int = FLOOR_BYTES) -> float:
    """Bandwidth of torch's copy_ between two pre-faulted buffers (bytes read + bytes written)."""
    t = measure(copy_step(nbytes), min_runs=20, budget_s=1.0)
    return 2 * nbytes / t.median_s / 1e9


def conditions(allocator: str) -> dict:
    """What a CPU measurement ran under, recorded with its results: the machine, torch, the threads, the allocator
    and which of addnorm's kernels (instruction set, C++ nodes) were in force."""
    from ..kernels.cpu import availability
    from ..kernels.cpu.library import prefetch
    from ..kernels.cpu import nodes
    from ..ops import native_nodes  # noqa: F401  (loads the C++ nodes, so that their status is known)

    av = availability()
    return {
        "machine": platform.machine(),
        "processor": _cpu_model(),
        "cores": os.cpu_count(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "allocator": allocator,
        "addnorm_cpu_kernel": av.available,
        "addnorm_isa": av.isa,
        "addnorm_prefetch": prefetch(),
        "addnorm_cpp_nodes": nodes.status(),
    }


def journal_conditions(allocator: str) -> dict:
    """What a journalled row was measured under: the results' conditions and the build of the kernels. An
    interrupted run's rows are reused only under the same ones."""
    cond = conditions(allocator)
    from ..kernels.cpu.library import library

    try:
        cond["addnorm_build"] = digest(Path(library().path).read_bytes())
    except (RuntimeError, OSError):  # not built (library() says why), or the file is gone
        cond["addnorm_build"] = None
    return cond


def open_journal(journal: Path, cond: dict, console) -> None:
    """Start ``journal`` with its conditions, or keep an interrupted run's if they are these; otherwise say what
    changed and start afresh (the rows of another thread count, instruction set or build are not this run's)."""
    if journal.exists():
        try:
            first = json.loads(journal.read_text().splitlines()[0])
        except (IndexError, ValueError):
            first = {}
        old = first.get("conditions") if isinstance(first, dict) else None
        if old == cond:
            return
        changed = sorted(k for k in set(cond) | set(old or {}) if (old or {}).get(k) != cond.get(k))
        console.print(f"{journal.name}: an interrupted run's rows were measured under other conditions "
                      f"({', '.join(changed) if old else 'unrecorded'}); measuring again", markup=False)
    journal.write_text(json.dumps({"conditions": cond}) + "\n")


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"
