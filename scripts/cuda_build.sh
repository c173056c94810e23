#!/usr/bin/env bash
# Builds the whole CUDA extension on a machine without a GPU, as CI does: a
# separate virtual environment with a CUDA build of torch (it runs on the CPU),
# a FORCE_CUDA=1 build of posattn (for sm_90: CUDA_ARCHS), then checks that the
# extension imports, that its CUDA kernels are registered with the dispatcher,
# and runs the operator tests (on the CPU) against that build, and the timm Swin
# tests (timm's torchvision imports on this torch, not on the CPU one). Link errors and
# registration mistakes show up here, without a GPU. Exits non-zero on any
# failure. Run by .ci/run.
#   CUDA_TORCH_VERSION  the CUDA torch to build against (default 2.14.1)
#   CUDA_HOME           the toolkit (default: the /usr/local/cuda-* holding lib64/libcudart.so)
#   CUDA_ARCHS          TORCH_CUDA_ARCH_LIST of the build (default 9.0: the GPU machine's H100 / H200;
#                       a second architecture adds ~8 minutes of device compilation on CI's
#                       2 cores, and the simulated suite already compiles every kernel for compute_80)
#   CUDA_PTX_ONLY       1 (default): device code as PTX for CUDA_ARCHS, no SASS (setup.py's
#                       POSATTN_CUDA_PTX_ONLY): ptxas does not run, which saves a third of the
#                       device compilation; this build only has to link, import and register, and
#                       scripts/ptxas_fast.sh is where ptxas' registers, stacks and spills are checked.
#                       0: SASS for CUDA_ARCHS, as a user's build
#   CUDA_DEVICE_OPT     0 (default): the device code is not optimised (setup.py's POSATTN_CUDA_DEVICE_OPT,
#                       nvcc -Xcicc -O0): NVVM's optimiser is most of the build's time, and this build's
#                       kernels never run (the simulated suite runs the -O3 ones). 1: optimised, as a user's build
set -euo pipefail
. "$(dirname "$0")/lib.sh"
CUDA_TORCH_VERSION=${CUDA_TORCH_VERSION:-2.14.1}
venv="$repo/build/cuda-venv"
src="$repo/build/cuda-src"

if [ -z "${CUDA_HOME:-}" ]; then
  for d in /usr/local/cuda /usr/local/cuda-*; do
    if [ -e "$d/lib64/libcudart.so" ]; then CUDA_HOME=$d; break; fi
  done
fi
if [ -z "${CUDA_HOME:-}" ] || [ ! -e "$CUDA_HOME/lib64/libcudart.so" ]; then
  echo "cuda_build: no CUDA toolkit with lib64/libcudart.so found; set CUDA_HOME" >&2
  exit 1
fi
export CUDA_HOME PATH="$CUDA_HOME/bin:$PATH"

vpy="$venv/bin/python"
if ! [ -x "$vpy" ] || ! "$vpy" -c "import torch, sys; sys.exit(not torch.__version__.startswith('$CUDA_TORCH_VERSION'))"; then
  new_venv "$venv" "$CUDA_TORCH_VERSION"
  "$vpy" -m pip install -q -r requirements.txt -r requirements-dev.txt 2>&1 | sed "/WARNING: Location/d"
fi
# timm (for the Swin integration tests) needs a torchvision built for this torch
"$vpy" -m pip install -q -r requirements-timm.txt 2>&1 | sed "/WARNING: Location/d"
"$vpy" -c "import torch; assert torch.version.cuda, 'cuda_build: torch ' + torch.__version__ + ' is not a CUDA build'; print('cuda_build: torch', torch.__version__, 'CUDA', torch.version.cuda, 'toolkit', '$CUDA_HOME')"

# Build from a copy of the project's files, so that this build and the
# checkout's CPU build (build/temp*, posattn/_C*.so) never share objects.
rm -rf "$src"
mkdir -p "$src"
git ls-files -co --exclude-standard -z | xargs -0 cp --parents -t "$src"
start=$(date +%s)
(cd "$src" && FORCE_CUDA=1 TORCH_CUDA_ARCH_LIST="${CUDA_ARCHS:-9.0}" MAX_JOBS="$(nproc)" \
  POSATTN_CUDA_PTX_ONLY="${CUDA_PTX_ONLY:-1}" POSATTN_CUDA_DEVICE_OPT="${CUDA_DEVICE_OPT:-0}" "$vpy" -m pip install -q --no-build-isolation --no-deps .)
echo "cuda_build: built in $(( $(date +%s) - start )) s"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
"$vpy" - "$repo" <<'PY'
import os
import sys

import torch

import posattn
from posattn import _C

where = os.path.dirname(os.path.abspath(posattn.__file__))
assert "site-packages" in where and where != os.path.join(sys.argv[1], "posattn"), where
missing = [
    f"{op} ({key})"
    for op in ("relpos_attention", "relpos_attention_backward", "apply_maps", "apply_maps_backward")
    for key in ("CPU", "CUDA", "Meta")
    if not torch._C._dispatch_has_kernel_for_dispatch_key(f"posattn::{op}", key)
]
assert not missing, "kernels not registered: " + ", ".join(missing)
libs = open(f"/proc/{os.getpid()}/maps").read()
assert "libcudart" in libs or "libtorch_cuda" in libs, "the extension did not load the CUDA runtime"
print("cuda_build: posattn from", where, "registers CPU, CUDA and Meta kernels of every op")
PY
"$vpy" -m pytest -q -p no:cacheprovider \
  "$repo/tests/ops/relpos/test_relpos_attention.py" "$repo/tests/ops/relpos/test_relpos_registration.py" \
  "$repo/tests/ops/relpos/test_relpos_bad_input.py" "$repo/tests/ops/relpos/test_relpos_dtype_contract.py" "$repo/tests/ops/apply_maps/test_apply_maps.py" \
  "$repo/tests/ops/relpos/test_relpos_cuda.py" "$repo/tests/ops/apply_maps/test_apply_maps_cuda.py" "$repo/tests/ops/relpos/test_natten_window.py" \
  "$repo/tests/ops/relpos/test_relpos_plan.py"
# timm's Swin against posattn.integrations.patch_swin: timm imports here (not on the CPU torch),
# so a skip would hide a failure
POSATTN_REQUIRE_TIMM=1 "$vpy" -m pytest -q -p no:cacheprovider "$repo/tests/integrations/test_integrations_swin.py"
POSATTN_REQUIRE_TIMM=1 "$vpy" -m pytest -q -p no:cacheprovider "$repo/tests/tools/test_readme.py" -k timm
echo "cuda_build: the CUDA build imports, registers its kernels and passes the operator and Swin tests on the CPU"
