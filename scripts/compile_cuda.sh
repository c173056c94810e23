#!/usr/bin/env bash
# Compiles every CUDA source (csrc/**/*.cu) to an object file with nvcc, so the
# CUDA kernels never rot on machines without a GPU. Nothing is linked or run.
set -euo pipefail
. "$(dirname "$0")/lib.sh"

mapfile -t sources < <(find csrc -name '*.cu' | sort)
if [ ${#sources[@]} -eq 0 ]; then
  echo "compile_cuda: no CUDA sources under csrc/ yet; nothing to compile"
  exit 0
fi
if ! command -v nvcc >/dev/null; then
  echo "compile_cuda: nvcc not found but there are CUDA sources" >&2
  exit 1
fi
includes=$("$PY" -c 'from torch.utils.cpp_extension import include_paths; print(" ".join("-I" + p for p in include_paths()))')
pyinc=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
# the flags torch's CUDAExtension passes to nvcc, so that this check matches the real build
common=$("$PY" -c 'from torch.utils.cpp_extension import COMMON_NVCC_FLAGS; print(" ".join(COMMON_NVCC_FLAGS))')
out=build/cuda_objects
mkdir -p "$out"
for src in "${sources[@]}"; do
  echo "nvcc -c $src"
  nvcc -std=c++20 -O2 $common -c "$src" -o "$out/$(basename "$src").o" $includes -I"$pyinc" -Icsrc -Iscripts/cuda_shim \
    -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90 \
    -DTORCH_EXTENSION_NAME=_C -D_GLIBCXX_USE_CXX11_ABI=1
done
echo "compile_cuda: ${#sources[@]} CUDA source(s) compiled"
