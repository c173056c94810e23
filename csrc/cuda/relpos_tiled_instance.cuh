// The definitions behind relpos_tiled.cuh's TiledKernels, included by the
// translation units of cuda/tiled/ (one explicit instantiation each).
#pragma once

#include "relpos_tiled.cuh"
#include "relpos_tiled_forward.cuh"
#include "relpos_tiled_offsets.cuh"

namespace posattn {
namespace relpos {
namespace cuda_tiled {

template <typename CT, int D>
cudaError_t TiledKernels<CT, D>::forward(const TiledArgs& a, const RelposTensors<CT>& t,
                                         cudaStream_t stream) {
  return launch_forward<CT, D>(a, t, stream);
}

template <typename CT, int D>
cudaError_t TiledKernels<CT, D>::backward_offsets(const TiledArgs& a, const RelposTensors<CT>& t,
                                                  cudaStream_t stream) {
  return launch_backward_offsets<CT, D>(a, t, stream);
}

template <typename CT, int D>
cudaError_t TiledKernels<CT, D>::attributes(cudaFuncAttributes* attr) {
  return forward_attributes<CT, D>(attr);
}

}  // namespace cuda_tiled
}  // namespace relpos
}  // namespace posattn
