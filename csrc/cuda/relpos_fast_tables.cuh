// The terms of a logit that depend only on its offset, for the fast path's forward
// (relpos_fast_forward.cuh): RelposTensors::offset_add and offset_mul, (H, U) in float32,
// computed once per call from bias and sigma by one thread per (head, offset row):
//   add = bias[u] - quad (span add), bias[u] (span multiply, or no span)
//   mul = exp(-quad) (span multiply only)
//   quad = 0.5 sum_d (delta_d / max(n_d - 1, 1) / sigma_hd)^2   (float64, then rounded)
// so that a logit is (scale (q k + q_pos rel[u]) + add[u]) mul[u], the general path's
// span_logit (relpos_general.cuh). Sigma is checked on the device as there.
// A packed call with a span (sample_tables) has a table per sample, as a call of the sample's
// grid would (its own normalisation n_d(s)), in one of two layouts (offset_table_len):
// - own (packed_span_fits: 16-bit types, D <= 64): sample s's rows, delta + n(s) - 1 row-major,
//   from slot packed_offsets[s] << table_shift on in each head's table; as prod_d (2 n_d(s) - 1)
//   < 2^G tokens(s), the samples' tables never overlap. Compact, but the kernels index it by the
//   sample's row strides, registers that the other instances do not have;
// - wide (the others): U rows per sample, the max grid's (delta + max_grid - 1, as rel and bias),
//   sample s's from row s U: the kernels index it as they index the head's table, from another
//   base. S U floats per head: taken where that is at most q's T D (wide_tables_fit).
// The bias rows stay the max grid's.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "../core/grid_index.h"
#include "../core/relpos_params.h"
#include "../core/relpos_tensors.h"
#include "cuda_common.cuh"
#include "relpos_packed.cuh"
#include "relpos_head.cuh"

namespace posattn::relpos::cuda_fast {

// Which tables a call has: add with a bias or span add, mul with span multiply.
inline bool has_offset_add(const RelposParams& p) {
  return p.has_bias || (p.has_sigma && p.mode == SpanMode::kAdd);
}
inline bool has_offset_mul(const RelposParams& p) {
  return p.has_sigma && p.mode == SpanMode::kMultiply;
}

// A table per sample (a packed call with a span: the hot kernels then only copy its rows).
inline bool sample_tables(const RelposParams& p) {
  return p.packed_samples > 0 && p.has_sigma;
}
// log2 of a sample's slots per token (its grid's axes, one at least).
__host__ __device__ inline int table_shift(const RelposParams& p) {
  return p.g.ndim > 1 ? p.g.ndim : 1;
}
// Whether the instances of packed calls (PACKED) of the fast forward and backward take a span
// with the own layout of the sample tables, and the fast offset kernel's take a span at all: at
// 16-bit types and D <= 64 (the own tables' row strides, and the offset kernel's copies of each
// sample's entries and d sigma per sample, cost registers that the float32 instances and 16-bit
// D = 128 do not have: they would spill). The forward and backward's other instances take the wide
// layout (wide_tables_fit); the plan sends their d rel, d bias, d sigma to the general kernels.
__host__ __device__ constexpr bool packed_span_fits(int elem_bytes, int d) {
  return elem_bytes == 2 && d <= 64;
}
template <typename T, int D>
__host__ __device__ constexpr bool packed_span_fits() {
  return packed_span_fits(sizeof(T), D);
}
// Whether a packed call's wide sample tables (S U floats per head) are at most the size of q's
// (T D): the fast kernels' instances outside packed_span_fits take its span only then.
__host__ __device__ inline bool wide_tables_fit(const RelposParams& p) {
  return p.packed_samples * p.U <= p.N * p.D;
}
// Whether the packed instances of the fast forward (or backward) on NDIM-axis grids take a span
// with the wide tables. Their base per sample is a register that the kernels' others can
// recompute from the parameters; ptxas (scripts/ptxas_fast.sh) spilled these with it: the float32
// D = 128 3-D forward (99 KiB class: 20-32 bytes on sm_80 and sm_86) and the 16-bit D = 128 1-D
// query-major backward (A100 class: 8 bytes on sm_80). Those keep the code of before, and the
// plan gives such calls the general kernels.
template <typename T, int D>
__host__ __device__ constexpr bool packed_wide_fits(bool backward, int ndim) {
  if (packed_span_fits<T, D>()) return false;  // (the own tables)
  if (D == 128 && sizeof(T) == 4 && !backward && ndim == 3) return false;
  if (D == 128 && sizeof(T) == 2 && backward && ndim == 1) return false;
  return true;
}
// Whether a call's sample tables are in the own layout (else wide), for element type T.
template <typename T>
bool own_tables(const RelposParams& p) {
  return sample_tables(p) && packed_span_fits(sizeof(T), static_cast<int>(p.D));
}
// Each head's floats in add / mul.
template <typename T>
int64_t offset_table_len(const RelposParams& p) {
  if (!sample_tables(p)) return p.U;
  return own_tables<T>(p) ? p.N << table_shift(p) : p.packed_samples * p.U;
}

// add[at] and mul[at] (either may be null) of head h's offset delta (kept axes) on a grid of
// extents n (the span's normalisation); the bias row: delta's on the max grid.
template <typename T>
__device__ inline void write_offset_entry(const RelposParams& p, int64_t h, const int64_t* delta,
                                          const int64_t* n, const T* __restrict__ bias,
                                          const double* __restrict__ sigma, float* __restrict__ add,
                                          float* __restrict__ mul, int64_t at) {
  double quad = 0.0;
  int64_t row = 0;  // (of bias)
  for (int d = 0; d < p.g.ndim; ++d) {
    if (p.has_sigma) {
      const double x = normalised_offset(delta[d], n[d]) / sigma[h * p.G_in + p.g.axis[d]];
      quad += 0.5 * x * x;
    }
    row += (delta[d] + p.g.n[d] - 1) * p.rel_stride[d];
  }
  const double b = p.has_bias ? static_cast<double>(posattn::cuda::to_acc<float>(bias[h * p.U + row])) : 0.0;
  if (add != nullptr) add[at] = static_cast<float>(p.mode == SpanMode::kAdd ? b - quad : b);
  if (mul != nullptr) mul[at] = static_cast<float>(exp(-quad));
}

template <typename T>
__global__ void offset_tables_kernel(RelposParams p, const T* __restrict__ bias,
                                     const double* __restrict__ sigma, float* __restrict__ add,
                                     float* __restrict__ mul) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= p.H * p.U) return;
  const int64_t h = i / p.U, u = i % p.U;
  if (u == 0) check_head_sigma(p, h, sigma);
  int64_t delta[kMaxGridDims];
  offset_of_row(u, p.g.n, p.g.ndim, delta);
  write_offset_entry(p, h, delta, p.g.n, bias, sigma, add, mul, i);
}

