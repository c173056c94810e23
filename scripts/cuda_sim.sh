#!/usr/bin/env bash
# Runs every CUDA kernel of posattn on the simulated GPU and checks it against the
# float64 reference (tests/cuda_sim/: a torch-free harness over the launchers of
# csrc/cuda/, driven by pytest -m cuda_sim). Builds the simulator first if it is
# not built yet (GPGPU-Sim, from the kit in ../shared/gpusim or $GPUSIM_KIT, into
# $GPUSIM_HOME, ~/.cache/posattn-gpusim by default: ~3 min once). Ends with
# pytest's summary line; exits non-zero on any failure. Run by .ci/run.
#   bash scripts/cuda_sim.sh [--all] [pytest args, e.g. -k fast-]
# CI runs it without --all: the cases marked cuda_sim_extended (what CI's cases check, at other
# sizes, types or head dims; ~7 minutes of 2 cores) are left out. --all runs them too: do that
# after changing a kernel.
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
"$PY" -m pytest -q -p no:cacheprovider -m "$select" -n "$(nproc)" --durations=20 tests/cuda_sim "$@"
echo "cuda_sim: done in $(( $(date +%s) - start )) s"
