// The tiled tensor-core kernels of relpos_attention as the entry point calls
// them (the forward, and d rel, d bias, d sigma of a backward; the tiled backward's d q, d k,
// d v kernels are gone): one set per (element type, head dim), each compiled in a translation
// unit of its own (cuda/tiled/relpos_tiled_<type>_d<D>.cu, flash-attention's
// flash_fwd_hdim*_*.cu) so that a build compiles the nine in parallel. The kernels
// are in relpos_tiled_forward.cuh and relpos_tiled_offsets.cuh (on relpos_tiled_backward.cuh's
// pair_gradients); which calls they take, in relpos_plan.cuh.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "../core/relpos_tensors.h"
#include "relpos_tiled_common.cuh"

namespace posattn {
namespace relpos {
namespace cuda_tiled {

template <typename CT, int D>
struct TiledKernels {
  // out and lse
  static cudaError_t forward(const TiledArgs& a, const RelposTensors<CT>& t, cudaStream_t stream);
  // d rel, d bias (through t.drel_acc / t.dbias_acc) and the d sigma partials
  static cudaError_t backward_offsets(const TiledArgs& a, const RelposTensors<CT>& t, cudaStream_t stream);
  // the forward kernel's attributes (which code the build has for the current device)
  static cudaError_t attributes(cudaFuncAttributes* attr);
};

// compiled in cuda/tiled/*.cu, not where this header is included
extern template struct TiledKernels<__half, 32>;
extern template struct TiledKernels<__half, 64>;
extern template struct TiledKernels<__half, 128>;
extern template struct TiledKernels<__nv_bfloat16, 32>;
extern template struct TiledKernels<__nv_bfloat16, 64>;
extern template struct TiledKernels<__nv_bfloat16, 128>;
extern template struct TiledKernels<float, 32>;
extern template struct TiledKernels<float, 64>;
extern template struct TiledKernels<float, 128>;

}  // namespace cuda_tiled
}  // namespace relpos
}  // namespace posattn
