"""The fast path's forward (csrc/cuda/relpos_fast_forward.cuh: FA2's structure) and
backward (relpos_fast_backward.cuh) on the simulated GPU against a float64 reference (tests/cuda_sim/fast_forward.cu), on
1-D, 2-D and 3-D grids: the FA2 control (no positional term) and the positional kernel
(q_pos . rel on the tensor cores, bias, span add / multiply as per-offset tables); bf16
and f16, D = 32, 64, 128 (the offset tile in two pipeline stages, or in one refilled
after a second barrier: D = 128 on 2-D and 3-D grids), causal or not, one or several
query tiles and key blocks (so the pipeline turns over), tails on every axis (boxes
past the grid's end), a size-1 axis, a single token.

Windows (NATTEN's vocabulary: even kernels, query strides, causal axes, clip or shift)
and span boxes (a threshold) against the host reference's masks: the tile's box of key
blocks, the blocks a warp skips, the blocks it masks.

Caught by these cases when broken on purpose (2026-11-27): the skew read off by one in
the query's or the key's part (every positional case), the warp's offset box one row
off, the offset tile or K read from the other pipeline stage, no mask on the last key
block, one causal key block short, no rescale of the running sum; the tile's box of key
blocks one block short at either end, a warp's activity or its no-mask test taken from
one row, the mask's range one key too wide, the span box ignored (BENCHMARKS.md, the
windows' step).

Run with ``bash scripts/cuda_sim.sh``; skipped, with the reason, where the simulator
is not built.
"""

from __future__ import annotations

import math

import pytest
import simlib

pytestmark = [
    pytest.mark.cuda_sim,
    pytest.mark.skipif(simlib.unavailable() is not None, reason=str(simlib.unavailable())),
]

PROGRAM = simlib.REPO / "tests" / "cuda_sim" / "fast_forward.cu"
OUT_TOL = {"bf16": 1e-2, "half": 2e-3}  # relative to the largest |out|: the output's rounding and P's
LSE_TOL = 1e-4  # absolute: lse is computed in float32

# (type, D, B, H, grid, causal, positional[, box]): 64 queries per block (1-D: 64, 2-D:
# 8 x 8, 3-D: 4 x 4 x 4), key blocks as large; positional = (span: 0 none, 1 add, 2
# multiply, bias: 0 / 1) or None for the FA2 control; box = (window, threshold): the window
# per axis as kernel.stride.causal, x-separated, "/shift" for NATTEN's border rule, "-" for
# none (fast_forward.cu); a threshold > 0 with a span makes span boxes
CASES = [
    ("bf16", 64, 1, 1, 64, False, None),  # one tile, one key block
    ("bf16", 64, 2, 2, 130, False, None),  # 3 tiles x 3 key blocks, a 2-row tail, 4 (batch, head)s
    ("bf16", 64, 1, 2, 130, True, None),
    ("half", 32, 1, 1, 200, True, None),  # 4 key blocks: both stages refilled
    ("half", 128, 1, 1, 70, False, None),
    ("bf16", 128, 1, 1, 1, False, None),  # a single token: 63 zero-filled rows of every tile
    ("bf16", 32, 3, 1, 17, True, None),
    ("bf16", 64, 1, 1, 64, False, (0, 0)),  # the positional term alone
    ("bf16", 64, 2, 2, 130, False, (1, 1)),  # + bias, span add; offset tiles past both ends
    ("bf16", 64, 1, 2, 130, True, (2, 1)),  # span multiply, causal
    ("half", 32, 1, 1, 200, True, (1, 0)),
    ("half", 128, 1, 1, 70, False, (2, 0)),
    ("bf16", 128, 1, 1, 1, False, (1, 1)),
    ("bf16", 32, 2, 1, 257, False, (0, 1)),  # 5 key blocks, a 1-row tail tile
    ("bf16", 64, 1, 1, "8x8", False, (0, 0)),  # 2-D: one tile, one key block
    ("bf16", 64, 1, 2, "9x12", False, (1, 1)),  # 2 x 2 tiles and key blocks, tails on both axes
    ("bf16", 64, 1, 1, "13x17", True, (2, 1)),  # 2 x 3 key blocks, causal across box rows
    ("bf16", 64, 1, 1, "13x17", True, None),
    ("half", 32, 2, 1, "17x9", False, (2, 0)),
    ("bf16", 128, 1, 1, "11x10", True, (1, 1)),  # the offset tile in one stage
    ("bf16", 64, 1, 1, "9x1x12", False, (1, 1)),  # a size-1 axis: the 2-D kernel
    ("bf16", 64, 1, 1, "5x6x7", False, (1, 1)),  # 3-D: 2 x 2 x 2 tiles and key blocks
    ("bf16", 64, 1, 1, "5x6x7", True, (2, 1)),
    ("half", 128, 1, 1, "6x5x9", True, (1, 0)),  # the offset tile in one stage
    ("bf16", 32, 1, 1, "3x9x4", False, (0, 0)),
    # windows and span boxes: tiles visit a box of key blocks, warps skip blocks, masks per range
    ("bf16", 64, 1, 2, 300, False, (1, 1), ("-", 0.9)),  # span boxes of 42-179 cells: 2-4 of 5 blocks
    ("half", 64, 1, 1, 200, False, (0, 1), ("16.8.1", 0.0)),  # a causal axis, query groups of 8
    ("bf16", 64, 1, 1, "20x24", False, (1, 1), ("5.1.0x7.1.0", 0.0)),
    ("bf16", 64, 1, 1, "20x24", False, None, ("5.1.0x7.1.0", 0.0)),  # the control's masks alike
    ("half", 32, 1, 1, "20x24", True, (2, 0), ("4.2.1x7.3.0/shift", 0.0)),  # + causal token order
    ("bf16", 128, 1, 1, "13x17", False, (1, 0), ("3.1.0x5.1.0", 0.5)),  # window and span box, one stage
    ("bf16", 64, 1, 1, "9x10x11", True, (1, 1), ("3.1.0x3.1.0x5.2.0/shift", 0.0)),
    # windows wider than a key block: blocks every row of a warp keeps whole go unmasked
    ("bf16", 32, 1, 1, "24x40", False, (1, 1), ("17.1.0x21.1.0", 0.0)),
    ("half", 32, 1, 1, "8x12x12", False, (0, 1), ("7.1.0x9.1.0x11.1.0", 0.0)),
]


