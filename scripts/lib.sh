# What the scripts share; source it (`. scripts/lib.sh`) from the repository root.

# new_venv DIR TORCH_VERSION: a fresh virtual environment at DIR holding torch==TORCH_VERSION
# (pip's notes about the machine's local package index filtered out).
new_venv() {
  rm -rf "$1"
  "${PY:-python3}" -m venv "$1"
  "$1/bin/python" -m pip install -q "torch==$2" 2>&1 | sed "/WARNING: Location/d"
}
