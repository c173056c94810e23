#!/usr/bin/env bash
# Style checks of the whole repository (run by .ci/run): ruff (lint and format,
# pyproject.toml's [tool.ruff]) on the Python code, clang-format (.clang-format)
# on the C++ and CUDA code. Fix locally with:
#   ruff check --fix . && ruff format . && git ls-files '*.cpp' '*.h' '*.cu' '*.cuh' '*.inc' | xargs clang-format -i
# The tools are pinned in requirements-dev.txt. Exits non-zero on any finding.
set -euo pipefail
. "$(dirname "$0")/lib.sh"

"$PY" -m ruff check .
"$PY" -m ruff format --check .
# the clang-format of requirements-dev.txt, whatever else is on PATH
clang_format=$("$PY" -c 'import clang_format, os; print(os.path.join(os.path.dirname(clang_format.__file__), "data", "bin", "clang-format"))')
mapfile -t sources < <(git ls-files '*.cpp' '*.h' '*.cu' '*.cuh' '*.inc')
"$clang_format" --dry-run --Werror "${sources[@]}"
echo "lint: ruff and clang-format clean (${#sources[@]} C++/CUDA files)"
