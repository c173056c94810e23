"""The GPU machine's one-call script (scripts/gpu_check.sh) and what it runs, checked
without a GPU: shell syntax, every file it names exists, its step handling, and the
sanitizer cases and the CUDA benchmark run end to end on the CPU (tiny sizes)."""

import json
import os
import re
import subprocess
import sys

from helpers import ROOT

SCRIPT = os.path.join(ROOT, "scripts", "gpu_check.sh")


def test_gpu_check_syntax_and_the_files_it_runs():
    subprocess.run(["bash", "-n", SCRIPT], check=True)
    text = open(SCRIPT).read()
    paths = set(re.findall(r"\b((?:tests|benchmarks|scripts)/[\w/.-]+\.(?:py|sh))\b", text))
    assert {
        "scripts/gpu_sanitize_cases.py",
        "benchmarks/bench_relpos_cuda.py",
        "tests/ops/relpos/test_relpos_cuda.py",
        "tests/ops/apply_maps/test_apply_maps_cuda.py",
    } <= paths
    missing = [p for p in paths if not os.path.exists(os.path.join(ROOT, p))]
    assert not missing, missing
    for step in ("build", "test", "sanitize", "bench", "profile", "profile64", "tf32"):
        assert f"    {step})" in text
    for tool in ("memcheck", "racecheck", "synccheck"):
        assert tool in text


def test_gpu_check_refuses_an_unknown_step(tmp_path):
    r = subprocess.run(
        ["bash", SCRIPT, "benchmark"], capture_output=True, text=True, env={**os.environ, "OUT": str(tmp_path)}
    )
    assert r.returncode == 2 and "unknown step 'benchmark'" in r.stderr
    assert "gpu_check" in (tmp_path / "summary.txt").read_text()


def test_gpu_check_skips_a_step_past_its_deadline(tmp_path):
    env = {**os.environ, "OUT": str(tmp_path), "GPU_CHECK_SECONDS": "0"}
    r = subprocess.run(["bash", SCRIPT, "bench"], capture_output=True, text=True, env=env)
    assert r.returncode == 1
    assert "bench-relpos: SKIPPED" in (tmp_path / "summary.txt").read_text()


def test_gpu_check_resume_skips_the_steps_an_earlier_call_ran(tmp_path):
    # no CUDA here: the tf32 step fails; a follow-up call with GPU_CHECK_RESUME=1 does not run it again
    env = {**os.environ, "OUT": str(tmp_path / "out"), "GPU_CHECK_STATE": str(tmp_path / "state")}
    r = subprocess.run(["bash", SCRIPT, "tf32"], capture_output=True, text=True, env=env)
    assert r.returncode == 1 and "tf32: FAILED" in r.stdout
    assert (tmp_path / "state" / "tf32").read_text().startswith("FAILED")
    r = subprocess.run(["bash", SCRIPT, "tf32"], capture_output=True, text=True, env={**env, "GPU_CHECK_RESUME": "1"})
    assert "tf32: ran in an earlier call (FAILED" in r.stdout


def test_the_profiled_step_runs_on_the_cpu():
    r = subprocess.run(
        [sys.executable, os.path.join(ROOT, "benchmarks", "profile_relpos_cuda.py"), "--once", "--device", "cpu"]
        + ["--dtype", "float32"]
        + ["--grid", "4x5", "--batch", "1", "--heads", "2", "--dim", "8"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert "profile_relpos_cuda: one forward + backward on 4x5 (float32) ran" in r.stdout


def test_sanitizer_cases_run_on_the_cpu():
    r = subprocess.run(
        [sys.executable, os.path.join(ROOT, "scripts", "gpu_sanitize_cases.py"), "--device", "cpu"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.count("ok relpos") == 8 and r.stdout.count("ok relpos packed") == 4
    assert r.stdout.count("ok apply_maps") == 3


def test_cuda_benchmark_runs_on_the_cpu(tmp_path):
    out_json, out_md = tmp_path / "r.json", tmp_path / "r.md"
    r = subprocess.run(
        [
            sys.executable,
            "bench_relpos_cuda.py",
            "--device",
            "cpu",
            "--dtype",
            "float32",
            "--grid",
            "5x6",
            "--batch",
            "1",
            "--heads",
            "2",
            "--dim",
            "8",
            "--methods",
            "sdpa,posattn,window,eager",
            "--keep",
            "0.3",
            "--repeats",
            "2",
            "--warmup",
            "1",
            "--json",
            str(out_json),
            "--markdown",
            str(out_md),
        ],
        cwd=os.path.join(ROOT, "benchmarks"),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert "eager       output check" in r.stdout
    records = json.loads(out_json.read_text())
    assert {rec["baseline"] for rec in records} == {"sdpa", "eager", "posattn dense"}
    assert all(rec["speedup"] and rec["speedup"] > 0 for rec in records)
    assert "| 5x6 | posattn |" in out_md.read_text() and "fwd+bwd peak MiB" in out_md.read_text()


def test_measured_holds_data_only_and_the_scripts_that_made_it_run():
    # benchmarks/measured/ is data; the scripts that produced it live in benchmarks/ and scripts/
    measured = os.path.join(ROOT, "benchmarks", "measured")
    code = [
        os.path.relpath(os.path.join(d, f), ROOT)
        for d, _, files in os.walk(measured)
        for f in files
        if f.endswith((".py", ".sh", ".cu", ".cpp"))
    ]
    assert not code, code
    for script in ("cuda_buildtime.sh", "sass_compare.sh"):
        subprocess.run(["bash", "-n", os.path.join(ROOT, "scripts", script)], check=True)
    r = subprocess.run(
        [sys.executable, os.path.join(ROOT, "scripts", "deliberate_breaks.py"), "--check"],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0 and "all 9 breaks apply" in r.stdout, r.stdout + r.stderr


def test_the_cpu_curves_and_their_plots(tmp_path):
    out = tmp_path / "cpu_curves_test"
    r = subprocess.run(
        [sys.executable, os.path.join(ROOT, "benchmarks", "bench_cpu_curves.py"), "--out", str(out)]
        + ["--window-grid", "6x5", "--half-widths", "1,2", "--sides", "6,8", "--kernel", "3", "--repeats", "1"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    window = (out / "window.csv").read_text().splitlines()
    assert window[0].startswith("method,half_width,kept,ms") and len(window) == 5
    grid = (out / "grid.csv").read_text()
    for method in ("sdpa", "posattn dense", "posattn.na2d", "sdpa + window mask"):
        assert grid.count(f"{method},") == 2, method
    r = subprocess.run(
        [sys.executable, os.path.join(ROOT, "benchmarks", "plots.py"), "--out", str(tmp_path / "img")],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert {p.name for p in (tmp_path / "img").iterdir()} == {"cpu_window.png", "cpu_grid.png", "sim_control.png"}
