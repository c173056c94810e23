// Packed calls of relpos_attention on CUDA (posattn.PackedGrids; RelposParams::packed_samples):
// finding a token's sample, a sample as a call of its own grid, the device-side check of the
// offsets' and shapes' values, and the fast kernels' schedule (every sample's tiles in one launch,
// the values checked and the outputs of the tokens no tile holds written on the way). Torch-free, shared by
// the kernels that take packed calls (relpos_general.cuh; the fast forward and backward,
// relpos_fast_forward.cuh, relpos_fast_backward.cuh).
#pragma once

#include <algorithm>
#include <climits>
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
// left alone (its tokens as tail): relpos_packed_check_kernel (packed_schedule_kernel), launched
// first, reports it.

// The largest i in [0, n) with a[i] <= x, a being non-decreasing with a[0] <= x (a binary search).
__device__ inline int64_t last_at_most(const int* __restrict__ a, int64_t n, int64_t x) {
  int64_t lo = 0, hi = n - 1;  // a[lo] <= x
  while (lo < hi) {
    const int64_t mid = (lo + hi + 1) / 2;
    if (a[mid] <= x)
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

// The sample holding token `tok` by a binary search of the offsets, or -1 (tail).
__device__ inline int64_t packed_sample_of(const RelposParams& p, const int* __restrict__ off, int64_t tok) {
  if (tok < off[0] || tok >= off[p.packed_samples]) return -1;
  return last_at_most(off, p.packed_samples, tok);
}

// Sample s's extents on the max grid's kept axes (n[d], d < p.g.ndim) and its tokens, and whether
// its values are good: offsets within [0, T] and increasing, extents in [1, max grid] whose
// product is its number of tokens.
__device__ inline bool packed_extents(const RelposParams& p, const int* __restrict__ off,
                                      const int* __restrict__ shapes, int64_t s, int64_t* n,
                                      int64_t* tokens) {
  const int64_t first = off[s], next = off[s + 1];
  bool valid = first >= 0 && next > first && next <= p.N;
  *tokens = 1;
  for (int64_t a = 0, d = 0; a < p.G_in && valid; ++a) {
    const int64_t e = shapes[s * p.G_in + a];
    const bool kept = d < p.g.ndim && p.g.axis[d] == a;  // (axes of max extent 1 were squeezed out)
    valid = e >= 1 && e <= (kept ? p.g.n[d] : 1);
    *tokens *= e;
    if (kept) n[d++] = e;
  }
  return valid && *tokens == next - first;
}

// packed_extents for a kernel of NDIM = p.g.ndim axes (NDIM 1: p.g.ndim <= 1): sample s's extents
// on the kept axes into n (registers: no array indexed at run time) and whether its values are
// good; n[0] of a 1-D sample: its tokens.
template <int NDIM>
__device__ __forceinline__ bool packed_sample_grid(const RelposParams& p, const int* __restrict__ off,
                                                   const int* __restrict__ shapes, int64_t s, int* n) {
  const int64_t first = off[s], next = off[s + 1];
  bool valid = first >= 0 && next > first && next <= p.N;
  int64_t tokens = 1;
  for (int64_t a = 0; a < p.G_in; ++a) {  // (axes of max extent 1, squeezed out: extent 1)
    const int64_t e = shapes[s * p.G_in + a];
    bool kept = false;
#pragma unroll
    for (int d = 0; d < NDIM; ++d) {
      if (d < p.g.ndim && p.g.axis[d] == a) {
        kept = true;
        valid = valid && e >= 1 && e <= p.g.n[d];
        n[d] = static_cast<int>(e);
      }
    }
    valid = valid && (kept || e == 1);
    tokens *= valid ? e : 1;
  }
  if (NDIM == 1) n[0] = static_cast<int>(valid ? tokens : 1);
  return valid && tokens == next - first;
}

// Sample s of packed call p as a call of its own (sp, ts); false where its values are bad.
template <typename T>
__device__ bool packed_sample(const RelposParams& p, const RelposTensors<T>& t, int64_t s, RelposParams& sp,
                              RelposTensors<T>& ts) {
  int64_t n[kMaxGridDims] = {}, tokens = 0;
  const bool valid = packed_extents(p, t.packed_offsets, t.packed_shapes, s, n, &tokens);
  const int64_t first = t.packed_offsets[s];
  sp = p;
  sp.packed_samples = 0;
  sp.tok_stride = p.tok_stride;
  int64_t row_base = 0;
  for (int d = 0; d < p.g.ndim && valid; ++d) {
    const int64_t e = n[d];
    sp.g.n[d] = e;
    sp.win_left[d] = min(p.win_left[d], e - 1);
    sp.win_right[d] = min(p.win_right[d], e - 1);
    sp.win_stride[d] = min(p.win_stride[d], e);
    row_base += (p.g.n[d] - e) * p.rel_stride[d];
  }
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

// The values of sample s's offsets and shapes (s = 0 also the first offset, s = S - 1 also the
// last): device-side assertions with the CPU check's messages (csrc/relpos/relpos_checks.cpp,
// check_packed_values_cpu).
__device__ inline void assert_packed_sample(const RelposParams& p, const int* __restrict__ off,
                                            const int* __restrict__ shapes, int64_t s) {
  if (s == 0) POSATTN_DEVICE_ASSERT(off[0] == 0, "relpos_attention: packed_offsets must start at 0");
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

// The general kernels' check of a packed call, a thread per sample.
static __global__ void __launch_bounds__(kCheckThreads)
    relpos_packed_check_kernel(RelposParams p, const int* off, const int* shapes) {
  const int64_t s = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (s < p.packed_samples) assert_packed_sample(p, off, shapes, s);
}

// A packed call's offsets and shapes, checked on the device before its kernels (nothing otherwise).
inline cudaError_t launch_packed_check(const RelposParams& p, const int* offsets, const int* shapes,
                                       cudaStream_t stream) {
  if (p.packed_samples == 0) return cudaSuccess;
  return cuda::launch(relpos_packed_check_kernel, (p.packed_samples + kCheckThreads - 1) / kCheckThreads,
                      kCheckThreads, 0, stream, p, offsets, shapes);
}

// ---- the fast kernels' schedule ----------------------------------------------------------------

// The fast kernels take a packed call as one launch of blocks over all samples' tiles: a tile is a
// box of `tile` cells (its extents on the kept axes; ndim 1: `tile[0]` tokens in a row), sample s
// holds prod_d ceil(n_d / tile_d) of them (0: a bad sample). The samples are ranked by their tiles,
// the most first (the heaviest tiles first: a sample's tiles visit about as many key blocks as it
// holds, so that a large image's long tiles start early instead of trailing after the small ones';
// ties in any order: a block's outputs are its own, the same bits in any order), and block b takes
// tile b - prefix[r] of the sample order[r] ranked r, prefix[r] <= b < prefix[r + 1]
// (packed_block_sample); blocks past prefix[S] have none. The schedule (t.packed_tiles,
// packed_schedule_ints): prefix (S + 1 ints), then order (S).
constexpr int kScheduleThreads = 1024;
// tile counts told apart by the ranking (more: ranked as this many minus one, in any order)
constexpr int kScheduleBuckets = 2048;

inline int64_t packed_schedule_ints(const RelposParams& p) {
  return 2 * p.packed_samples + 1;
}

// The tiles of sample s (0 where its values are bad: packed_extents' checks).
__device__ inline int packed_sample_tiles(const RelposParams& p, const int* __restrict__ off,
                                          const int* __restrict__ shapes, int64_t s, int ndim, int3 tile) {
  const int64_t first = off[s], next = off[s + 1];
  bool valid = first >= 0 && next > first && next <= p.N;
  int64_t tokens = 1, tiles = 1;
  for (int64_t a = 0, d = 0; a < p.G_in && valid; ++a) {
    const int64_t e = shapes[s * p.G_in + a];
    const bool kept = d < p.g.ndim && p.g.axis[d] == a;
    valid = e >= 1 && e <= (kept ? p.g.n[d] : 1);
    tokens *= e;
    if (!kept) continue;
    const int x = d == 0 ? tile.x : d == 1 ? tile.y : tile.z;
    tiles *= (e + x - 1) / x;
    ++d;
  }
  if (ndim == 1) tiles = (tokens + tile.x - 1) / tile.x;
  return valid && tokens == next - first ? static_cast<int>(tiles) : 0;
}

// Rows [from, to) of every head of x (rows of `width` elements, p.tok_stride rows a head) set to
// `value`, by threads `lane` of `lanes`.
template <typename X>
__device__ void packed_zero_span(const RelposParams& p, X* x, int64_t width, int64_t from, int64_t to,
                                 int64_t lane, int64_t lanes, X value) {
  const int64_t n = (to - from) * width;
  for (int64_t i = lane; i < p.H * n; i += lanes) x[(i / n * p.tok_stride + from) * width + i % n] = value;
}

// The outputs of tokens [from, to) of every head, by threads `lane` of `lanes`: the forward's (BWD
// false: out 0, lse -inf), or the backward's (d q, d k, d v, d q_pos 0).
template <typename T, bool BWD>
__device__ void packed_zero_rows(const RelposParams& p, const RelposTensors<T>& t, int64_t from, int64_t to,
                                 int64_t lane, int64_t lanes) {
  using Acc = acc_t<T>;
  const T zero = cuda::from_acc<T>(Acc(0));
  if constexpr (!BWD) {
    packed_zero_span(p, t.out, p.Dv, from, to, lane, lanes, zero);
    packed_zero_span(p, t.lse, int64_t{1}, from, to, lane, lanes, -static_cast<Acc>(INFINITY));
  } else {
    packed_zero_span(p, t.dq, p.D, from, to, lane, lanes, zero);
    packed_zero_span(p, t.dk, p.D, from, to, lane, lanes, zero);
    packed_zero_span(p, t.dv, p.Dv, from, to, lane, lanes, zero);
    if (t.dqpos != nullptr) packed_zero_span(p, t.dqpos, p.D, from, to, lane, lanes, zero);
  }
}

// Sums of x over the block's threads (kScheduleThreads): each thread's inclusive prefix, and the
// total in *total (warp scans, then the warps' sums; in 64 bits). Every thread calls it.
__device__ inline int64_t block_inclusive_scan(int64_t x, int64_t* warp_sums, int64_t* total) {
  const int lane = threadIdx.x % 32, w = threadIdx.x / 32;
#pragma unroll
  for (int o = 1; o < 32; o *= 2) {
    const int64_t y = __shfl_up_sync(0xffffffffu, x, o);
    if (lane >= o) x += y;
  }
  if (lane == 31) warp_sums[w] = x;
  __syncthreads();
  if (w == 0) {
    int64_t y = warp_sums[lane];
#pragma unroll
    for (int o = 1; o < 32; o *= 2) {
      const int64_t z = __shfl_up_sync(0xffffffffu, y, o);
      if (lane >= o) y += z;
    }
    warp_sums[lane] = y;
  }
  __syncthreads();
  x += w > 0 ? warp_sums[w - 1] : 0;
  *total = warp_sums[kScheduleThreads / 32 - 1];
  __syncthreads();  // every thread has read the warps' sums before the next scan's
  return x;
}

// A packed call's schedule for the fast kernels, one block: its offsets' and shapes' values checked
// (assert_packed_sample); the samples ranked by their tiles, the most first (a counting sort of
// their tile counts: kScheduleBuckets buckets), order[r] the sample ranked r; prefix[0] = 0 and
// [r + 1] = the tiles of the samples ranked 0 ... r (kScheduleThreads samples at a time); and the
// outputs of the tokens no tile holds: tail padding and bad samples' (packed_zero_rows: the
// forward's, or BWD the backward's d q, d k, d v, d q_pos).
template <typename T, bool BWD = false>
__global__ void __launch_bounds__(kScheduleThreads)
    packed_schedule_kernel(RelposParams p, RelposTensors<T> t, int ndim, int3 tile) {
  __shared__ int64_t warp_sums[kScheduleThreads / 32];
  __shared__ int bucket[kScheduleBuckets];  // samples per tile count, then the next rank of each
  const int* __restrict__ off = t.packed_offsets;
  const int* __restrict__ shapes = t.packed_shapes;
  int* __restrict__ prefix = t.packed_tiles;
  int* __restrict__ order = t.packed_tiles + p.packed_samples + 1;
  const int64_t S = p.packed_samples;
  const auto key = [&](int64_t s) {  // (its bucket)
    return min(packed_sample_tiles(p, off, shapes, s, ndim, tile), kScheduleBuckets - 1);
  };
  for (int i = threadIdx.x; i < kScheduleBuckets; i += kScheduleThreads) bucket[i] = 0;
  if (threadIdx.x == 0) {
    prefix[0] = 0;
    if (off[0] > 0)
      packed_zero_rows<T, BWD>(p, t, 0, min(static_cast<int64_t>(off[0]), p.N), 0,
                               1);  // (bad: tokens before it)
  }
  __syncthreads();
  for (int64_t s = threadIdx.x; s < S; s += kScheduleThreads) {
    assert_packed_sample(p, off, shapes, s);
    const int tiles = packed_sample_tiles(p, off, shapes, s, ndim, tile);
    const int64_t from = max(static_cast<int64_t>(off[s]), int64_t{0}),
                  to = min(static_cast<int64_t>(off[s + 1]), p.N);
    if (tiles == 0 && to > from)
      packed_zero_rows<T, BWD>(p, t, from, to, 0, 1);  // (a bad sample's tokens in T)
    atomicAdd(&bucket[min(tiles, kScheduleBuckets - 1)], 1);
  }
  __syncthreads();
  // each bucket's first rank: the samples of more tiles before it (a scan from the most tiles down,
  // kScheduleThreads buckets a round; one thread walking them took 80,000 cycles, simulated)
  static_assert(kScheduleBuckets % kScheduleThreads == 0, "whole rounds of buckets");
  int64_t ranked = 0;  // the samples in the rounds before
  for (int base = 0; base < kScheduleBuckets; base += kScheduleThreads) {
    const int k = kScheduleBuckets - 1 - (base + static_cast<int>(threadIdx.x)), c = bucket[k];
    int64_t total = 0;
    const int64_t x = block_inclusive_scan(c, warp_sums, &total);
    bucket[k] = static_cast<int>(ranked + x - c);
    ranked += total;
  }
  __syncthreads();
  for (int64_t s = threadIdx.x; s < S; s += kScheduleThreads)
    order[atomicAdd(&bucket[key(s)], 1)] = static_cast<int>(s);
  __syncthreads();  // (order in memory for the block)
  // the prefix sums over the ranks, saturated: bad offsets can make overlapping samples of more
  // tiles than T (the prefix stays non-decreasing, so that a block's sample always has tiles, and
  // blocks past the bound launched have none)
  int64_t carry = 0;  // the tiles of the ranks before this round's
  for (int64_t base = 0; base < S; base += kScheduleThreads) {
    const int64_t r = base + threadIdx.x;
    int64_t total = 0;
    const int64_t x = block_inclusive_scan(
        r < S ? packed_sample_tiles(p, off, shapes, order[r], ndim, tile) : 0, warp_sums, &total);
    if (r < S) prefix[r + 1] = static_cast<int>(min(carry + x, static_cast<int64_t>(INT_MAX)));
    carry += total;
  }
  const int64_t tail = off[S];  // (tail padding from there, within T)
  if (tail >= 0 && tail < p.N) packed_zero_rows<T, BWD>(p, t, tail, p.N, threadIdx.x, kScheduleThreads);
}

// The block's sample and its tile there (false: block b is past the last tile).
__device__ __forceinline__ bool packed_block_sample(const RelposParams& p, const int* __restrict__ schedule,
                                                    int b, int* s, int* tile) {
  if (b >= schedule[p.packed_samples]) return false;
  const int r = static_cast<int>(last_at_most(schedule, p.packed_samples, b));
  *s = schedule[p.packed_samples + 1 + r];
  *tile = b - schedule[r];
  return true;
}

// An upper bound of a packed call's tiles from T, S and the max grid only (the blocks launched: no
// host sync, the same grid for every packing of those sizes): each sample holds at most as many
// tiles as the max grid, and as tokens (ndim 1: ceil(tokens / tile[0]) <= (tokens + tile[0] - 1) /
// tile[0]).
inline int64_t packed_tiles_bound(const RelposParams& p, int ndim, int3 tile) {
  const int ext[3] = {tile.x, tile.y, tile.z};
  int64_t per = 1;
  if (ndim == 1) {
    int64_t m = 1;
    for (int d = 0; d < p.g.ndim; ++d) m *= p.g.n[d];
    per = (m + ext[0] - 1) / ext[0];
  } else {
    for (int d = 0; d < ndim; ++d) per *= (p.g.n[d] + ext[d] - 1) / ext[d];
  }
  const int64_t by_tokens = ndim == 1 ? (p.N + (ext[0] - 1) * p.packed_samples) / ext[0] : p.N;
  return std::min(per * p.packed_samples, by_tokens);
}

// The schedule of a packed call for tiles of `tile` cells on `ndim` axes (packed_schedule_kernel),
// into t.packed_tiles (packed_schedule_ints); the forward's (t.out and t.lse given) or BWD the backward's
// (t.dq, t.dk, t.dv given).
template <typename T, bool BWD = false>
cudaError_t launch_packed_schedule(const RelposParams& p, const RelposTensors<T>& t, int ndim, int3 tile,
                                   cudaStream_t stream) {
  const bool outputs =
      BWD ? t.dq != nullptr && t.dk != nullptr && t.dv != nullptr : t.out != nullptr && t.lse != nullptr;
  if (t.packed_tiles == nullptr || t.packed_offsets == nullptr || t.packed_shapes == nullptr || !outputs ||
      p.B != 1)
    return cudaErrorInvalidValue;
  return cuda::launch(packed_schedule_kernel<T, BWD>, 1, kScheduleThreads, 0, stream, p, t, ndim, tile);
}

}  // namespace cuda_packed
}  // namespace relpos
}  // namespace posattn
