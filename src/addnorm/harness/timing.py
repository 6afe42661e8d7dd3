"""Timing that can be trusted on a noisy 2-core machine: warm up, repeat, report median and spread."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass


@dataclass(frozen=True)
class Timing:
    median_s: float
    p10_s: float
    p90_s: float
    runs: int

    @property
    def spread(self) -> float:
        """(p90 - p10) / median: 0.05 means the middle 80 % of runs lie within 5 %."""
        return (self.p90_s - self.p10_s) / self.median_s if self.median_s else 0.0


def measure(fn, *, min_runs: int = 15, max_runs: int = 300, budget_s: float = 0.6, warmup: int = 3) -> Timing:
    """Call fn() repeatedly; each call is timed on its own (perf_counter)."""
    for _ in range(warmup):
        fn()
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < max_runs and (len(times) < min_runs or time.perf_counter() - start < budget_s):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return summary_of(times)


def measure_interleaved(fns: dict, *, min_runs: int = 15, max_runs: int = 300, budget_s: float = 0.6,
                        warmup_s: float = 0.05, block: int = 5) -> dict:
    """Time several functions side by side: rounds of ``block`` calls of each in turn (the starting one
    rotates), every call timed on its own, until each has ``min_runs`` and ``budget_s`` per function has
    passed (or each has ``max_runs``). Drifts of the machine -- clock, caches, a neighbour's load -- then
    fall on all of them alike instead of on whichever ran at the wrong moment. Returns {name: Timing}."""
    names = list(fns)
    for name in names:  # warm each for warmup_s (at least 3 calls): caches, allocator, thread pool
        t_end, k = time.perf_counter() + warmup_s, 0
        while k < 3 or time.perf_counter() < t_end:
            fns[name]()
            k += 1
    times: dict = {name: [] for name in names}
    start, rnd = time.perf_counter(), 0
    while True:
        n_min = min(len(v) for v in times.values())
        if n_min >= max_runs or (n_min >= min_runs and time.perf_counter() - start >= budget_s * len(names)):
            break
        for name in names[rnd % len(names):] + names[: rnd % len(names)]:
            fn, ts = fns[name], times[name]
            for _ in range(block):
                t0 = time.perf_counter()
                fn()
                ts.append(time.perf_counter() - t0)
        rnd += 1
    return {name: summary_of(ts) for name, ts in times.items()}


def summary_of(times: list[float]) -> Timing:
    times = sorted(times)
    q = statistics.quantiles(times, n=10, method="inclusive") if len(times) >= 2 else [times[0]] * 9
    return Timing(statistics.median(times), q[0], q[-1], len(times))
