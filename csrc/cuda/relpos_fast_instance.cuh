// The definitions of relpos_fast.cuh's FastKernels, included by the translation units in
// cuda/fast/ only.
#pragma once

#include "relpos_fast.cuh"
#include "relpos_fast_forward.cuh"

namespace posattn::relpos::cuda_fast {

template <typename T, int D>
cudaError_t FastKernels<T, D>::forward(const RelposParams& p, const RelposTensors<T>& t,
                                       cudaStream_t stream) {
  if (p.g.ndim == 3) return launch_fast_forward<T, D, true, 3>(p, t, stream);
  if (p.g.ndim == 2) return launch_fast_forward<T, D, true, 2>(p, t, stream);
  return launch_fast_forward<T, D, true, 1>(p, t, stream);
}

}  // namespace posattn::relpos::cuda_fast
