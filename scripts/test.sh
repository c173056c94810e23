#!/usr/bin/env bash
# Runs every test: the C++ unit tests (Catch2, via ctest) and the Python suite.
# Expects scripts/setup.sh to have run. Exits non-zero on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}

prefix=$("$PY" -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')
cmake -S . -B build/cpp -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build/cpp -j"$(nproc)"
ctest --test-dir build/cpp --output-on-failure

"$PY" -m pytest -q tests "$@"
