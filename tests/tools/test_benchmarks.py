"""Plumbing of the comparative benchmark (benchmarks/compare.py): ratio records,
a benchmark script's --json output, the table and the plot. No timings asserted."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys

import pytest
import torch
from helpers import ROOT

BENCH = os.path.join(ROOT, "benchmarks")


def load(name):
    """A benchmark script as a module (benchmarks/ is on pytest's path: pyproject.toml)."""
    return importlib.import_module(name)


@pytest.fixture(scope="module")
def compare():
    return load("compare")


def test_record_ratios():
    common = load("bench_common")
    r = common.record("b", "case", "posattn", "base", 2.0, 5.0, 10.0, 40.0)
    assert r["speedup"] == pytest.approx(2.5) and r["memory_ratio"] == pytest.approx(0.25)
    r = common.record("b", "case", "posattn", "base", 2.0, float("nan"), None, 40.0)
    assert r["speedup"] is None and r["memory_ratio"] is None


def test_script_json_records_through_run_suite(compare, tmp_path):
    args = ["--tree-only", "--tree-nodes", "100", "--tree-dims", "4", "--repeats", "1"]
    records, why = compare.run_suite("apply_maps", "bench_apply_maps.py", args, torch.device("cpu"), str(tmp_path))
    assert why is None
    assert len(records) == 1
    (r,) = records
    assert r["benchmark"] == "tree maps" and r["method"] == "level by level" and r["baseline"] == "per-node loop"
    assert r["speedup"] == pytest.approx(r["baseline_ms"] / r["method_ms"]) and r["speedup"] > 0
    assert "tree maps" in open(os.path.join(tmp_path, "apply_maps.log")).read()


def test_run_suite_reports_a_failing_script(compare, tmp_path):
    records, why = compare.run_suite(
        "apply_maps", "bench_apply_maps.py", ["--tree-dims", "x"], torch.device("cpu"), str(tmp_path)
    )
    assert records == [] and why.startswith("failed (exit 2)")


def test_table_and_plot(compare, tmp_path):
    recs = [
        dict(
            benchmark="relpos_attention",
            case="grid 32x32",
            method="posattn",
            baseline="eager",
            method_ms=10.0,
            baseline_ms=41.0,
            speedup=4.1,
            memory_ratio=0.03,
            note="",
        ),
        dict(
            benchmark="models",
            case="14x14",
            method="fused",
            baseline="Performer",
            method_ms=30.0,
            baseline_ms=15.0,
            speedup=0.5,
            memory_ratio=None,
            note="",
        ),
    ]
    lines = compare.table(recs)
    assert lines[2].endswith("| 4.10x | 0.030 |") and lines[3].endswith("| 0.50x | — |")
    path = os.path.join(tmp_path, "c.png")
    compare.plot(recs, path, "title")
    with open(path, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_compare_cli_rejects_missing_cuda(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the error path is for machines without it")
    res = subprocess.run(
        [sys.executable, os.path.join(BENCH, "compare.py"), "--device", "cuda", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 2 and "CUDA is not available" in res.stderr


def test_bench_relpos_json(tmp_path):
    out = os.path.join(tmp_path, "r.json")
    res = subprocess.run(
        [
            sys.executable,
            os.path.join(BENCH, "bench_relpos_cpu.py"),
            "--grid",
            "6x6",
            "--batch",
            "1",
            "--repeats",
            "1",
            "--warmup",
            "0",
            "--no-memory",
            "--json",
            out,
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr
    recs = json.load(open(out))
    assert [r["baseline"] for r in recs] == ["eager bias + SDPA", "SDPA without positions (floor)", "span dense"]
    assert all(r["speedup"] > 0 for r in recs)


def test_bench_bias_json(tmp_path):
    out = os.path.join(tmp_path, "b.json")
    res = subprocess.run(
        [
            sys.executable,
            os.path.join(BENCH, "bench_bias_cpu.py"),
            "--grid",
            "6x6",
            "--batch",
            "1",
            "--methods",
            "eager,posattn,window",
            "--window",
            "1",
            "--repeats",
            "1",
            "--warmup",
            "0",
            "--no-memory",
            "--json",
            out,
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr
    recs = json.load(open(out))
    assert [(r["method"], r["baseline"]) for r in recs] == [
        ("posattn", "eager gathered bias + SDPA"),
        ("posattn 3-wide window", "eager gathered bias + SDPA (dense)"),
    ]
    assert all(r["speedup"] > 0 for r in recs)
    res = subprocess.run(
        [sys.executable, os.path.join(BENCH, "bench_bias_cpu.py"), "--methods", "sdpa"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode != 0 and "unknown ['sdpa']" in res.stderr


def test_packed_benchmark_runs(tmp_path):
    """benchmarks/bench_packed.py on a tiny mix: every method runs, ratios are recorded."""
    bench = load("bench_packed")
    out = tmp_path / "packed.json"
    bench.main(["--images", "3", "--heads", "2", "--dim", "4", "--warmup", "0", "--repeats", "1", "--json", str(out)])
    records = json.loads(out.read_text())
    assert {r["baseline"] for r in records} == {"loop", "padded", "padded-op"}
    assert len(records) == 12 and all(r["speedup"] > 0 for r in records)
    shapes = bench.navit_shapes(100, seed=0)
    assert all(4 <= n <= 16 for s in shapes for n in s) and all(0.5 <= w / h <= 2.0 + 1 / 4 for h, w in shapes)
