"""Wall-clock timing for the benchmark scripts and the demo."""

from __future__ import annotations

import contextlib
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
    libc = _libc()
    if libc is not None:  # free heap pages leave the resident set, so reusing them counts
        libc.malloc_trim(0)
    before = _status_kib("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    fn()
    return max(_status_kib("VmHWM") - before, 0) / 1024


@contextlib.contextmanager
def freed_memory_returned_to_os():
    """Within the block, glibc serves every allocation above 64 KiB with its own
    mmap and gives it back on free, so that freed tensors leave the resident
    set and :func:`peak_extra_mib` can measure many steps in one process.

    Do not time code inside the block: every large allocation then page-faults
    afresh. On exit the thresholds are set to glibc's adapted maxima (mmap above
    32 MiB, trim above 64 MiB), close to a long-running process's state. A no-op
    where glibc is not the allocator.
    """
    libc = _libc()
    M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
    if libc is not None:
        libc.mallopt(M_MMAP_THRESHOLD, 64 * 1024)
        libc.mallopt(M_TRIM_THRESHOLD, 128 * 1024)
        libc.malloc_trim(0)
    try:
        yield
    finally:
        if libc is not None:
            libc.mallopt(M_MMAP_THRESHOLD, 32 * 2**20)
            libc.mallopt(M_TRIM_THRESHOLD, 64 * 2**20)


def _libc():
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    if not name:
        return None
    try:
        libc = ctypes.CDLL(name)
        libc.mallopt, libc.malloc_trim  # glibc only
    except (OSError, AttributeError):
        return None
    return libc
