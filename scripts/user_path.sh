#!/usr/bin/env bash
# The users' path, taken as a new user would: a fresh virtual environment with the pinned torch, a
# plain (non-editable) `pip install .`, then `python cmd/main.py -Dlearning_rate=0.05` (on tiny data)
# and a sweep in the thesis' format, both from a working directory outside the checkout, the sweep
# under `python -O`. Exits non-zero on any failure. Run by .ci/run after the test suite.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
TORCH_VERSION=${TORCH_VERSION:-2.13.0}
venv="$repo/build/user-venv"

new_venv "$venv" "$TORCH_VERSION"
vpy="$venv/bin/python"
# the build tools (pinned); posattn builds against the venv's torch, hence no build isolation
"$vpy" -m pip install -q $(grep -E '^(setuptools|wheel|ninja)==' requirements-dev.txt)
# `pip install .` resolves posattn's own dependency ranges; the constraints hold them to the tested pins
"$vpy" -m pip install -q --no-build-isolation . -c requirements.txt

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
"$vpy" - "$repo" <<'PY'
import os, sys
import posattn
# the installed copy in site-packages, not the checkout's package folder
where = os.path.dirname(os.path.abspath(posattn.__file__))
assert where != os.path.join(sys.argv[1], "posattn") and "site-packages" in where, where
print("user path: posattn", posattn.__version__, "from", where)
PY
# W&B as a new user gets it: no credentials, so the run is logged offline
"$vpy" "$repo/cmd/main.py" -Dlearning_rate=0.05 -Ddata.small_dataset=300 -Dtrain.epochs=1 -Dname=user-run
test -f runs/user-run/summary.json
ls -d runs/user-run/wandb/offline-run-* >/dev/null
"$vpy" -O "$repo/cmd/main.py" -mode=local_sweep --sweep_config=thesis_keys_quick -no_wandb=T
test -f runs/thesis_keys_quick/sweep_summary.csv
echo "user path: pip install . and cmd/main.py from $(pwd) work"
