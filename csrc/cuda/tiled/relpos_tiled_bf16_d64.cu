// The tiled kernels of relpos_attention for __nv_bfloat16 inputs and D = 64 (see ../relpos_tiled.cuh).
#include "../relpos_tiled_instance.cuh"

template struct posattn::relpos::cuda_tiled::TiledKernels<__nv_bfloat16, 64>;
