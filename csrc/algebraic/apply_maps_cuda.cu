// CUDA kernels of apply_maps (float32/float64/float16/bfloat16, accumulation in
// float or double). One thread block per (head, token) when the index is shared
// by the batch (each block applies its maps to the token in every batch
// element), per (batch, head, token) otherwise. dmaps goes into an accumulator
// of the accumulation type with atomics: a map shared by several tokens (grids,
// trees) receives one atomic add per token, a sequence's maps none in conflict.
#include <ATen/AccumulateType.h>
#include <ATen/Dispatch.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "apply_maps_checks.h"

namespace posattn {
namespace algebraic {
namespace {

constexpr int kThreads = 128;

template <typename T, typename Acc>
__global__ void apply_maps_forward_kernel(MapsShape s, const T* __restrict__ x, const T* __restrict__ maps,
                                          const int64_t* __restrict__ index, T* __restrict__ y, int64_t inner_b,
                                          bool transpose) {
  const int64_t t = blockIdx.x;
  const int64_t n = t % s.N, h = (t / s.N) % s.H, b0 = t / (s.N * s.H);
  for (int64_t e = threadIdx.x; e < inner_b * s.D; e += blockDim.x) {
    const int64_t b = b0 + e / s.D, d = e % s.D, a = d / s.m, i = d % s.m;
    const T* M = maps + map_offset(s, index[index_offset(s, b, n, a)], h, a);
    const T* xb = x + x_offset(s, b, h, n, a);
    Acc acc = 0;
    if (!transpose) {
      for (int64_t j = 0; j < s.m; ++j) acc += static_cast<Acc>(M[i * s.m + j]) * static_cast<Acc>(xb[j]);
    } else {  // (M^T x)_i = sum_j M[j, i] x_j
      for (int64_t j = 0; j < s.m; ++j) acc += static_cast<Acc>(M[j * s.m + i]) * static_cast<Acc>(xb[j]);
    }
    y[x_offset(s, b, h, n, a) + i] = static_cast<T>(acc);
  }
}

template <typename T, typename Acc>
__global__ void apply_maps_grad_maps_kernel(MapsShape s, const T* __restrict__ gy, const T* __restrict__ x,
                                            const int64_t* __restrict__ index, Acc* __restrict__ gmaps,
                                            int64_t inner_b) {
  // dM[index[b, n, a], h, a][i, j] += gy[b, h, n, a, i] * x[b, h, n, a, j]
  const int64_t t = blockIdx.x;
  const int64_t n = t % s.N, h = (t / s.N) % s.H, b0 = t / (s.N * s.H);
  const int64_t mm = s.m * s.m;
  for (int64_t e = threadIdx.x; e < s.A * mm; e += blockDim.x) {
    const int64_t a = e / mm, i = (e % mm) / s.m, j = e % s.m;
    if (!s.batched_index) {  // one map for the whole batch: sum first, one atomic
      Acc acc = 0;
      for (int64_t bi = 0; bi < inner_b; ++bi) {
        const int64_t off = x_offset(s, b0 + bi, h, n, a);
        acc += static_cast<Acc>(gy[off + i]) * static_cast<Acc>(x[off + j]);
      }
      atomicAdd(gmaps + map_offset(s, index[index_offset(s, 0, n, a)], h, a) + i * s.m + j, acc);
    } else {
      const int64_t off = x_offset(s, b0, h, n, a);
      const Acc v = static_cast<Acc>(gy[off + i]) * static_cast<Acc>(x[off + j]);
      atomicAdd(gmaps + map_offset(s, index[index_offset(s, b0, n, a)], h, a) + i * s.m + j, v);
    }
  }
}

void check_cuda(const at::Tensor& x) {
  TORCH_CHECK_VALUE(x.is_cuda(), "apply_maps (CUDA): x must be a CUDA tensor");
}

int64_t num_blocks(const MapsShape& s) { return (s.batched_index ? s.B : 1) * s.H * s.N; }

at::Tensor apply_maps_cuda(const at::Tensor& x_in, const at::Tensor& maps_in, const at::Tensor& index_in) {
  const MapsShape s = check_apply_maps_inputs(x_in, maps_in, index_in);
  check_cuda(x_in);
  check_index_range(index_in, s.P);
  const c10::cuda::CUDAGuard guard(x_in.device());
  const at::Tensor x = x_in.contiguous(), maps = maps_in.contiguous(), index = index_in.contiguous();
  at::Tensor y = at::empty(x.sizes(), x.options());
  if (y.numel() == 0) return y;
  const int64_t inner_b = s.batched_index ? 1 : s.B;
  auto stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "apply_maps_cuda", [&] {
    using acc_t = at::acc_type<scalar_t, true>;
    apply_maps_forward_kernel<scalar_t, acc_t><<<num_blocks(s), kThreads, 0, stream>>>(
        s, x.data_ptr<scalar_t>(), maps.data_ptr<scalar_t>(), index.data_ptr<int64_t>(), y.data_ptr<scalar_t>(),
        inner_b, false);
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return y;
}

std::tuple<at::Tensor, at::Tensor> apply_maps_backward_cuda(const at::Tensor& grad_y_in, const at::Tensor& x_in,
                                                            const at::Tensor& maps_in, const at::Tensor& index_in,
                                                            bool need_x, bool need_maps) {
  const MapsShape s = check_apply_maps_inputs(x_in, maps_in, index_in);
  check_grad_y(grad_y_in, x_in);
  check_cuda(x_in);
  check_index_range(index_in, s.P);
  const c10::cuda::CUDAGuard guard(x_in.device());
  const at::Tensor x = x_in.contiguous(), maps = maps_in.contiguous(), index = index_in.contiguous();
  const at::Tensor gy = grad_y_in.contiguous();
  at::Tensor gx = need_x ? at::empty(x.sizes(), x.options()) : at::empty({0}, x.options());
  at::Tensor gmaps = need_maps ? at::zeros(maps.sizes(), maps.options()) : at::empty({0}, x.options());
  if (x.numel() == 0) return {need_x ? gx.zero_() : gx, gmaps};
  const int64_t inner_b = s.batched_index ? 1 : s.B;
  auto stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "apply_maps_backward_cuda", [&] {
    using acc_t = at::acc_type<scalar_t, true>;
    if (need_x) {
      apply_maps_forward_kernel<scalar_t, acc_t><<<num_blocks(s), kThreads, 0, stream>>>(
          s, gy.data_ptr<scalar_t>(), maps.data_ptr<scalar_t>(), index.data_ptr<int64_t>(), gx.data_ptr<scalar_t>(),
          inner_b, true);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    }
    if (need_maps) {
      at::Tensor acc = at::zeros(maps.sizes(), maps.options().dtype(c10::CppTypeToScalarType<acc_t>::value));
      apply_maps_grad_maps_kernel<scalar_t, acc_t><<<num_blocks(s), kThreads, 0, stream>>>(
          s, gy.data_ptr<scalar_t>(), x.data_ptr<scalar_t>(), index.data_ptr<int64_t>(), acc.data_ptr<acc_t>(),
          inner_b);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
      gmaps.copy_(acc);
    }
  });
  return {gx, gmaps};
}

}  // namespace

TORCH_LIBRARY_IMPL(posattn, CUDA, m) {
  m.impl("apply_maps", &apply_maps_cuda);
  m.impl("apply_maps_backward", &apply_maps_backward_cuda);
}

}  // namespace algebraic
}  // namespace posattn
