// The fast path's kernels of relpos_attention for float inputs (TF32 tensor cores) and D = 64
// (see ../relpos_fast.cuh).
#include "../relpos_fast_instance.cuh"

template struct posattn::relpos::cuda_fast::FastKernels<float, 64>;
