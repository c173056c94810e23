"""Deliberate breaks of the fast offset kernel (csrc/cuda/relpos_fast_offsets.cuh), each applied
alone to a copy of the checkout and run against four simulated cases (tests/cuda_sim): every break
must make a case fail, or the cases cannot see that kind of bug. First run at 090ad7e on
2026-11-29 (every break caught: benchmarks/measured/sim_2026-11-28/deliberate_breaks_offsets.txt).
~3-4 minutes a break on 2 cores; needs nvcc and the simulator kit (GPUSIM_KIT, default
../shared/gpusim).

    python scripts/deliberate_breaks.py [INDEX ...] [--out FILE]   # appends each result to FILE
    python scripts/deliberate_breaks.py --check                      # each break still applies (no simulator)
"""

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SRC = Path(__file__).resolve().parents[1]  # the checkout
DST = Path(tempfile.gettempdir()) / "posattn-breaks"
F = "csrc/cuda/relpos_fast_offsets.cuh"
MUT = [
    (
        "skew: dS' written one column right in X",
        "X[xcol[i >> 1] + kGroups.col[nb] + (i & 1) - e0] =",
        "X[xcol[i >> 1] + kGroups.col[nb] + (i & 1) + 1 - e0] =",
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
        "float db = has_mul ? mul_w[c] * bsum[m] : bsum[m];",
        "float db = bsum[m];",
    ),
    (
        "d sigma: span multiply's sums without ln 2",
        "quad_sums ? -kLn2 * tsum[L::kRows + e]",
        "quad_sums ? -tsum[L::kRows + e]",
    ),
    (
        "column halves: every block writes columns 0..DA",
        "const int dcol = zc * DA;",
        "const int dcol = 0;",
    ),
    (
        "pairs: the stream skips the pair after each one",
        "jn = next_pair(j + 1);",
        "jn = next_pair(j + 2);",
    ),
]
# four cases of CI's selection (not cuda_sim_extended), so that a break they catch, CI catches
CASES = "tiled-bf16-d32-1d-long or tiled-bf16-d32-offsets-2d-tiles or fast-bf16-d64-3d-offsets-halves or tiled-f16-d32-offsets-3d-causal"
ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
ap.add_argument("index", type=int, nargs="*", help="the breaks to run (default: all)")
ap.add_argument("--out", type=Path, default=SRC / "build" / "deliberate_breaks.txt")
ap.add_argument("--check", action="store_true", help="only check that each break applies to the source once")
args = ap.parse_args()
source = (SRC / F).read_text()
stale = [(i, name) for i, (name, old, _) in enumerate(MUT) if source.count(old) != 1]
if stale:
    sys.exit(f"deliberate_breaks: these breaks no longer apply to {F} (update them): {stale}")
if args.check:
    print(f"deliberate_breaks: all {len(MUT)} breaks apply to {F}")
    sys.exit(0)
idx = args.index or range(len(MUT))
env = dict(os.environ)
env.setdefault("GPUSIM_KIT", str(SRC.parent / "shared" / "gpusim"))
args.out.parent.mkdir(parents=True, exist_ok=True)
missed = []
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
    for so in (SRC / "posattn").glob("_C*.so"):  # the built extension (ignored by git): the tests import posattn
        (DST / "posattn" / so.name).symlink_to(so)
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
    with open(args.out, "a") as f:
        f.write(f"## {i}: {name}\n   {old!r} -> {new!r}\n   ({time.time() - t0:.0f} s)\n")
        for ln in lines:
            f.write("   " + ln + "\n")
        for m in msgs:
            f.write("   E " + m[:200] + "\n")
    summary = lines[-1] if lines else ""
    if " failed" in summary:
        print(i, name, "caught:", summary.strip())
    else:  # the break went unseen, or the cases did not run
        missed.append(i)
        print(i, name, "NOT CAUGHT:", summary.strip() or out[-1500:] + r.stderr[-500:])
if missed:
    sys.exit(f"deliberate_breaks: not caught (or not run): {missed}")
