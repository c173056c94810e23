"""Shared by the benchmark scripts: ratio records for benchmarks/compare.py.

A record compares posattn's way of doing something with a baseline's, on one
case: ``speedup = baseline_ms / posattn_ms`` (> 1: posattn is faster) and, where
measured, ``memory_ratio = posattn_mib / baseline_mib`` (< 1: posattn uses less).
"""
from __future__ import annotations

import json
import math
import os
from typing import Optional


def record(benchmark: str, case: str, method: str, baseline: str, method_ms: float, baseline_ms: float,
           method_mib: Optional[float] = None, baseline_mib: Optional[float] = None, note: str = "") -> dict:
    def ok(x):
        return x is not None and isinstance(x, (int, float)) and math.isfinite(x) and x > 0

    return dict(benchmark=benchmark, case=case, method=method, baseline=baseline, method_ms=method_ms,
                baseline_ms=baseline_ms, speedup=baseline_ms / method_ms if ok(method_ms) and ok(baseline_ms) else None,
                memory_ratio=method_mib / baseline_mib if ok(method_mib) and ok(baseline_mib) else None, note=note)


def write_records(path: Optional[str], records: list[dict]) -> None:
    """Writes the records as JSON (atomically) when a path was given."""
    if not path:
        return
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(records, f, indent=1)
    os.replace(tmp, path)
