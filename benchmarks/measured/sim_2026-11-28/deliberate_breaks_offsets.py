# Run on 2026-11-29 (at 090ad7e, 2 cores, ~3-4 min per break): every break caught; the results are
# in deliberate_breaks_offsets.txt beside it.
"""Deliberate breaks of csrc/cuda/relpos_fast_offsets.cuh, each alone, run against four
simulated cases. Usage: python deliberate_breaks_offsets.py [indices]; appends to deliberate_breaks_offsets.txt.
Needs CUDA_HOME (nvcc) and the simulator kit at ../shared/gpusim."""

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SRC = Path(__file__).resolve().parents[3]  # the checkout
DST = Path(tempfile.gettempdir()) / "posattn-breaks"
F = "csrc/cuda/relpos_fast_offsets.cuh"
MUT = [
    (
        "skew: dS' written one column right in X",
        "X[xcol[i >> 1] + kGroups.col[nb] + (i & 1)] =",
        "X[xcol[i >> 1] + kGroups.col[nb] + (i & 1) + 1] =",
    ),
    (
        "pipeline: the math reads the other stage's q_pos",
        "const T* Qp = smem + L::qpos_at(st);",
        "const T* Qp = smem + L::qpos_at(st ^ 1);",
    ),
    (
        "skew: X's tile offset box origin one off on every axis",
        "- q + extent<NDIM>(Box::kTile, a) - 1) *",
        "- q + extent<NDIM>(Box::kTile, a) - 2) *",
    ),
    (
        "write-out: d rel's box one row off (entry_row)",
        "delta[a] = dT[a] * x - (x - 1) + coord<NDIM>(Box::kTileOffsets, e, a);",
        "delta[a] = dT[a] * x - x + coord<NDIM>(Box::kTileOffsets, e, a);",
    ),
    (
        "chunks: X q_pos uses the next warp's query group's reach bits",
        "if (!kGroups.reaches(c, q)) continue;",
        "if (!kGroups.reaches(c, (q + 1) % kWarps)) continue;",
    ),
    (
        "sums: d bias without the offset's mul",
        "tsum[wrow[c]] += has_mul ? mul_w[c] * bsum[m] : bsum[m];",
        "tsum[wrow[c]] += bsum[m];",
    ),
    (
        "d sigma: span multiply's sums without ln 2",
        "quad_sums ? -kLn2 * tsum[L::kRows + e]",
        "quad_sums ? -tsum[L::kRows + e]",
    ),
    (
        "column halves: every block writes columns 0..DA",
        "const int dcol = DA == D ? 0 : blockIdx.z * DA;",
        "const int dcol = 0;",
    ),
    (
        "pairs: the stream skips the pair after each one",
        "const int64_t jn = next_pair(j + 1);",
        "const int64_t jn = next_pair(j + 2);",
    ),
]
CASES = "tiled-bf16-d32-1d-long or tiled-bf16-d32-offsets-2d-tiles or fast-f16-d64-3d-offsets-halves or tiled-f16-d32-offsets-3d-causal"
idx = [int(a) for a in sys.argv[1:]] or range(len(MUT))
env = dict(os.environ, GPUSIM_KIT=str(SRC.parent / "shared" / "gpusim"))
for i in idx:
    name, old, new = MUT[i]
    if DST.exists():
        shutil.rmtree(DST)
    files = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard"], cwd=SRC, capture_output=True, text=True
    ).stdout.split()
    for f in files:
        (DST / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(SRC / f, DST / f)
    s = (DST / F).read_text()
    assert s.count(old) == 1, (i, old, s.count(old))
    (DST / F).write_text(s.replace(old, new))
    t0 = time.time()
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-m",
            "cuda_sim",
            "-n",
            "2",
            "tests/cuda_sim/test_cuda_sim.py",
            "-k",
            CASES,
        ],
        cwd=DST,
        capture_output=True,
        text=True,
        env=env,
    )
    out = r.stdout
    lines = [
        ln
        for ln in out.splitlines()
        if ln.startswith(("FAILED", "PASSED", "ERROR")) or " passed" in ln or " failed" in ln
    ]
    msgs = re.findall(r"^E\s+(AssertionError.*|.*max.*)$", out, re.M)[:6]
    with open(Path(__file__).with_suffix(".txt"), "a") as f:
        f.write(f"## {i}: {name}\n   {old!r} -> {new!r}\n   ({time.time() - t0:.0f} s)\n")
        for ln in lines:
            f.write("   " + ln + "\n")
        for m in msgs:
            f.write("   E " + m[:200] + "\n")
    print(i, name, lines[-1] if lines else out[-500:])
