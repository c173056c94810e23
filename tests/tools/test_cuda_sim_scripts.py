"""The simulated-GPU suite's plumbing, checked without the simulator: scripts/cuda_sim.sh (syntax,
CI runs it, a clear failure without the kit), simlib's reasons for skipping and its raw file
format (the harness' input and output)."""

import os
import subprocess

import pytest
import simlib  # benchmarks/simlib.py (pyproject.toml puts benchmarks/ on pytest's path)
import torch
from helpers import ROOT

SCRIPT = os.path.join(ROOT, "scripts", "cuda_sim.sh")


def test_cuda_sim_script_syntax_and_ci_runs_it():
    subprocess.run(["bash", "-n", SCRIPT], check=True)
    assert "bash scripts/cuda_sim.sh" in open(os.path.join(ROOT, ".ci", "run")).read()
    assert '-m "not cuda_sim"' in open(os.path.join(ROOT, "scripts", "test.sh")).read()


def test_cuda_sim_script_fails_clearly_without_the_kit(tmp_path):
    r = subprocess.run(
        ["bash", SCRIPT], capture_output=True, text=True, env={**os.environ, "GPUSIM_KIT": str(tmp_path / "nowhere")}
    )
    assert r.returncode == 1 and "no simulator kit at" in r.stderr


def test_simlib_says_why_it_cannot_run(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUSIM_KIT", str(tmp_path / "nowhere"))
    assert "no simulator kit" in simlib.unavailable()
    monkeypatch.setenv("GPUSIM_KIT", str(tmp_path))
    (tmp_path / "run.sh").write_text("")
    monkeypatch.setenv("GPUSIM_HOME", str(tmp_path / "empty"))
    assert "the simulator is not built" in simlib.unavailable()


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64])
def test_raw_files_round_trip(dtype, tmp_path):
    t = (torch.randn(3, 5, dtype=torch.float64) * 100).to(dtype)
    simlib.write_tensor(tmp_path / "t.bin", t)
    assert (tmp_path / "t.bin").stat().st_size == t.numel() * t.element_size()
    assert torch.equal(simlib.read_tensor(tmp_path / "t.bin", dtype, (3, 5)), t)
