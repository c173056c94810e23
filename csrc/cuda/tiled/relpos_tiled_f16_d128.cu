// The tiled kernels of relpos_attention for __half inputs and D = 128 (see ../relpos_tiled.cuh).
#include "../relpos_tiled_instance.cuh"

template struct posattn::relpos::cuda_tiled::TiledKernels<__half, 128>;
