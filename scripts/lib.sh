# What the scripts share. Sourced (`. "$(dirname "$0")/lib.sh"`), it makes the repository root
# the working directory and sets repo (that root) and PY (the Python to use: $PYTHON, default python3).
cd "$(dirname "${BASH_SOURCE[0]}")/.."
repo=$(pwd)
PY=${PYTHON:-python3}

# new_venv DIR TORCH_VERSION: a fresh virtual environment at DIR holding torch==TORCH_VERSION
# (pip's notes about the machine's local package index filtered out).
new_venv() {
  rm -rf "$1"
  "${PY:-python3}" -m venv "$1"
  "$1/bin/python" -m pip install -q "torch==$2" 2>&1 | sed "/WARNING: Location/d"
}
