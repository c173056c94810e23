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


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not found in /proc/self/status")


def peak_extra_mib(fn: Callable[[], object]) -> float:
    """Peak resident memory that one call of fn adds to this process, in MiB
    (Linux: resets the VmHWM high-water mark first). Run it in a fresh process
    per measured method so that earlier allocations do not hide the peak."""
    before = _status_kib("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    fn()
    return max(_status_kib("VmHWM") - before, 0) / 1024
