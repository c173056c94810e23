#!/usr/bin/env bash
# Runs every test: the C++ unit tests (Catch2, via ctest) and the Python suite
# (but the simulated-GPU cases: scripts/cuda_sim.sh).
# Expects scripts/setup.sh to have run. Exits non-zero on any failure.
set -euo pipefail
. "$(dirname "$0")/lib.sh"

prefix=$("$PY" -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')
cmake -S . -B build/cpp -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build/cpp -j"$(nproc)"
ctest --test-dir build/cpp --output-on-failure

# the simulated-GPU suite runs in scripts/cuda_sim.sh (it needs the simulator and takes minutes)
"$PY" -m pytest -q -m "not cuda_sim" tests "$@"
