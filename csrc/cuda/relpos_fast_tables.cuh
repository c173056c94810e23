// The terms of a logit that depend only on its offset, for the fast path's forward
// (relpos_fast_forward.cuh): RelposTensors::offset_add and offset_mul, (H, U) in float32,
// computed once per call from bias and sigma by one thread per (head, offset row):
//   add = bias[u] - quad (span add), bias[u] (span multiply, or no span)
//   mul = exp(-quad) (span multiply only)
//   quad = 0.5 sum_d (delta_d / max(n_d - 1, 1) / sigma_hd)^2   (float64, then rounded)
// so that a logit is (scale (q k + q_pos rel[u]) + add[u]) mul[u], the general path's
// span_logit (relpos_general.cuh). Sigma is checked on the device as there.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "../core/grid_index.h"
#include "../core/relpos_params.h"
#include "../core/relpos_tensors.h"
#include "cuda_common.cuh"
#include "relpos_head.cuh"

namespace posattn::relpos::cuda_fast {

// Which tables a call has: add with a bias or span add, mul with span multiply.
inline bool has_offset_add(const RelposParams& p) {
  return p.has_bias || (p.has_sigma && p.mode == SpanMode::kAdd);
}
inline bool has_offset_mul(const RelposParams& p) {
  return p.has_sigma && p.mode == SpanMode::kMultiply;
}

template <typename T>
__global__ void offset_tables_kernel(RelposParams p, const T* __restrict__ bias,
                                     const double* __restrict__ sigma, float* __restrict__ add,
                                     float* __restrict__ mul) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= p.H * p.U) return;
  const int64_t h = i / p.U, u = i % p.U;
  if (u == 0) check_head_sigma(p, h, sigma);
  double quad = 0.0;
  if (p.has_sigma) {
    int64_t delta[kMaxGridDims];
    offset_of_row(u, p.g.n, p.g.ndim, delta);
    for (int d = 0; d < p.g.ndim; ++d) {
      const double x = normalised_offset(delta[d], p.g.n[d]) / sigma[h * p.G_in + p.g.axis[d]];
      quad += 0.5 * x * x;
    }
  }
  const double b = p.has_bias ? static_cast<double>(posattn::cuda::to_acc<float>(bias[i])) : 0.0;
  if (add != nullptr) add[i] = static_cast<float>(p.mode == SpanMode::kAdd ? b - quad : b);
  if (mul != nullptr) mul[i] = static_cast<float>(exp(-quad));
}

// Fills add (has_offset_add) and mul (has_offset_mul), each (H, U) floats, on `stream`.
template <typename T>
cudaError_t launch_offset_tables(const RelposParams& p, const RelposTensors<T>& t, float* add, float* mul,
                                 cudaStream_t stream) {
  const int64_t n = p.H * p.U;
  if (n == 0 || (add == nullptr && mul == nullptr)) return cudaSuccess;
  constexpr int kBlock = 256;
  const int64_t blocks = (n + kBlock - 1) / kBlock;
  if (blocks >= (int64_t{1} << 31)) return cudaErrorInvalidValue;
  offset_tables_kernel<T><<<static_cast<unsigned>(blocks), kBlock, 0, stream>>>(p, t.bias, t.sigma, add, mul);
  return cudaGetLastError();
}

}  // namespace posattn::relpos::cuda_fast
