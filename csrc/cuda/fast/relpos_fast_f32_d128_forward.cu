// The fast path's forward kernels of relpos_attention for float inputs (TF32 tensor cores) and
// D = 128 (see ../relpos_fast.cuh). float32 at D = 128 is the one (type, head dim) whose forward,
// backward and offset kernels are compiled apart: in one translation unit NVVM compiled the
// positional forward's instances otherwise (2026-12-04, 9572d24: 4,979 PTX registers against
// 5,170 alone) and ptxas gave them stacks of 8-160 bytes, spills of up to 192 bytes on sm_80
// (alone: none; BENCHMARKS.md).
#include "../relpos_fast_instance.cuh"

template cudaError_t posattn::relpos::cuda_fast::FastKernels<float, 128>::forward(
    const posattn::RelposParams&, const posattn::RelposTensors<float>&, size_t, cudaStream_t);
template cudaError_t posattn::relpos::cuda_fast::FastKernels<float, 128>::attributes(cudaFuncAttributes*);
