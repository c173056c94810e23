"""Wall-clock timing for the benchmark scripts and the demo."""
from __future__ import annotations

import statistics
import time
from typing import Callable


def median_seconds(fn: Callable[[], object], warmup: int = 1, repeats: int = 5) -> float:
    """Median wall time of `repeats` calls of fn after `warmup` untimed calls."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)
