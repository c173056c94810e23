// Packed calls of relpos_attention on CUDA (posattn.PackedGrids; RelposParams::packed_samples):
// finding a token's sample, a sample as a call of its own grid, and the device-side check of the
// offsets' and shapes' values. Torch-free, shared by the kernels that take packed calls
// (relpos_general.cuh today).
#pragma once

#include <cstdint>

#include "../core/relpos_params.h"
#include "../core/relpos_tensors.h"
#include "cuda_common.cuh"

namespace posattn {
namespace relpos {
namespace cuda_packed {

constexpr int kCheckThreads = 128;

// A packed call (p.packed_samples = S > 0, B = 1, p.N = T): token t belongs to the sample s with
// packed_offsets[s] <= t < packed_offsets[s + 1], or to the tail past packed_offsets[S]. A sample
// is a call of its own grid: packed_sample gives its RelposParams (its extents on the max grid's
// kept axes, its windows capped by them; U and rel_stride stay the max grid's, so that its offset
// rows are the max-grid tables' rows from row_base on) and its tensors (at its first token of the
// slabs of T, the tables at row_base). A sample whose values are out of range or inconsistent is
// left alone (its tokens as tail): relpos_packed_check_kernel, launched first, reports it.

// The sample holding token `tok` by a binary search of the offsets, or -1 (tail).
__device__ inline int64_t packed_sample_of(const RelposParams& p, const int* __restrict__ off, int64_t tok) {
  if (tok < off[0] || tok >= off[p.packed_samples]) return -1;
  int64_t lo = 0, hi = p.packed_samples - 1;  // off[lo] <= tok
  while (lo < hi) {
    const int64_t mid = (lo + hi + 1) / 2;
    if (off[mid] <= tok)
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

// Sample s of packed call p as a call of its own (sp, ts); false where its values are bad.
template <typename T>
__device__ bool packed_sample(const RelposParams& p, const RelposTensors<T>& t, int64_t s, RelposParams& sp,
                              RelposTensors<T>& ts) {
  const int* __restrict__ off = t.packed_offsets;
  const int* __restrict__ shapes = t.packed_shapes;
  const int64_t first = off[s], next = off[s + 1];
  bool valid = first >= 0 && next > first && next <= p.N;
  sp = p;
  sp.packed_samples = 0;
  sp.tok_stride = p.tok_stride;
  int64_t tokens = 1, row_base = 0;
  for (int64_t a = 0, d = 0; a < p.G_in; ++a) {
    const int64_t e = shapes[s * p.G_in + a];
    const bool kept = d < p.g.ndim && p.g.axis[d] == a;  // (axes of max extent 1 were squeezed out)
    const int64_t m = kept ? p.g.n[d] : 1;
    valid = valid && e >= 1 && e <= m;
    if (!valid) break;
    tokens *= e;
    if (!kept) continue;
    sp.g.n[d] = e;
    sp.win_left[d] = min(p.win_left[d], e - 1);
    sp.win_right[d] = min(p.win_right[d], e - 1);
    sp.win_stride[d] = min(p.win_stride[d], e);
    row_base += (m - e) * p.rel_stride[d];
    ++d;
  }
  valid = valid && tokens == next - first;
  sp.N = tokens;
  ts = t;
  ts.q = t.q + first * p.D;
  ts.k = t.k + first * p.D;
  ts.v = t.v + first * p.Dv;
  if (t.qpos) ts.qpos = t.qpos + first * p.D;
  if (t.rel) ts.rel = t.rel + row_base * p.D;
  if (t.bias) ts.bias = t.bias + row_base;
  if (t.out) ts.out = t.out + first * p.Dv;
  if (t.lse) ts.lse = t.lse + first;
  if (t.gout) ts.gout = t.gout + first * p.Dv;
  if (t.rowd) ts.rowd = t.rowd + first;
  if (t.dq) ts.dq = t.dq + first * p.D;
  if (t.dk) ts.dk = t.dk + first * p.D;
  if (t.dv) ts.dv = t.dv + first * p.Dv;
  if (t.dqpos) ts.dqpos = t.dqpos + first * p.D;
  return valid;
}

// Token `tok` of a packed call: its sample as a call of its own and its index `i` there (false:
// a tail token, or one of a bad sample).
template <typename T>
__device__ bool packed_token(const RelposParams& p, const RelposTensors<T>& t, int64_t tok, RelposParams& sp,
                             RelposTensors<T>& ts, int64_t& i) {
  const int64_t s = packed_sample_of(p, t.packed_offsets, tok);
  if (s < 0 || !packed_sample(p, t, s, sp, ts)) return false;
  i = tok - t.packed_offsets[s];
  return i >= 0 && i < sp.N;
}

// The values of a packed call's offsets and shapes, a thread per sample: device-side assertions with
// the CPU check's messages (csrc/relpos/relpos_checks.cpp, check_packed_values_cpu).
static __global__ void __launch_bounds__(kCheckThreads)
    relpos_packed_check_kernel(RelposParams p, const int* off, const int* shapes) {
  const int64_t s = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (s == 0) POSATTN_DEVICE_ASSERT(off[0] == 0, "relpos_attention: packed_offsets must start at 0");
  if (s >= p.packed_samples) return;
  POSATTN_DEVICE_ASSERT(off[s + 1] > off[s], "relpos_attention: packed_offsets must increase");
  int64_t tokens = 1;
  bool inside = true;
  for (int64_t a = 0, d = 0; a < p.G_in; ++a) {
    const bool kept = d < p.g.ndim && p.g.axis[d] == a;
    const int64_t e = shapes[s * p.G_in + a], m = kept ? p.g.n[d++] : 1;
    inside = inside && e >= 1 && e <= m;
    tokens *= inside ? e : 1;
  }
  POSATTN_DEVICE_ASSERT(inside,
                        "relpos_attention: packed_shapes must have extents in [1, max_grid] on every axis");
  POSATTN_DEVICE_ASSERT(!inside || tokens == static_cast<int64_t>(off[s + 1]) - off[s],
                        "relpos_attention: packed_shapes gives a sample another number of tokens than "
                        "packed_offsets do");
  if (s == p.packed_samples - 1)
    POSATTN_DEVICE_ASSERT(off[s + 1] <= p.N,
                          "relpos_attention: the packed samples hold more tokens (packed_offsets[-1]) than q "
                          "has (T)");
}

// A packed call's offsets and shapes, checked on the device before its kernels (nothing otherwise).
inline cudaError_t launch_packed_check(const RelposParams& p, const int* offsets, const int* shapes,
                                       cudaStream_t stream) {
  if (p.packed_samples == 0) return cudaSuccess;
  return cuda::launch(relpos_packed_check_kernel, (p.packed_samples + kCheckThreads - 1) / kCheckThreads,
                      kCheckThreads, 0, stream, p, offsets, shapes);
}

}  // namespace cuda_packed
}  // namespace relpos
}  // namespace posattn