def _id(case):
    t, d, b, h, n, causal, pos, *box = case
    name = f"{t}-d{d}-b{b}h{h}-{'n' if isinstance(n, int) else 'grid'}{n}" + ("-causal" if causal else "")
    if pos is not None:
        name += "-pos" + ("", "-span-add", "-span-multiply")[pos[0]] + ("-bias" if pos[1] else "")
    if box:
        window, threshold = box[0]
        name += ("" if window == "-" else f"-window{window.replace('/', '-')}") + (
            f"-threshold{threshold}" if threshold else ""
        )
    return name


def _program(case):
    """The name of the program that runs `case` (its xdist group: tests/cuda_sim/conftest.py)."""
    return f"fast_forward_{case[0]}_d{case[1]}"


def _run(case, backward=False):
    t, d, b, h, n, causal, pos, *box = case
    binary = simlib.build(PROGRAM, _program(case), [f"FAST_T={t}", f"FAST_D={d}"], start=True)
    args = [str(b), str(h), str(n), str(int(causal)), "7"]
    if pos is not None or box:
        args += ["0", "0", "0"] if pos is None else ["1", str(pos[0]), str(pos[1])]
    if box:
        args += [box[0][0], repr(box[0][1])]
    done = simlib.run(binary, args, timeout=600, extra_env={"FAST_BACKWARD": str(int(backward))})
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-3000:]
    got = dict(line.split(None, 1) for line in done.stdout.splitlines() if line.strip())
    tokens = math.prod(int(x) for x in str(n).split("x"))
    assert got["rows_written"] == f"{b * h * tokens} of {b * h * tokens}", out[-3000:]
    assert float(got["out_err"]) <= OUT_TOL[t], out[-3000:]  # (nan fails)
    assert float(got["lse_err"]) <= LSE_TOL, out[-3000:]
    return got, out


