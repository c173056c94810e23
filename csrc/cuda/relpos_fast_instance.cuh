// The definitions of relpos_fast.cuh's FastKernels, included by the translation units in
// cuda/fast/ only.
#pragma once

#include <type_traits>

#include "relpos_fast.cuh"
#include "relpos_fast_backward.cuh"
#include "relpos_fast_forward.cuh"
#include "relpos_fast_offsets.cuh"

namespace posattn::relpos::cuda_fast {

template <typename T, int D>
cudaError_t FastKernels<T, D>::forward(const RelposParams& p, const RelposTensors<T>& t,
                                       cudaStream_t stream) {
  return launch_fast_forward_call<T, D>(p, t, stream);
}

template <typename T, int D>
cudaError_t FastKernels<T, D>::backward(const RelposParams& p, const RelposTensors<T>& t,
                                        cudaStream_t stream) {
  return launch_fast_backward_call<T, D>(p, t, stream);
}

// (float: not the offset kernel so far; the plan gives d rel, d bias, d sigma to the tiled one)

template <typename T, int D>
cudaError_t FastKernels<T, D>::offsets(const RelposParams& p, const RelposTensors<T>& t,
                                       cudaStream_t stream) {
  if constexpr (std::is_same_v<T, float>)
    return cudaErrorNotSupported;
  else
    return launch_fast_offsets_by_rank<T, D>(p, t, stream);
}

}  // namespace posattn::relpos::cuda_fast