// sample_tables: slot v of head h: row v - (packed_offsets[s] << table_shift) of sample s's table,
// s the sample of token v >> table_shift (slots past its rows, of the tail or of a sample whose
// values are bad, which the schedule reports: left alone, never read).
template <typename T>
__global__ void sample_tables_kernel(RelposParams p, const int* __restrict__ off,
                                     const int* __restrict__ shapes, const T* __restrict__ bias,
                                     const double* __restrict__ sigma, float* __restrict__ add,
                                     float* __restrict__ mul) {
  const int shift = table_shift(p);
  const int64_t len = p.N << shift, i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= p.H * len) return;
  const int64_t h = i / len, v = i % len;
  if (v == 0) check_head_sigma(p, h, sigma);
  const int64_t s = cuda_packed::packed_sample_of(p, off, v >> shift);
  int64_t n[kMaxGridDims], tokens = 0;
  if (s < 0 || !cuda_packed::packed_extents(p, off, shapes, s, n, &tokens)) return;
  const int64_t u = v - (static_cast<int64_t>(off[s]) << shift);
  int64_t rows = 1;
  for (int d = 0; d < p.g.ndim; ++d) rows *= 2 * n[d] - 1;
  if (u >= rows) return;
  int64_t delta[kMaxGridDims];
  offset_of_row(u, n, p.g.ndim, delta);
  write_offset_entry(p, h, delta, n, bias, sigma, add, mul, i);
}

// wide sample tables: row u of sample s of head h at (h S + s) U + u: delta of row u on the max
// grid, normalised by the sample's extents (rows past them pair only with keys outside the
// sample, which no query keeps: finite, never used; a sample whose values are bad, which the
// schedule reports: left alone, never read).
template <typename T>
__global__ void wide_sample_tables_kernel(RelposParams p, const int* __restrict__ off,
                                          const int* __restrict__ shapes, const T* __restrict__ bias,
                                          const double* __restrict__ sigma, float* __restrict__ add,
                                          float* __restrict__ mul) {
  const int64_t len = p.packed_samples * p.U, i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= p.H * len) return;
  const int64_t h = i / len, s = i % len / p.U, u = i % p.U;
  if (i % len == 0) check_head_sigma(p, h, sigma);
  int64_t n[kMaxGridDims], tokens = 0;
  if (!cuda_packed::packed_extents(p, off, shapes, s, n, &tokens)) return;
  int64_t delta[kMaxGridDims];
  offset_of_row(u, p.g.n, p.g.ndim, delta);
  write_offset_entry(p, h, delta, n, bias, sigma, add, mul, i);
}

// Fills add (has_offset_add) and mul (has_offset_mul), each (H, offset_table_len<T>) floats, on
// `stream`.
template <typename T>
cudaError_t launch_offset_tables(const RelposParams& p, const RelposTensors<T>& t, float* add, float* mul,
                                 cudaStream_t stream) {
  const int64_t n = p.H * offset_table_len<T>(p);
  if (n == 0 || (add == nullptr && mul == nullptr)) return cudaSuccess;
  constexpr int kBlock = 256;
  const int64_t blocks = (n + kBlock - 1) / kBlock;
  if (blocks >= (int64_t{1} << 31)) return cudaErrorInvalidValue;
  if (sample_tables(p) && !own_tables<T>(p))
    wide_sample_tables_kernel<T><<<static_cast<unsigned>(blocks), kBlock, 0, stream>>>(
        p, t.packed_offsets, t.packed_shapes, t.bias, t.sigma, add, mul);
  else if (sample_tables(p))
    sample_tables_kernel<T><<<static_cast<unsigned>(blocks), kBlock, 0, stream>>>(
        p, t.packed_offsets, t.packed_shapes, t.bias, t.sigma, add, mul);
  else
    offset_tables_kernel<T>
        <<<static_cast<unsigned>(blocks), kBlock, 0, stream>>>(p, t.bias, t.sigma, add, mul);
  return cudaGetLastError();
}

}  // namespace posattn::relpos::cuda_fast
