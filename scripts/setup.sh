#!/usr/bin/env bash
# Installs everything posattn needs on a fresh Debian machine with Python 3.11
# and builds the extension in place against the installed (pinned) torch.
set -euo pipefail
. "$(dirname "$0")/lib.sh"

TORCH_VERSION=${TORCH_VERSION:-2.13.0}

# System packages: Catch2 for the C++ unit tests, Fashion-MNIST for the offline demo.
need=()
[ -f /usr/include/catch2/catch.hpp ] || need+=(catch2)
[ -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ] || need+=(dataset-fashion-mnist)
command -v cmake >/dev/null || need+=(cmake)
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then SUDO=sudo; else SUDO=; fi
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq "${need[@]}"
fi

# torch first and pinned (the CPU build here); everything else pinned too.
"$PY" -m pip install -q "torch==${TORCH_VERSION}"
"$PY" -m pip install -q -r requirements.txt -r requirements-dev.txt
# natten (a test peer) builds against the installed torch: no build isolation
"$PY" -m pip install -q --no-build-isolation -r requirements-natten.txt
# Build against that torch: no build isolation.
"$PY" -m pip install -q --no-build-isolation -e .
"$PY" -c "import posattn, torch; print('posattn', posattn.__version__, 'built against torch', torch.__version__)"
