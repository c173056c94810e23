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


def test_packed_cycles_benchmark_mix_and_refusal(tmp_path, monkeypatch):
    """benchmarks/sim_packed_cycles.py: its mix of images (sides 2..max, aspect ratios 1:2 to 2:1,
    seeded) and a clear exit where the simulator cannot run (its timing runs are a benchmark's, not CI's)."""
    import sim_packed_cycles

    shapes = sim_packed_cycles.mix(20, 7, seed=1)
    assert len(shapes) == 20 and shapes == sim_packed_cycles.mix(20, 7, seed=1)
    assert all(2 <= n <= 7 for s in shapes for n in s) and all(max(s) <= 2 * min(s) for s in shapes)
    monkeypatch.setenv("GPUSIM_KIT", str(tmp_path / "nowhere"))
    monkeypatch.setattr("sys.argv", ["sim_packed_cycles.py"])
    with pytest.raises(SystemExit, match="sim_packed_cycles: no simulator kit"):
        sim_packed_cycles.main()
