"""The order of the fast offset kernel's adds (csrc/cuda/relpos_fast_offsets.cuh) on the
simulated GPU: tests/cuda_sim/offset_order.cu checks the order's table (a permutation of the
tile offsets by sum |dT_a|) and that every two overlapping boxes are ordered, the later one
waiting for the earlier, on 1-3 axes; it prints a PASS / FAIL line per check. (That the waits
hold on a GPU, where blocks run at once, is tests/ops/relpos/test_relpos_fast_cuda.py's
test_fast_offset_kernel_orders_its_adds.)

Run with ``bash scripts/cuda_sim.sh``; skipped, with the reason, where the simulator
is not built.
"""

from __future__ import annotations

import pytest
import simlib

pytestmark = [
    pytest.mark.cuda_sim,
    pytest.mark.skipif(simlib.unavailable() is not None, reason=str(simlib.unavailable())),
]

PROGRAM = simlib.REPO / "tests" / "cuda_sim" / "offset_order.cu"
SHAPES = ["1-D reach 0", "1-D reach 6", "2-D reach 0 0", "2-D reach 3 4", "2-D reach 0 5", "2-D reach 7 7"]
SHAPES += ["3-D reach 2 3 1", "3-D reach 3 3 3", "3-D reach 1 0 2"]
CHECKS = [f"{what} {shape}" for shape in SHAPES for what in ("table", "waits")]


@pytest.fixture(scope="module")
def report():
    return simlib.run_checks(PROGRAM, "offset_order")


def test_every_check_ran(report):
    returncode, lines, out = report
    assert sorted(lines) == sorted(CHECKS), out[-3000:]
    assert returncode == (1 if any(w == "FAIL" for w, _ in lines.values()) else 0), out[-3000:]


@pytest.mark.parametrize("check", CHECKS)
def test_order(report, check):
    _, lines, out = report
    word, detail = lines.get(check, ("MISSING", out[-3000:]))
    assert word == "PASS", f"{check}: {detail}"
