// The definitions of relpos_fast.cuh's FastKernels, included by the translation units in
// cuda/fast/ only.
#pragma once

#include "relpos_fast.cuh"
#include "relpos_fast_backward.cuh"
#include "relpos_fast_forward.cuh"
#include "relpos_fast_offsets.cuh"

namespace posattn::relpos::cuda_fast {

template <typename T, int D>
cudaError_t FastKernels<T, D>::forward(const RelposParams& p, const RelposTensors<T>& t, size_t optin,
                                       cudaStream_t stream) {
  return launch_fast_forward_call<T, D>(p, t, optin, stream);
}

template <typename T, int D>
cudaError_t FastKernels<T, D>::backward(const RelposParams& p, const RelposTensors<T>& t, size_t optin,
                                        cudaStream_t stream) {
  return launch_fast_backward_call<T, D>(p, t, optin, stream);
}

template <typename T, int D>
cudaError_t FastKernels<T, D>::offsets(const RelposParams& p, const RelposTensors<T>& t, size_t optin,
                                       cudaStream_t stream) {
  return launch_fast_offsets_by_rank<T, D>(p, t, optin, stream);
}

template <typename T, int D>
cudaError_t FastKernels<T, D>::attributes(cudaFuncAttributes* attr) {
  return cudaFuncGetAttributes(attr, fast_forward_kernel<T, D, false, 1, 0>);
}

}  // namespace posattn::relpos::cuda_fast