# CI runs eleven cases of one build of the program, bf16 with D = 64 (1-D, 2-D and 3-D, causal, the
# span and bias, several tiles and key blocks, a size-1 axis, windows and span boxes; the backward on
# each grid rank); the others are marked cuda_sim_extended (`bash scripts/cuda_sim.sh --all` runs
# them): the harness cases of test_cuda_sim.py run the fast kernels at every type and head dim
# through the plan.
CI_CASES = {
    "bf16-d64-b2h2-n130",
    "bf16-d64-b1h2-n130-causal-pos-span-multiply-bias",
    "bf16-d64-b1h1-grid13x17-causal-pos-span-multiply-bias",
    "bf16-d64-b1h1-grid9x1x12-pos-span-add-bias",
    "bf16-d64-b1h1-grid5x6x7-causal-pos-span-multiply-bias",
    "bf16-d64-b1h2-n300-pos-span-add-bias-threshold0.9",
    "bf16-d64-b1h1-grid20x24-pos-span-add-bias-window5.1.0x7.1.0",
    "bf16-d64-b2h1-n130-causal-pos-span-add-bias",
    "bf16-d64-b1h2-grid9x12-pos-span-add-bias",
    "bf16-d64-b1h1-grid5x6x7-causal-pos-span-add-bias",
}


def _params(cases, extended=()):
    return [
        pytest.param(
            c,
            id=_id(c),
            marks=[pytest.mark.xdist_group(_program(c))]
            + ([pytest.mark.cuda_sim_extended] if _id(c) not in CI_CASES or _id(c) in extended else []),
        )
        for c in cases
    ]


@pytest.mark.parametrize("case", _params(CASES))
def test_fast_forward(case):
    _run(case)


# The backward (relpos_fast_backward.cuh: d q, d q_pos query-major, d k, d v key-major) from
# the forward's out and lse: the control and the positional kernels, several query tiles
# and key blocks (both pipelines turn over, the key-major kernel's causal suffix of tiles),
# tails, a size-1 axis, windows and span boxes (the key-major kernel's bisected query
# tiles), the offset tile in one stage (D = 64 on 3-D grids, D = 128 on 1-D), the streamed
# boxes in one stage too (D = 128 on 2-D grids)
BACKWARD_CASES = [
    ("bf16", 64, 1, 2, 130, False, None),
    ("half", 32, 1, 1, 200, True, None),
    ("bf16", 64, 2, 1, 130, True, (1, 1)),
    ("half", 128, 1, 1, 150, False, (2, 1)),
    ("bf16", 128, 1, 1, "11x10", True, (1, 1)),  # one stage of the streamed boxes too
    ("bf16", 32, 1, 1, 257, True, (2, 0)),
    ("bf16", 64, 1, 1, "13x17", True, None),
    ("bf16", 64, 1, 2, "9x12", False, (1, 1)),
    ("half", 32, 1, 1, "17x9", True, (2, 1)),
    ("bf16", 64, 1, 1, "9x1x12", False, (0, 1)),
    ("bf16", 64, 1, 1, "5x6x7", True, (1, 1)),
    ("half", 32, 1, 1, "6x5x9", False, (2, 0)),
    ("bf16", 64, 1, 1, 300, False, (1, 1), ("-", 0.9)),
    ("half", 64, 1, 1, 200, False, (0, 1), ("16.8.1", 0.0)),
    ("bf16", 32, 1, 1, "20x24", False, (1, 1), ("5.1.0x7.1.0", 0.0)),
    ("half", 32, 1, 1, "20x24", True, (2, 0), ("4.2.1x7.3.0/shift", 0.0)),
    ("bf16", 64, 1, 1, "9x10x11", True, (1, 1), ("3.1.0x3.1.0x5.2.0/shift", 0.0)),
]
assert CI_CASES <= {_id(c) for c in CASES + BACKWARD_CASES}, "CI_CASES names a case that is not there"
GRAD_TOL = {"bf16": 2e-2, "half": 4e-3}  # relative to a gradient's largest value: dS and P rounded to T


@pytest.mark.parametrize(
    "case",
    _params(
        BACKWARD_CASES, extended={"bf16-d64-b1h1-grid9x10x11-causal-pos-span-add-bias-window3.1.0x3.1.0x5.2.0-shift"}
    ),
)
def test_fast_backward(case):
    got, out = _run(case, backward=True)
    names = ["dq", "dk", "dv"] + (["dqpos"] if case[6] is not None else [])
    for name in names:
        assert float(got[f"{name}_err"]) <= GRAD_TOL[case[0]], (name, out[-3000:])  # (nan fails)
