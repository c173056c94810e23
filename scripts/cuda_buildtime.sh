#!/bin/bash
# Compile time of the extension's CUDA translation units: compiles .cu files ($2...) of checkout $1
# with the extension's nvcc flags (setup.py, sm_80 + sm_90), two at a time as ninja -j2 does on 2
# cores (how benchmarks/measured/sim_2026-11-27/cuda_build_time.txt was measured):
#   time bash scripts/cuda_buildtime.sh CHECKOUT FILE.cu...
# VPY: the Python of a CUDA torch (default: scripts/cuda_build.sh's build/cuda-venv in the checkout).
cd "$1"; shift
VPY=${VPY:-$(pwd)/build/cuda-venv/bin/python}
export PATH=/usr/local/cuda-13.0/bin:$PATH
inc=$($VPY -c 'from torch.utils.cpp_extension import include_paths; print(" ".join("-I" + p for p in include_paths(device_type="cuda")))' 2>/dev/null || $VPY -c 'from torch.utils.cpp_extension import include_paths; print(" ".join("-I" + p for p in include_paths(True)))')
pyinc=$($VPY -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
common=$($VPY -c 'from torch.utils.cpp_extension import COMMON_NVCC_FLAGS; print(" ".join(COMMON_NVCC_FLAGS))')
mkdir -p /tmp/bt  # the objects
printf '%s\n' "$@" | xargs -P 2 -I{} sh -c "nvcc -O3 -lineinfo $common -std=c++20 --compiler-options '-fPIC' -DPOSATTN_WITH_CUDA -DTORCH_EXTENSION_NAME=_C -D_GLIBCXX_USE_CXX11_ABI=1 $inc -I$pyinc -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90 -c {} -o /tmp/bt/\$(basename {}).o || echo FAIL {}"
