// The fast path's kernels of relpos_attention for __nv_bfloat16 inputs and D = 32 (see ../relpos_fast.cuh).
#include "../relpos_fast_instance.cuh"

template struct posattn::relpos::cuda_fast::FastKernels<__nv_bfloat16, 32>;
