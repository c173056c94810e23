"""The fast path's forward skeleton (csrc/cuda/relpos_fast_forward.cuh: FA2's
structure, no positional term yet) on the simulated GPU against a float64 reference
(tests/cuda_sim/fast_forward.cu): bf16 and f16, D = 32, 64, 128, causal or not, one
or several query tiles and key blocks (so the two-stage cp.async pipeline turns
over), tails, a single token.

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

PROGRAM = simlib.REPO / "tests" / "cuda_sim" / "fast_forward.cu"
OUT_TOL = {"bf16": 1e-2, "half": 2e-3}  # relative to the largest |out|: the output's rounding and P's
LSE_TOL = 1e-4  # absolute: lse is computed in float32

# (type, D, B, H, N, causal): 64 queries per block, key blocks of 64
CASES = [
    ("bf16", 64, 1, 1, 64, False),  # one tile, one key block
    ("bf16", 64, 2, 2, 130, False),  # 3 tiles x 3 key blocks, a 2-row tail, 4 (batch, head)s
    ("bf16", 64, 1, 2, 130, True),
    ("half", 32, 1, 1, 200, True),  # 4 key blocks: both stages refilled
    ("half", 128, 1, 1, 70, False),
    ("bf16", 128, 1, 1, 1, False),  # a single token: 63 zero-filled rows of every tile
    ("bf16", 32, 3, 1, 17, True),
]


def _id(case):
    t, d, b, h, n, causal = case
    return f"{t}-d{d}-b{b}h{h}-n{n}" + ("-causal" if causal else "")


@pytest.mark.parametrize("case", CASES, ids=_id)
def test_fast_forward(case):
    t, d, b, h, n, causal = case
    binary = simlib.build(PROGRAM, f"fast_forward_{t}_d{d}", [f"FAST_T={t}", f"FAST_D={d}"])
    done = simlib.run(binary, [str(b), str(h), str(n), str(int(causal)), "7"], timeout=600)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-3000:]
    got = dict(line.split(None, 1) for line in done.stdout.splitlines() if line.strip())
    assert got["rows_written"] == f"{b * h * n} of {b * h * n}", out[-3000:]
    assert float(got["out_err"]) <= OUT_TOL[t], out[-3000:]  # (nan fails)
    assert float(got["lse_err"]) <= LSE_TOL, out[-3000:]
