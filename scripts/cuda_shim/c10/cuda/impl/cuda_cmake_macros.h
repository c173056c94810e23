// Stand-in for the header a CUDA build of torch generates (CPU wheels do not
// ship it), used only by scripts/compile_cuda.sh to compile-check the CUDA
// sources on machines with a CPU-only torch. Mirrors torch's generated file.
#pragma once
#define C10_CUDA_BUILD_SHARED_LIBS
