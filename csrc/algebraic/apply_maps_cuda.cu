// CUDA kernels of apply_maps (float32/float64/float16/bfloat16, accumulation in
// float or double). One thread block per (head, token) when the index is shared
// by the batch (each block applies its maps to the token in every batch
// element), per (batch, head, token) otherwise. A block's A maps are the same
// for all its rows, so with a shared index they are staged in shared memory
// when they fit (48 KiB; rows padded to m + 1 values against bank conflicts);
// the index values are checked on the device (a device-side assertion, no host
// synchronisation: the op can be captured in a CUDA graph).
//
// dmaps: by default each block adds its outer products into an accumulator of
// the accumulation type with atomics (a map shared by several tokens, as on
// grids and trees, receives one add per token; the order varies from run to
// run). Under torch.use_deterministic_algorithms(True) it is computed instead
// as the (B, H, N, A, m, m) outer products reduced by index_put_ with
// accumulate, which PyTorch sums in a fixed order (more memory: m times x).
#include <ATen/AccumulateType.h>
#include <ATen/Context.h>
#include <ATen/Dispatch.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <climits>

#include "apply_maps_checks.h"

namespace posattn {
namespace algebraic {
namespace {

constexpr int kThreads = 128;
constexpr size_t kStageBytes = 48 * 1024;

// Staged maps have rows of m + 1 values, so that lanes reading one column of
// consecutive rows hit different banks.
inline int64_t staged_values(const MapsShape& s) { return s.A * s.m * (s.m + 1); }

// Whether a block's A maps are staged in shared memory: only when the block
// applies them to several rows (a shared index, B > 1) and they fit.
template <typename T>
bool stage_maps(const MapsShape& s, int64_t inner_b) {
  return inner_b > 1 &&
         static_cast<size_t>(staged_values(s)) * sizeof(T) + static_cast<size_t>(s.A) * sizeof(int64_t) <= kStageBytes;
}

template <typename T>
size_t smem_bytes(const MapsShape& s, int64_t inner_b) {
  return static_cast<size_t>(s.A) * sizeof(int64_t) +
         (stage_maps<T>(s, inner_b) ? static_cast<size_t>(staged_values(s)) * sizeof(T) : 0);
}

// The block's maps: moff[a] is the offset of map a in `base` (shared memory
// when staged, else maps itself) and ld its row stride (m + 1 when staged, else
// m). Checks the index values on the device.
template <typename T>
__device__ const T* load_block_maps(const MapsShape& s, const T* __restrict__ maps, const int64_t* __restrict__ index,
                                    int64_t b0, int64_t n, int64_t h, bool staged, unsigned char* smem,
                                    int64_t*& moff, int64_t& ld) {
  moff = reinterpret_cast<int64_t*>(smem);
  T* maps_s = reinterpret_cast<T*>(moff + s.A);
  const int64_t mm = s.m * s.m;
  ld = staged ? s.m + 1 : s.m;
  for (int64_t a = threadIdx.x; a < s.A; a += blockDim.x) {
    const int64_t p = index[index_offset(s, b0, n, a)];
    CUDA_KERNEL_ASSERT_MSG(p >= 0 && p < s.P, "apply_maps: index values must be in [0, P)");
    moff[a] = staged ? a * s.m * (s.m + 1) : map_offset(s, p, h, a);
  }
  __syncthreads();
  if (!staged) return maps;
  for (int64_t e = threadIdx.x; e < s.A * mm; e += blockDim.x) {  // rows of consecutive maps: coalesced
    const int64_t a = e / mm, i = (e % mm) / s.m, j = e % s.m;
    const int64_t p = index[index_offset(s, b0, n, a)];
    maps_s[moff[a] + i * (s.m + 1) + j] = (p >= 0 && p < s.P) ? maps[map_offset(s, p, h, a) + e % mm] : T(0);
  }
  __syncthreads();
  return maps_s;
}

template <typename T, typename Acc>
__global__ void __launch_bounds__(kThreads)
    apply_maps_forward_kernel(MapsShape s, const T* __restrict__ x, const T* __restrict__ maps,
                              const int64_t* __restrict__ index, T* __restrict__ y, int64_t inner_b, bool transpose,
                              bool staged) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const int64_t t = blockIdx.x;
  const int64_t n = t % s.N, h = (t / s.N) % s.H, b0 = t / (s.N * s.H);
  int64_t* moff;
  int64_t ld;
  const T* base = load_block_maps<T>(s, maps, index, b0, n, h, staged, smem_raw, moff, ld);
  for (int64_t e = threadIdx.x; e < inner_b * s.D; e += blockDim.x) {
    const int64_t b = b0 + e / s.D, d = e % s.D, a = d / s.m, i = d % s.m;
    const T* M = base + moff[a];
    const T* xb = x + x_offset(s, b, h, n, a);
    Acc acc = 0;
    if (!transpose) {
      for (int64_t j = 0; j < s.m; ++j) acc += static_cast<Acc>(M[i * ld + j]) * static_cast<Acc>(xb[j]);
    } else {  // (M^T x)_i = sum_j M[j, i] x_j
      for (int64_t j = 0; j < s.m; ++j) acc += static_cast<Acc>(M[j * ld + i]) * static_cast<Acc>(xb[j]);
    }
    y[x_offset(s, b, h, n, a) + i] = static_cast<T>(acc);
  }
}

template <typename T, typename Acc>
__global__ void __launch_bounds__(kThreads)
    apply_maps_grad_maps_kernel(MapsShape s, const T* __restrict__ gy, const T* __restrict__ x,
                                const int64_t* __restrict__ index, Acc* __restrict__ gmaps, int64_t inner_b) {
  // dM[index[b, n, a], h, a][i, j] += gy[b, h, n, a, i] * x[b, h, n, a, j]
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const int64_t t = blockIdx.x;
  const int64_t n = t % s.N, h = (t / s.N) % s.H, b0 = t / (s.N * s.H);
  int64_t* moff;
  int64_t ld;
  load_block_maps<T>(s, nullptr, index, b0, n, h, /*staged=*/false, smem_raw, moff, ld);
  const int64_t mm = s.m * s.m;
  for (int64_t e = threadIdx.x; e < s.A * mm; e += blockDim.x) {
    const int64_t a = e / mm, i = (e % mm) / s.m, j = e % s.m;
    Acc acc = 0;  // one map for every row of the block: sum first, one atomic
    for (int64_t bi = 0; bi < inner_b; ++bi) {
      const int64_t off = x_offset(s, b0 + bi, h, n, a);
      acc += static_cast<Acc>(gy[off + i]) * static_cast<Acc>(x[off + j]);
    }
    atomicAdd(gmaps + moff[a] + i * s.m + j, acc);
  }
}

void check_cuda(const at::Tensor& x) {
  TORCH_CHECK_VALUE(x.is_cuda(), "apply_maps (CUDA): x must be a CUDA tensor");
}

int64_t num_blocks(const MapsShape& s) {
  const int64_t blocks = (s.batched_index ? s.B : 1) * s.H * s.N;
  TORCH_CHECK_VALUE(blocks <= INT_MAX, "apply_maps (CUDA): ", blocks,
                    " thread blocks needed, more than a launch allows; split the batch");
  // the block's map offsets (A int64) live in shared memory
  TORCH_CHECK_VALUE(s.A * static_cast<int64_t>(sizeof(int64_t)) <= static_cast<int64_t>(kStageBytes),
                    "apply_maps (CUDA): A = ", s.A, " blocks per token is more than the kernels take (",
                    kStageBytes / sizeof(int64_t), ")");
  return blocks;
}

// The index range check without a host synchronisation, for the paths that
// launch no kernel reading the index (a device-side assertion, as in the kernels).
void assert_index_range_async(const at::Tensor& index, int64_t P) {
  if (index.numel() > 0)
    at::_assert_async(((index >= 0) & (index < P)).all(), "apply_maps: index values must be in [0, P)");
}

// The deterministic d maps: every token's outer products, summed into the maps
// by index_put_ with accumulate (a fixed order under deterministic algorithms).
at::Tensor grad_maps_deterministic(const MapsShape& s, const at::Tensor& gy, const at::Tensor& x,
                                   const at::Tensor& index, const at::Tensor& maps) {
  const auto acc = x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  const at::Tensor g = gy.to(acc).view({s.B, s.H, s.N, s.A, s.m, 1});
  const at::Tensor xv = x.to(acc).view({s.B, s.H, s.N, s.A, 1, s.m});
  const at::Tensor outer = g * xv;  // (B, H, N, A, m, m)
  const at::Tensor p = (s.batched_index ? index.view({s.B, 1, s.N, s.A}) : index.view({1, 1, s.N, s.A}))
                           .expand({s.B, s.H, s.N, s.A});
  const at::TensorOptions lo = index.options();
  const at::Tensor hh = at::arange(s.H, lo).view({1, s.H, 1, 1}).expand({s.B, s.H, s.N, s.A});
  const at::Tensor aa = at::arange(s.A, lo).view({1, 1, 1, s.A}).expand({s.B, s.H, s.N, s.A});
  at::Tensor out = at::zeros(maps.sizes(), maps.options().dtype(acc));
  out.index_put_({p, hh, aa}, outer, /*accumulate=*/true);
  return out.to(maps.scalar_type());
}

at::Tensor apply_maps_cuda(const at::Tensor& x_in, const at::Tensor& maps_in, const at::Tensor& index_in) {
  const MapsShape s = check_apply_maps_inputs(x_in, maps_in, index_in);
  check_cuda(x_in);
  const c10::cuda::CUDAGuard guard(x_in.device());
  const at::Tensor x = x_in.contiguous(), maps = maps_in.contiguous(), index = index_in.contiguous();
  at::Tensor y = at::empty(x.sizes(), x.options());
  if (y.numel() == 0) {
    assert_index_range_async(index, s.P);
    return y;
  }
  const int64_t inner_b = s.batched_index ? 1 : s.B;
  auto stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "apply_maps_cuda", [&] {
    using acc_t = at::acc_type<scalar_t, true>;
    apply_maps_forward_kernel<scalar_t, acc_t><<<num_blocks(s), kThreads, smem_bytes<scalar_t>(s, inner_b), stream>>>(
        s, x.data_ptr<scalar_t>(), maps.data_ptr<scalar_t>(), index.data_ptr<int64_t>(), y.data_ptr<scalar_t>(),
        inner_b, false, stage_maps<scalar_t>(s, inner_b));
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return y;
}

std::tuple<at::Tensor, at::Tensor> apply_maps_backward_cuda(const at::Tensor& grad_y_in, const at::Tensor& x_in,
                                                            const at::Tensor& maps_in, const at::Tensor& index_in,
                                                            bool need_x, bool need_maps) {
  const MapsShape s = check_apply_maps_inputs(x_in, maps_in, index_in);
  check_grad_y(grad_y_in, x_in);
  check_cuda(x_in);
  const c10::cuda::CUDAGuard guard(x_in.device());
  const at::Tensor x = x_in.contiguous(), maps = maps_in.contiguous(), index = index_in.contiguous();
  const at::Tensor gy = grad_y_in.contiguous();
  at::Tensor gx = need_x ? at::empty(x.sizes(), x.options()) : at::empty({0}, x.options());
  if (x.numel() == 0) {
    assert_index_range_async(index, s.P);
    return {need_x ? gx.zero_() : gx, need_maps ? at::zeros(maps.sizes(), maps.options()) : at::empty({0}, x.options())};
  }
  at::Tensor gmaps = at::empty({0}, x.options());
  const int64_t inner_b = s.batched_index ? 1 : s.B;
  const bool deterministic = at::globalContext().deterministicAlgorithms();
  auto stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "apply_maps_backward_cuda", [&] {
    using acc_t = at::acc_type<scalar_t, true>;
    if (need_x) {
      apply_maps_forward_kernel<scalar_t, acc_t><<<num_blocks(s), kThreads, smem_bytes<scalar_t>(s, inner_b), stream>>>(
          s, gy.data_ptr<scalar_t>(), maps.data_ptr<scalar_t>(), index.data_ptr<int64_t>(), gx.data_ptr<scalar_t>(),
          inner_b, true, stage_maps<scalar_t>(s, inner_b));
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    }
    if (need_maps && deterministic) {
      if (!need_x) assert_index_range_async(index, s.P);  // index_put_ would wrap negative values
      gmaps = grad_maps_deterministic(s, gy, x, index, maps);
    } else if (need_maps) {
      // float32 / float64 accumulate in place; half types through one buffer of the accumulation type
      constexpr bool same = std::is_same<scalar_t, acc_t>::value;
      at::Tensor acc = at::zeros(maps.sizes(), maps.options().dtype(c10::CppTypeToScalarType<acc_t>::value));
      apply_maps_grad_maps_kernel<scalar_t, acc_t>
          <<<num_blocks(s), kThreads, static_cast<size_t>(s.A) * sizeof(int64_t), stream>>>(
              s, gy.data_ptr<scalar_t>(), x.data_ptr<scalar_t>(), index.data_ptr<int64_t>(), acc.data_ptr<acc_t>(),
              inner_b);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
      gmaps = same ? acc : acc.to(maps.scalar_type());
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
