"""Shared by the benchmark scripts: ratio records for benchmarks/compare.py.

A record compares posattn's way of doing something with a baseline's, on one
case: ``speedup = baseline_ms / posattn_ms`` (> 1: posattn is faster) and, where
measured, ``memory_ratio = posattn_mib / baseline_mib`` (< 1: posattn uses less).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
from typing import Optional


def record(
    benchmark: str,
    case: str,
    method: str,
    baseline: str,
    method_ms: float,
    baseline_ms: float,
    method_mib: Optional[float] = None,
    baseline_mib: Optional[float] = None,
    note: str = "",
) -> dict:
    def ok(x):
        return x is not None and isinstance(x, (int, float)) and math.isfinite(x) and x > 0

    return dict(
        benchmark=benchmark,
        case=case,
        method=method,
        baseline=baseline,
        method_ms=method_ms,
        baseline_ms=baseline_ms,
        speedup=baseline_ms / method_ms if ok(method_ms) and ok(baseline_ms) else None,
        memory_ratio=method_mib / baseline_mib if ok(method_mib) and ok(baseline_mib) else None,
        note=note,
    )


def write_records(path: Optional[str], records: list[dict]) -> None:
    """Writes the records as JSON (atomically) when a path was given."""
    if not path:
        return
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(records, f, indent=1)
    os.replace(tmp, path)


def write_markdown(path: Optional[str], text: str) -> None:
    """Writes a results table (the --markdown option) when a path was given."""
    if not path:
        return
    with open(path, "w") as f:
        f.write(text + "\n")
    print(f"wrote {path}")


def parse_grid(s: str) -> list[int]:
    """``"32x32"`` -> [32, 32]; exits with a message naming --grid otherwise."""
    try:
        grid = [int(t) for t in s.lower().split("x")]
    except ValueError:
        raise SystemExit(f"--grid must look like 32x32, got {s!r}")
    if not grid or any(n < 1 for n in grid):
        raise SystemExit(f"--grid must list positive sizes, got {s!r}")
    return grid


def ratio(a, b) -> float:
    """a / b, NaN where either is missing, NaN or b is not positive."""
    return a / b if a and b and not math.isnan(a) and not math.isnan(b) and b > 0 else float("nan")


def child_peak_mib(script: str, argv: list[str]) -> tuple[float, Optional[str]]:
    """Runs ``script argv`` in a fresh process, which prints ``{"peak_extra_mib": ...}``
    last; returns (MiB, None), or (NaN, the child's last error line)."""
    res = subprocess.run([sys.executable, os.path.abspath(script)] + argv, capture_output=True, text=True)
    if res.returncode != 0:
        return float("nan"), res.stderr.strip().splitlines()[-1] if res.stderr else "failed"
    return json.loads(res.stdout.strip().splitlines()[-1])["peak_extra_mib"], None


def child_argv(child: str, args: argparse.Namespace, *names: str, **extra: str) -> list[str]:
    """The argv of a ``--child`` measurement process: ``--child CHILD``, then ``--NAME value``
    for each of ``names`` (attributes of ``args``, underscores as dashes) and ``extra``."""
    argv = ["--child", child]
    for name, value in [*((n, getattr(args, n)) for n in names), *extra.items()]:
        argv += ["--" + name.replace("_", "-"), str(value)]
    return argv


def add_run_arguments(p: argparse.ArgumentParser, repeats: int, eager_limit_gib: float) -> None:
    """The options every operator benchmark takes: timing, threads, memory, outputs."""
    import torch

    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--repeats", type=int, default=repeats)
    p.add_argument("--threads", type=int, default=torch.get_num_threads())
    p.add_argument("--eager-limit-gib", type=float, default=eager_limit_gib)
    p.add_argument("--no-memory", action="store_true", help="skip the peak-memory subprocesses")
    p.add_argument("--markdown", help="also write the results table to this file")
    p.add_argument("--json", help="also write ratio records for benchmarks/compare.py to this file")


def results_markdown(results: list[dict], threads: int, summary_lines, note: bool = False) -> str:
    """The machine line, one table row per (grid, method) of ``results`` (dicts with grid,
    batch and rows: method -> fwd_ms, fwd_bwd_ms, peak_mib[, note]), then each result's
    ``summary_lines(res)``."""
    import platform
    from datetime import date

    import torch

    import posattn

    extra_head, extra_rule = (" note |", "---|") if note else ("", "")
    out = [
        f"Machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}, "
        f"posattn {posattn.__version__}, {threads} threads, {date.today().isoformat()}",
        "",
        "| grid | B | method | fwd ms | fwd+bwd ms | peak extra MiB |" + extra_head,
        "|---|---|---|---|---|---|" + extra_rule,
    ]
    for res in results:
        for name, row in res["rows"].items():
            extra = f" {row['note']} |" if note else ""
            out.append(
                f"| {res['grid']} | {res['batch']} | {name} | {row['fwd_ms']:.1f} | {row['fwd_bwd_ms']:.1f} | "
                f"{row['peak_mib']:.1f} |" + extra
            )
    out.append("")
    for res in results:
        out.extend(summary_lines(res))
    return "\n".join(out)
