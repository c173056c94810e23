#!/usr/bin/env bash
# Runs every CUDA kernel of posattn on the simulated GPU and checks it against the
# float64 reference (tests/cuda_sim/: a torch-free harness over the launchers of
# csrc/cuda/, driven by pytest -m cuda_sim). Builds the simulator first if it is
# not built yet (GPGPU-Sim, from the kit in ../shared/gpusim or $GPUSIM_KIT, into
# $GPUSIM_HOME, ~/.cache/posattn-gpusim by default: ~3 min once). Ends with
# pytest's summary line; exits non-zero on any failure. Run by .ci/run.
#   bash scripts/cuda_sim.sh [--all] [pytest args, e.g. -k fast-]
# CI runs it without --all: the cases marked cuda_sim_extended (what CI's cases check, at other
# sizes, types, head dims or layouts; ~45 minutes of 2 cores) are left out. --all runs them too: do that
# after changing a kernel. Built programs are kept in ~/.cache/posattn-sim-builds (benchmarks/simlib.py).
# Ends with a table of each test program's build and run seconds (where CI's time goes).
# Expects scripts/setup.sh to have run (torch, posattn, pytest, pytest-xdist).
set -euo pipefail
. "$(dirname "$0")/lib.sh"

kit=${GPUSIM_KIT:-$(cd .. && pwd)/shared/gpusim}
if [ ! -f "$kit/setup.sh" ]; then
  echo "cuda_sim: no simulator kit at $kit (set GPUSIM_KIT to the gpusim folder)" >&2
  exit 1
fi
export GPUSIM_KIT="$kit"
if [ -z "${CUDA_HOME:-}" ] && ! command -v nvcc >/dev/null; then
  for d in /usr/local/cuda /usr/local/cuda-*; do
    if [ -x "$d/bin/nvcc" ]; then export CUDA_HOME=$d; break; fi
  done
fi
start=$(date +%s)
bash "$kit/setup.sh"
echo "cuda_sim: simulator ready in $(( $(date +%s) - start )) s"

# the suite must run here, not skip
"$PY" benchmarks/simlib.py
select="cuda_sim and not cuda_sim_extended"
if [ "${1:-}" = "--all" ]; then
  select=cuda_sim
  shift
fi
# where the time went: each test program's build, its first start (the simulator's ptxas over all
# of its PTX, once, before a test uses it) and its runs on the simulator. The tests of one program
# run on one worker, the costliest programs first (tests/cuda_sim/conftest.py)
times=$(mktemp)
trap 'rm -f "$times"' EXIT
rc=0
POSATTN_SIM_TIMES="$times" "$PY" -m pytest -q -p no:cacheprovider -m "$select" -n "$(nproc)" --dist loadgroup --no-loadscope-reorder --durations=20 tests/cuda_sim "$@" || rc=$?
"$PY" - "$times" <<'EOF_PY'
import collections, re, sys
rows = collections.defaultdict(lambda: [0.0, 0.0, 0, 0.0])  # build s, first start s, runs, run s
for line in open(sys.argv[1]):
    what, name, sec = line.split()
    r = rows[re.sub(r"-[0-9a-f]{12}$", "", name)]
    if what == "build":
        r[0] += float(sec)
    elif what == "start":
        r[1] += float(sec)
    else:
        r[2], r[3] = r[2] + 1, r[3] + float(sec)
print(f"cuda_sim: {'program':28} {'build s':>8} {'start s':>8} {'runs':>5} {'run s':>8}")
for name, (b, st, n, s) in sorted(rows.items(), key=lambda kv: -(kv[1][0] + kv[1][1] + kv[1][3])):
    print(f"cuda_sim: {name:28} {b:8.0f} {st:8.0f} {n:5d} {s:8.0f}")
tot = [sum(r[i] for r in rows.values()) for i in range(4)]
print(f"cuda_sim: {'all (CPU seconds)':28} {tot[0]:8.0f} {tot[1]:8.0f} {tot[2]:5.0f} {tot[3]:8.0f}")
EOF_PY
echo "cuda_sim: done in $(( $(date +%s) - start )) s"
exit $rc
