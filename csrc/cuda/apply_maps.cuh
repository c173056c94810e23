// CUDA kernels of apply_maps (float32/float64/float16/bfloat16, accumulation in
// float or double) and their launchers, torch-free (cuda_common.cuh): the
// extension's glue (csrc/apply_maps/apply_maps_cuda.cu) and the simulator harness
// (tests/cuda_sim/harness.cu) call the launchers at the end.
//
// One thread block per (head, token) when the index is shared by the batch (each
// block applies its maps to the token in every batch element), per (batch, head,
// token) otherwise. A block's A maps are the same for all its rows, so with a
// shared index they are staged in shared memory when they fit (48 KiB; rows
// padded to m + 1 values against bank conflicts); the index values are checked
// on the device (a device-side assertion, no host synchronisation: the op can be
// captured in a CUDA graph).
//
// d maps (launch_grad_maps): each block adds its outer products into an
// accumulator of the accumulation type with atomics (a map shared by several
// tokens, as on grids and trees, receives one add per token; the order varies
// from run to run). The glue has a deterministic alternative.
#pragma once

#include <cstddef>
#include <cstdint>

#include "../core/apply_maps_layout.h"
#include "cuda_common.cuh"

namespace posattn {
namespace apply_maps {

using cuda::acc_t;
using cuda::from_acc;
using cuda::to_acc;

constexpr int kThreads = 128;
constexpr size_t kStageBytes = 48 * 1024;

// Staged maps have rows of m + 1 values, so that lanes reading one column of
// consecutive rows hit different banks.
inline int64_t staged_values(const MapsShape& s) {
  return s.A * s.m * (s.m + 1);
}

// Whether a block's A maps are staged in shared memory: only when the block
// applies them to several rows (a shared index, B > 1) and they fit.
template <typename T>
bool stage_maps(const MapsShape& s, int64_t inner_b) {
  return inner_b > 1 &&
         static_cast<size_t>(staged_values(s)) * sizeof(T) + static_cast<size_t>(s.A) * sizeof(int64_t) <=
             kStageBytes;
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
__device__ const T* load_block_maps(const MapsShape& s, const T* __restrict__ maps,
                                    const int64_t* __restrict__ index, int64_t b0, int64_t n, int64_t h,
                                    bool staged, unsigned char* smem, int64_t*& moff, int64_t& ld) {
  moff = reinterpret_cast<int64_t*>(smem);
  T* maps_s = reinterpret_cast<T*>(moff + s.A);
  const int64_t mm = s.m * s.m;
  ld = staged ? s.m + 1 : s.m;
  for (int64_t a = threadIdx.x; a < s.A; a += blockDim.x) {
    const int64_t p = index[index_offset(s, b0, n, a)];
    POSATTN_DEVICE_ASSERT(p >= 0 && p < s.P, "apply_maps: index values must be in [0, P)");
    moff[a] = staged ? a * s.m * (s.m + 1) : map_offset(s, p, h, a);
  }
  __syncthreads();
  if (!staged) return maps;
  for (int64_t e = threadIdx.x; e < s.A * mm; e += blockDim.x) {  // rows of consecutive maps: coalesced
    const int64_t a = e / mm, i = (e % mm) / s.m, j = e % s.m;
    const int64_t p = index[index_offset(s, b0, n, a)];
    maps_s[moff[a] + i * (s.m + 1) + j] =
        (p >= 0 && p < s.P) ? maps[map_offset(s, p, h, a) + e % mm] : from_acc<T>(0.f);
  }
  __syncthreads();
  return maps_s;
}

template <typename T, typename Acc>
__global__ void __launch_bounds__(kThreads)
    apply_maps_forward_kernel(MapsShape s, const T* __restrict__ x, const T* __restrict__ maps,
                              const int64_t* __restrict__ index, T* __restrict__ y, int64_t inner_b,
                              bool transpose, bool staged) {
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
      for (int64_t j = 0; j < s.m; ++j) acc += to_acc<Acc>(M[i * ld + j]) * to_acc<Acc>(xb[j]);
    } else {  // (M^T x)_i = sum_j M[j, i] x_j
      for (int64_t j = 0; j < s.m; ++j) acc += to_acc<Acc>(M[j * ld + i]) * to_acc<Acc>(xb[j]);
    }
    y[x_offset(s, b, h, n, a) + i] = from_acc<T>(acc);
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
      acc += to_acc<Acc>(gy[off + i]) * to_acc<Acc>(x[off + j]);
    }
    atomicAdd(gmaps + moff[a] + i * s.m + j, acc);
  }
}

// Rows each block applies its maps to: the batch with a shared index, else 1.
inline int64_t rows_per_block(const MapsShape& s) {
  return s.batched_index ? 1 : s.B;
}

// Thread blocks of both kernels (the caller checks the launch's limit).
inline int64_t num_blocks(const MapsShape& s) {
  return (s.batched_index ? s.B : 1) * s.H * s.N;
}

// y = maps[index] x per block (transpose: maps^T, the gradient of x). x, y: (B, H, N, D);
// maps: (P, H, A, m, m); index: (N, A) or (B, N, A), int64.
template <typename T>
cudaError_t launch_apply(const MapsShape& s, const T* x, const T* maps, const int64_t* index, T* y,
                         bool transpose, cudaStream_t stream) {
  const int64_t inner_b = rows_per_block(s);
  return cuda::launch(apply_maps_forward_kernel<T, acc_t<T>>, num_blocks(s), kThreads,
                      smem_bytes<T>(s, inner_b), stream, s, x, maps, index, y, inner_b, transpose,
                      stage_maps<T>(s, inner_b));
}

// gmaps (P, H, A, m, m) in the accumulation type, zeroed by the caller, += the
// outer products gy x^T of every token (atomics).
template <typename T>
cudaError_t launch_grad_maps(const MapsShape& s, const T* gy, const T* x, const int64_t* index,
                             acc_t<T>* gmaps, cudaStream_t stream) {
  return cuda::launch(apply_maps_grad_maps_kernel<T, acc_t<T>>, num_blocks(s), kThreads,
                      static_cast<size_t>(s.A) * sizeof(int64_t), stream, s, gy, x, index, gmaps,
                      rows_per_block(s));
}

}  // namespace apply_maps
}  // namespace posattn
