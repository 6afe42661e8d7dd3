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
    times.sort()
    q = statistics.quantiles(times, n=10, method="inclusive") if len(times) >= 2 else [times[0]] * 9
    return Timing(statistics.median(times), q[0], q[-1], len(times))
