"""The warp-level primitives of csrc/cuda/warp_primitives.cuh (mma.sync, ldmatrix,
cp.async, register packing, A fragments from global memory) on the simulated GPU: tests/cuda_sim/warp_primitives.cu
checks each against a host reference, bit for bit, and prints a PASS / FAIL line per
check; here every expected check must pass.

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

PROGRAM = simlib.REPO / "tests" / "cuda_sim" / "warp_primitives.cu"
LDMATRIX_FORMS = ["K-x4", "K-x2", "K-x1", "V-x4-trans", "V-x2-trans", "V-x1-trans"]
CHECKS = (
    [f"mma_m16n8k16 {t} ldmatrix {form}" for t in ("bf16", "f16") for form in LDMATRIX_FORMS]
    + ["mma_m16n8k8_tf32", "to_tf32 (cvt.rna)"]
    + [f"pack2 {t} (lo in bits 15:0, round to nearest even)" for t in ("bf16", "f16")]
    + [f"cp_async_16 {n} of 6 rows valid (zero-fill), two groups" for n in (6, 4, 0)]
    + [f"cp_async_4 {n} of 96 floats valid (zero-fill)" for n in (96, 37)]
    + [f"load_a_global {t} (rows 3 and 11 absent)" for t in ("bf16", "f16", "tf32")]
)


@pytest.fixture(scope="module")
def report():
    return simlib.run_checks(PROGRAM, "warp_primitives")


def test_every_check_ran(report):
    returncode, lines, out = report
    assert sorted(lines) == sorted(CHECKS), out[-3000:]
    assert returncode == (1 if any(w == "FAIL" for w, _ in lines.values()) else 0), out[-3000:]


@pytest.mark.parametrize("check", CHECKS)
def test_primitive(report, check):
    _, lines, out = report
    word, detail = lines.get(check, ("MISSING", out[-3000:]))
    assert word == "PASS", f"{check}: {detail}"
