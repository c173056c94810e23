// CUDA kernels of relpos_attention: the general path, exact for every head dim and
// dtype (float32, float64, float16, bfloat16; accumulation in float, or double for
// float64), and packed calls (each sample a call of its own grid). It is the fallback
// and the GPU oracle of faster paths. Torch-free
// (cuda_common.cuh): the extension (csrc/relpos/relpos_attention_cuda.cu) and the
// simulator harness (tests/cuda_sim/harness.cu) call the launchers at the end.
//
// It computes exactly what the CPU kernel computes (same index math from
// grid_index.h, same masking, span and lse conventions).
//   forward   a block per (batch, head, query), two passes over the keys the
//             query may keep (max/sum, then weights times values): O(block)
//             memory per query; lse in the accumulation type (float32 for
//             half inputs) so that the backward's probabilities sum to one.
//   backward  deterministic, no atomics: every gradient element is owned by one
//             block, and every sum runs in a fixed order. Where the fast backward
//             runs (relpos_fast_backward.cuh), only the offset kernel below may run
//             beside it (where the fast offset kernel does not fit).
//             dq, d q_pos     a block per query (query-major);
//             dk, dv          a block per key (key-major);
//             d rel, d bias   a block per (head, offset): the pairs at that offset;
//             d sigma         per-(head, offset-block) partial sums, summed by the caller.
//             The row term D_i = dO_i . out_i - d lse_i is computed first (by the caller).
// Only the keys in a query's kept box are visited (the box's cells, in row-major
// order), and with causal attention those after the query are skipped. Sigma values are
// checked on the device (a device-side assertion: no host synchronisation, so
// the op can be captured in a CUDA graph).
#pragma once

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <limits>

#include "../core/grid_index.h"
#include "../core/relpos_params.h"
#include "../core/relpos_tensors.h"
#include "../core/relpos_tiling.h"
#include "cuda_common.cuh"
#include "relpos_head.cuh"
#include "relpos_packed.cuh"

namespace posattn {
namespace relpos {
namespace cuda_general {

using cuda::acc_t;
using cuda::from_acc;
using cuda::to_acc;

constexpr int kThreads = 128;
// Blocks per head of the backward's offset kernel (each takes U / kOffsetBlocks offsets).
constexpr int64_t kOffsetBlocks = 2048;

// A head's span and limits, computed by every thread of a block (relpos_head.cuh).
template <typename Acc>
using Head = SpanHead<Acc>;

// The kept keys of the query at `ci`, per axis: [lo_d, hi_d].
template <typename Acc>
__device__ void query_limits(const RelposParams& p, const Head<Acc>& hd, const int64_t* ci, int64_t* lo,
                             int64_t* hi) {
  for (int d = 0; d < p.g.ndim; ++d) axis_key_range(hd.lim[d], ci[d], lo[d], hi[d]);
}

// Whether key `cj` is kept by the query at `ci` (limits lo/hi), its row in the
// offset table and the span's quadratic term.
template <typename Acc>
__device__ bool pair_geometry(const RelposParams& p, const Head<Acc>& hd, const int64_t* ci,
                              const int64_t* cj, const int64_t* lo, const int64_t* hi, Acc& quad,
                              int64_t& row) {
  row = 0;
  quad = 0;
  for (int d = 0; d < p.g.ndim; ++d) {
    if (p.has_box && (cj[d] < lo[d] || cj[d] > hi[d])) return false;
    const int64_t delta = cj[d] - ci[d];
    row += (delta + p.g.n[d] - 1) * p.rel_stride[d];
    if (p.has_sigma) {
      const Acc x = static_cast<Acc>(normalised_offset(delta, p.g.n[d])) * hd.inv_sigma[d];
      quad += Acc(0.5) * x * x;
    }
  }
  return true;
}

template <typename Acc, typename A, typename B>
__device__ Acc dot(const A* a, const B* b, int64_t n) {
  Acc s = 0;
  for (int64_t c = 0; c < n; ++c) s += to_acc<Acc>(a[c]) * to_acc<Acc>(b[c]);
  return s;
}

// raw = scale * (q.k + q_pos.rel) + bias, and the logit after the span.
template <typename Acc>
__device__ Acc span_logit(const RelposParams& p, Acc raw, Acc quad) {
  if (!p.has_sigma) return raw;
  return p.mode == SpanMode::kMultiply ? raw * exp(-quad) : raw - quad;
}

// The softmax backward for one kept pair: dA (d raw / scale-free), d quad.
template <typename Acc>
__device__ void pair_backward(const RelposParams& p, Acc s, Acc quad, Acc prob, Acc dp, Acc rowd, Acc& dA,
                              Acc& dquad) {
  const Acc dS = prob * (dp - rowd);
  dA = dS;
  dquad = -dS;
  if (p.has_sigma && p.mode == SpanMode::kMultiply) {
    dA = dS * exp(-quad);
    dquad = -dS * s;
  }
}

template <typename Acc>
__device__ Acc block_reduce(Acc v, Acc* buf, bool is_max) {
  buf[threadIdx.x] = v;
  __syncthreads();
  for (int stride = blockDim.x / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) {
      const Acc o = buf[threadIdx.x + stride];
      // The max lets a NaN through (o != o), so that a NaN logit reaches the output.
      buf[threadIdx.x] =
          is_max ? ((o > buf[threadIdx.x] || o != o) ? o : buf[threadIdx.x]) : buf[threadIdx.x] + o;
    }
    __syncthreads();
  }
  const Acc r = buf[0];
  __syncthreads();
  return r;
}

// acc[c] += sum_x w[x] * src[rows[x] * width + c] for c < width, the threads of
// the block taking the columns and every column summing the chunk's `count`
// rows in order (deterministic); rows of weight 0 are skipped.
template <typename T, typename Acc>
__device__ void accumulate_rows(Acc* acc, const Acc* w, const int64_t* rows, const T* __restrict__ src,
                                int64_t width, int64_t count) {
  for (int64_t c = threadIdx.x; c < width; c += blockDim.x) {
    Acc a = acc[c];
    for (int64_t x = 0; x < count; ++x)
      if (w[x] != Acc(0)) a += w[x] * to_acc<Acc>(src[rows[x] * width + c]);
    acc[c] = a;
  }
}

// A box of tokens, [lo_d, hi_d] on every axis, visited in row-major order
// through a local index e < count (so that only the box's cells are visited).
struct TokenBox {
  int64_t lo[kMaxGridDims], ext[kMaxGridDims];
  int64_t count;
};

__device__ inline TokenBox make_token_box(const RelposParams& p, const int64_t* lo, const int64_t* hi) {
  TokenBox b;
  b.count = 1;
  for (int d = 0; d < p.g.ndim; ++d) {
    b.lo[d] = lo[d];
    b.ext[d] = hi[d] >= lo[d] ? hi[d] - lo[d] + 1 : 0;
    b.count *= b.ext[d];
  }
  return b;
}

__device__ inline int64_t box_token(const RelposParams& p, const TokenBox& b, int64_t e) {
  int64_t c[kMaxGridDims];
  unravel_index(e, b.ext, p.g.ndim, c);
  for (int d = 0; d < p.g.ndim; ++d) c[d] += b.lo[d];
  return ravel_index(c, p.g.n, p.g.ndim);
}

// The forward of query i of (batch, head) slab bh.
template <typename T, typename Acc>
__device__ void forward_query(const RelposParams& p, const RelposTensors<T>& t, int64_t i, int64_t bh,
                              unsigned char* smem_raw) {
  int64_t* tok_s = reinterpret_cast<int64_t*>(smem_raw);  // blockDim: keys of a chunk
  Acc* q_s = reinterpret_cast<Acc*>(tok_s + blockDim.x);  // D
  Acc* qpos_s = q_s + p.D;                                // D
  Acc* out_s = qpos_s + p.D;                              // Dv
  Acc* red = out_s + p.Dv;                                // blockDim
  Acc* w_s = red + blockDim.x;                            // blockDim: weights of a chunk of keys
  const int64_t h = bh % p.H;
  for (int64_t c = threadIdx.x; c < p.D; c += blockDim.x) {
    q_s[c] = to_acc<Acc>(t.q[(bh * p.tok_stride + i) * p.D + c]);
    if (p.has_pos) qpos_s[c] = to_acc<Acc>(t.qpos[(bh * p.tok_stride + i) * p.D + c]);
  }
  for (int64_t c = threadIdx.x; c < p.Dv; c += blockDim.x) out_s[c] = 0;
  Head<Acc> hd;
  load_span_head<Acc>(p, h, t.sigma, hd);
  int64_t ci[kMaxGridDims], lo[kMaxGridDims], hi[kMaxGridDims];
  unravel_index(i, p.g.n, p.g.ndim, ci);
  query_limits<Acc>(p, hd, ci, lo, hi);
  const TokenBox kb = make_token_box(p, lo, hi);  // the keys the query may keep
  __syncthreads();
  const T* kh = t.k + bh * p.tok_stride * p.D;
  const T* vh = t.v + bh * p.tok_stride * p.Dv;
  const T* relh = p.has_pos ? t.rel + h * p.U * p.D : nullptr;
  const T* biash = p.has_bias ? t.bias + h * p.U : nullptr;
  const Acc neg_inf = -static_cast<Acc>(INFINITY);
  const Acc scale = static_cast<Acc>(p.scale);
  // The logit of key j, or -inf if the pair is masked (weight 0, as on the CPU).
  auto logit = [&](int64_t j) -> Acc {
    int64_t cj[kMaxGridDims];
    unravel_index(j, p.g.n, p.g.ndim, cj);
    Acc quad;
    int64_t row;
    if (!pair_geometry<Acc>(p, hd, ci, cj, lo, hi, quad, row)) return neg_inf;
    Acc dotp = dot<Acc>(q_s, kh + j * p.D, p.D);
    if (p.has_pos) dotp += dot<Acc>(qpos_s, relh + row * p.D, p.D);
    Acc raw = scale * dotp;
    if (p.has_bias) raw += to_acc<Acc>(biash[row]);
    return span_logit<Acc>(p, raw, quad);
  };
  // pass 1: max and sum of exp over the kept keys
  Acc m = neg_inf, l = 0;
  for (int64_t e = threadIdx.x; e < kb.count; e += blockDim.x) {
    const int64_t j = box_token(p, kb, e);
    if (p.causal && j > i) continue;
    const Acc s = logit(j);
    if (s != s || m != m) {  // a NaN logit sticks: the row's lse and output are NaN, as in the reference
      m = s + m;
      l = m;
    } else if (s == neg_inf) {
      continue;  // masked, or a logit of -inf: weight 0 (exp(-inf - -inf) would be NaN)
    } else if (s > m) {
      l = l * exp(m - s) + Acc(1);
      m = s;
    } else {
      l += s == m ? Acc(1)
                  : exp(s - m);  // s == m == +inf: one more key at the maximum (exp(inf - inf) is NaN)
    }
  }
  // A +inf logit gives M = +inf and lse = +inf (as in the reference), not exp(inf - inf) = NaN.
  const Acc M = block_reduce<Acc>(m, red, true);
  const Acc L = block_reduce<Acc>(m == neg_inf ? Acc(0) : (m == M ? l : l * exp(m - M)), red, false);
  const Acc lse_i = (M == neg_inf || L <= 0) ? neg_inf : M + log(L);
  // pass 2: out = sum_j exp(s_j - lse) v_j, a chunk of blockDim keys at a time
  if (lse_i != neg_inf) {
    for (int64_t e0 = 0; e0 < kb.count; e0 += blockDim.x) {
      const int64_t e = e0 + threadIdx.x;
      Acc w = 0;
      int64_t j = 0;
      if (e < kb.count) {
        j = box_token(p, kb, e);
        if (!(p.causal && j > i)) w = exp(logit(j) - lse_i);
      }
      w_s[threadIdx.x] = w;
      tok_s[threadIdx.x] = j;
      __syncthreads();
      accumulate_rows<T, Acc>(out_s, w_s, tok_s, vh, p.Dv,
                              min(kb.count - e0, static_cast<int64_t>(blockDim.x)));
      __syncthreads();
    }
  }
  for (int64_t c = threadIdx.x; c < p.Dv; c += blockDim.x)
    t.out[(bh * p.tok_stride + i) * p.Dv + c] = from_acc<T>(out_s[c]);
  if (threadIdx.x == 0) t.lse[bh * p.tok_stride + i] = lse_i;
}

// The forward: a block per (batch, head, query), or per (head, token) of a packed call.
template <typename T, typename Acc, bool kPacked>
__global__ void __launch_bounds__(kThreads) relpos_forward_kernel(RelposParams p, RelposTensors<T> t) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const int64_t blk = blockIdx.x, tok = blk % p.N, bh = blk / p.N;
  if constexpr (!kPacked) {
    forward_query<T, Acc>(p, t, tok, bh, smem_raw);
  } else {
    RelposParams sp;
    RelposTensors<T> ts;
    int64_t i = 0;
    if (cuda_packed::packed_token(p, t, tok, sp, ts, i))
      return forward_query<T, Acc>(sp, ts, i, bh, smem_raw);
    for (int64_t c = threadIdx.x; c < p.Dv; c += blockDim.x) t.out[blk * p.Dv + c] = from_acc<T>(Acc(0));
    if (threadIdx.x == 0) t.lse[blk] = -static_cast<Acc>(INFINITY);  // tail padding: no keys
  }
}

// What the three backward kernels share: the saved statistics of query i and
// the softmax backward of pair (i, j). `qi` and `qposi` point at query i's
// rows (shared or global memory), `goi` at its output gradient, `kj`/`vj` at
// key j's rows.
template <typename T, typename Acc>
struct PairGrad {
  bool kept;
  Acc prob, dA, dquad;
  int64_t row;
};

template <typename T, typename Acc, typename QT, typename KT>
__device__ PairGrad<T, Acc> pair_grad(const RelposParams& p, const Head<Acc>& hd, const int64_t* ci,
                                      const int64_t* cj, const int64_t* lo, const int64_t* hi, const QT* qi,
                                      const QT* qposi, const QT* goi, const KT* kj, const KT* vj,
                                      const T* relh, const T* biash, Acc lse_i, Acc rowd_i) {
  PairGrad<T, Acc> g{false, 0, 0, 0, 0};
  Acc quad;
  if (!pair_geometry<Acc>(p, hd, ci, cj, lo, hi, quad, g.row)) return g;
  Acc dotp = dot<Acc>(qi, kj, p.D);
  if (p.has_pos) dotp += dot<Acc>(qposi, relh + g.row * p.D, p.D);
  Acc raw = static_cast<Acc>(p.scale) * dotp;
  if (p.has_bias) raw += to_acc<Acc>(biash[g.row]);
  const Acc s = span_logit<Acc>(p, raw, quad);
  if (s == -static_cast<Acc>(INFINITY)) return g;  // weight 0, as in the forward
  g.kept = true;
  g.prob = exp(s - lse_i);
  const Acc dp = dot<Acc>(goi, vj, p.Dv);
  pair_backward<Acc>(p, s, quad, g.prob, dp, rowd_i, g.dA, g.dquad);
  return g;
}

// dq and d q_pos of query i of (batch, head) slab bh, its keys in chunks of blockDim.
template <typename T, typename Acc>
__device__ void backward_dq_query(const RelposParams& p, const RelposTensors<T>& t, int64_t i, int64_t bh,
                                  unsigned char* smem_raw) {
  int64_t* row_s = reinterpret_cast<int64_t*>(smem_raw);  // blockDim: offset rows of a chunk
  int64_t* tok_s = row_s + blockDim.x;                    // blockDim: its keys
  Acc* q_s = reinterpret_cast<Acc*>(tok_s + blockDim.x);  // D
  Acc* qpos_s = q_s + p.D;                                // D
  Acc* go_s = qpos_s + p.D;                               // Dv
  Acc* dq_s = go_s + p.Dv;                                // D
  Acc* dqpos_s = dq_s + p.D;                              // D
  Acc* w_s = dqpos_s + p.D;                               // blockDim: dA * scale of a chunk
  const int64_t h = bh % p.H;
  for (int64_t c = threadIdx.x; c < p.D; c += blockDim.x) {
    q_s[c] = to_acc<Acc>(t.q[(bh * p.tok_stride + i) * p.D + c]);
    qpos_s[c] = p.has_pos ? to_acc<Acc>(t.qpos[(bh * p.tok_stride + i) * p.D + c]) : Acc(0);
    dq_s[c] = 0;
    dqpos_s[c] = 0;
  }
  for (int64_t c = threadIdx.x; c < p.Dv; c += blockDim.x)
    go_s[c] = to_acc<Acc>(t.gout[(bh * p.tok_stride + i) * p.Dv + c]);
  Head<Acc> hd;
  load_span_head<Acc>(p, h, t.sigma, hd);
  int64_t ci[kMaxGridDims], lo[kMaxGridDims], hi[kMaxGridDims];
  unravel_index(i, p.g.n, p.g.ndim, ci);
  query_limits<Acc>(p, hd, ci, lo, hi);
  const TokenBox kb = make_token_box(p, lo, hi);
  __syncthreads();
  const Acc lse_i = t.lse[bh * p.tok_stride + i], rowd_i = t.rowd[bh * p.tok_stride + i];
  const T* kh = t.k + bh * p.tok_stride * p.D;
  const T* vh = t.v + bh * p.tok_stride * p.Dv;
  const T* relh = p.has_pos ? t.rel + h * p.U * p.D : nullptr;
  const T* biash = p.has_bias ? t.bias + h * p.U : nullptr;
  const Acc scale = static_cast<Acc>(p.scale);
  if (lse_i != -static_cast<Acc>(INFINITY)) {
    for (int64_t e0 = 0; e0 < kb.count; e0 += blockDim.x) {
      const int64_t e = e0 + threadIdx.x;
      Acc w = 0;
      int64_t row = 0, j = 0;
      if (e < kb.count) j = box_token(p, kb, e);
      if (e < kb.count && !(p.causal && j > i)) {
        int64_t cj[kMaxGridDims];
        unravel_index(j, p.g.n, p.g.ndim, cj);
        const PairGrad<T, Acc> g = pair_grad<T, Acc>(p, hd, ci, cj, lo, hi, q_s, qpos_s, go_s, kh + j * p.D,
                                                     vh + j * p.Dv, relh, biash, lse_i, rowd_i);
        if (g.kept) {
          w = g.dA * scale;
          row = g.row;
        }
      }
      w_s[threadIdx.x] = w;
      row_s[threadIdx.x] = row;
      tok_s[threadIdx.x] = j;
      __syncthreads();
      const int64_t count = min(kb.count - e0, static_cast<int64_t>(blockDim.x));
      accumulate_rows<T, Acc>(dq_s, w_s, tok_s, kh, p.D, count);
      if (p.has_pos) accumulate_rows<T, Acc>(dqpos_s, w_s, row_s, relh, p.D, count);
      __syncthreads();
    }
  }
  for (int64_t c = threadIdx.x; c < p.D; c += blockDim.x) {
    t.dq[(bh * p.tok_stride + i) * p.D + c] = from_acc<T>(dq_s[c]);
    if (p.has_pos) t.dqpos[(bh * p.tok_stride + i) * p.D + c] = from_acc<T>(dqpos_s[c]);
  }
}

// dq and d q_pos: a block per (batch, head, query), or per (head, token) of a packed call.
template <typename T, typename Acc, bool kPacked>
__global__ void __launch_bounds__(kThreads) relpos_backward_dq_kernel(RelposParams p, RelposTensors<T> t) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const int64_t blk = blockIdx.x, tok = blk % p.N, bh = blk / p.N;
  if constexpr (!kPacked) {
    backward_dq_query<T, Acc>(p, t, tok, bh, smem_raw);
  } else {
    RelposParams sp;
    RelposTensors<T> ts;
    int64_t i = 0;
    if (cuda_packed::packed_token(p, t, tok, sp, ts, i))
      return backward_dq_query<T, Acc>(sp, ts, i, bh, smem_raw);
    for (int64_t c = threadIdx.x; c < p.D; c += blockDim.x) {  // tail padding: zero gradients
      t.dq[blk * p.D + c] = from_acc<T>(Acc(0));
      if (p.has_pos) t.dqpos[blk * p.D + c] = from_acc<T>(Acc(0));
    }
  }
}

// dk and dv of key j of (batch, head) slab bh: the queries that may keep the key (within
// the head's reach of it, and not before it with causal attention) in chunks of blockDim.
template <typename T, typename Acc>
__device__ void backward_dkv_key(const RelposParams& p, const RelposTensors<T>& t, int64_t j, int64_t bh,
                                 unsigned char* smem_raw) {
  int64_t* tok_s = reinterpret_cast<int64_t*>(smem_raw);  // blockDim: queries of a chunk
  Acc* k_s = reinterpret_cast<Acc*>(tok_s + blockDim.x);  // D
  Acc* v_s = k_s + p.D;                                   // Dv
  Acc* dk_s = v_s + p.Dv;                                 // D
  Acc* dv_s = dk_s + p.D;                                 // Dv
  Acc* wp_s = dv_s + p.Dv;                                // blockDim: probabilities of a chunk (for dv)
  Acc* wa_s = wp_s + blockDim.x;                          // blockDim: dA * scale of a chunk (for dk)
  const int64_t h = bh % p.H;
  for (int64_t c = threadIdx.x; c < p.D; c += blockDim.x) {
    k_s[c] = to_acc<Acc>(t.k[(bh * p.tok_stride + j) * p.D + c]);
    dk_s[c] = 0;
  }
  for (int64_t c = threadIdx.x; c < p.Dv; c += blockDim.x) {
    v_s[c] = to_acc<Acc>(t.v[(bh * p.tok_stride + j) * p.Dv + c]);
    dv_s[c] = 0;
  }
  Head<Acc> hd;
  load_span_head<Acc>(p, h, t.sigma, hd);
  int64_t cj[kMaxGridDims], qlo[kMaxGridDims], qhi[kMaxGridDims];
  unravel_index(j, p.g.n, p.g.ndim, cj);
  {  // the queries that may keep key j, exactly per axis (tiling::query_region)
    tiling::Box kb;
    for (int d = 0; d < p.g.ndim; ++d) {
      kb.lo[d] = cj[d];
      kb.hi[d] = cj[d] + 1;
    }
    const tiling::Box r = tiling::query_region(p.g, kb, p.has_box ? hd.lim : nullptr, p.causal);
    for (int d = 0; d < p.g.ndim; ++d) {
      qlo[d] = r.lo[d];
      qhi[d] = r.hi[d] - 1;
    }
  }
  const TokenBox qb = make_token_box(p, qlo, qhi);
  __syncthreads();
  const T* qh = t.q + bh * p.tok_stride * p.D;
  const T* qposh = p.has_pos ? t.qpos + bh * p.tok_stride * p.D : nullptr;
  const T* goh = t.gout + bh * p.tok_stride * p.Dv;
  const T* relh = p.has_pos ? t.rel + h * p.U * p.D : nullptr;
  const T* biash = p.has_bias ? t.bias + h * p.U : nullptr;
  const Acc scale = static_cast<Acc>(p.scale);
  for (int64_t e0 = 0; e0 < qb.count; e0 += blockDim.x) {
    const int64_t e = e0 + threadIdx.x;
    Acc wp = 0, wa = 0;
    int64_t i = 0;
    if (e < qb.count) i = box_token(p, qb, e);
    if (e < qb.count && !(p.causal && i < j)) {
      const Acc lse_i = t.lse[bh * p.tok_stride + i];
      if (lse_i != -static_cast<Acc>(INFINITY)) {
        int64_t ci[kMaxGridDims], lo[kMaxGridDims], hi[kMaxGridDims];
        unravel_index(i, p.g.n, p.g.ndim, ci);
        query_limits<Acc>(p, hd, ci, lo, hi);
        const PairGrad<T, Acc> g =
            pair_grad<T, Acc>(p, hd, ci, cj, lo, hi, qh + i * p.D, p.has_pos ? qposh + i * p.D : nullptr,
                              goh + i * p.Dv, k_s, v_s, relh, biash, lse_i, t.rowd[bh * p.tok_stride + i]);
        if (g.kept) {
          wp = g.prob;
          wa = g.dA * scale;
        }
      }
    }
    wp_s[threadIdx.x] = wp;
    wa_s[threadIdx.x] = wa;
    tok_s[threadIdx.x] = i;
    __syncthreads();
    const int64_t count = min(qb.count - e0, static_cast<int64_t>(blockDim.x));
    accumulate_rows<T, Acc>(dv_s, wp_s, tok_s, goh, p.Dv, count);
    accumulate_rows<T, Acc>(dk_s, wa_s, tok_s, qh, p.D, count);
    __syncthreads();
  }
  for (int64_t c = threadIdx.x; c < p.D; c += blockDim.x)
    t.dk[(bh * p.tok_stride + j) * p.D + c] = from_acc<T>(dk_s[c]);
  for (int64_t c = threadIdx.x; c < p.Dv; c += blockDim.x)
    t.dv[(bh * p.tok_stride + j) * p.Dv + c] = from_acc<T>(dv_s[c]);
}

// dk and dv: a block per (batch, head, key), or per (head, token) of a packed call.
template <typename T, typename Acc, bool kPacked>
__global__ void __launch_bounds__(kThreads) relpos_backward_dkv_kernel(RelposParams p, RelposTensors<T> t) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const int64_t blk = blockIdx.x, tok = blk % p.N, bh = blk / p.N;
  if constexpr (!kPacked) {
    backward_dkv_key<T, Acc>(p, t, tok, bh, smem_raw);
  } else {
    RelposParams sp;
    RelposTensors<T> ts;
    int64_t j = 0;
    if (cuda_packed::packed_token(p, t, tok, sp, ts, j))
      return backward_dkv_key<T, Acc>(sp, ts, j, bh, smem_raw);
    for (int64_t c = threadIdx.x; c < p.D; c += blockDim.x) t.dk[blk * p.D + c] = from_acc<T>(Acc(0));
    for (int64_t c = threadIdx.x; c < p.Dv; c += blockDim.x) t.dv[blk * p.Dv + c] = from_acc<T>(Acc(0));
  }
}

// d rel, d bias and d sigma: `per_head` blocks per head, block b taking the
// offsets u = b, b + per_head, ... in turn: for each, the pairs (batch, i,
// i + delta_u) in chunks of blockDim; d rel and d bias of u are written by
// this block alone, and d sigma is summed per block (offsets in order) into
// dsig_part (H, per_head, G_in), reduced afterwards. A packed call's offset u
// (of its max grid) sums the pairs of its samples in sample order, each a call
// of its own grid (its offset, reach and span from its extents).

// The pairs at offset `delta` of call p (a packed call's sample, or the whole call) and head h,
// added to drel_s (shared), dbias_u (every thread) and dsig (thread 0). Uniform across the block.
template <typename T, typename Acc>
__device__ void offset_pairs(const RelposParams& p, const RelposTensors<T>& t, const Head<Acc>& hd, int64_t h,
                             const int64_t* delta, int64_t* qrow_s, Acc* drel_s, Acc* w_s, Acc* red,
                             Acc& dbias_u, double* dsig) {
  int64_t count_d[kMaxGridDims];
  bool reachable = true;
  int64_t count = 1;  // queries per batch element whose key at this offset is on the grid
  for (int d = 0; d < p.g.ndim; ++d) {
    const int64_t ad = delta[d] < 0 ? -delta[d] : delta[d];
    reachable &= ad <= hd.reach[d] && ad < p.g.n[d];
    count_d[d] = p.g.n[d] - ad;
    count *= count_d[d] > 0 ? count_d[d] : 0;
  }
  int64_t doff = 0;  // flat token offset of delta
  for (int64_t d = p.g.ndim - 1, stride = 1; d >= 0; --d) {
    doff += delta[d] * stride;
    stride *= p.g.n[d];
  }
  if (p.causal && doff > 0) reachable = false;  // every key at this offset comes after its query
  if (!reachable) return;                       // no kept pair
  const T* relh = p.has_pos ? t.rel + h * p.U * p.D : nullptr;
  const T* biash = p.has_bias ? t.bias + h * p.U : nullptr;
  const Acc scale = static_cast<Acc>(p.scale);
  Acc sum_dA = 0, sum_dquad = 0;
  const int64_t items = p.B * count;
  for (int64_t e0 = 0; e0 < items; e0 += blockDim.x) {
    const int64_t e = e0 + threadIdx.x;
    Acc w = 0;
    int64_t qrow = 0;
    if (e < items) {
      const int64_t b = e / count;
      int64_t local = e % count, ci[kMaxGridDims], cj[kMaxGridDims];
      for (int d = p.g.ndim - 1; d >= 0; --d) {
        ci[d] = local % count_d[d] + (delta[d] < 0 ? -delta[d] : 0);
        cj[d] = ci[d] + delta[d];
        local /= count_d[d];
      }
      const int64_t i = ravel_index(ci, p.g.n, p.g.ndim), j = i + doff;
      const int64_t bh = b * p.H + h;
      const Acc lse_i = t.lse[bh * p.tok_stride + i];
      if (lse_i != -static_cast<Acc>(INFINITY)) {
        int64_t lo[kMaxGridDims], hi[kMaxGridDims];
        query_limits<Acc>(p, hd, ci, lo, hi);
        const PairGrad<T, Acc> g = pair_grad<T, Acc>(
            p, hd, ci, cj, lo, hi, t.q + (bh * p.tok_stride + i) * p.D,
            p.has_pos ? t.qpos + (bh * p.tok_stride + i) * p.D : nullptr,
            t.gout + (bh * p.tok_stride + i) * p.Dv, t.k + (bh * p.tok_stride + j) * p.D,
            t.v + (bh * p.tok_stride + j) * p.Dv, relh, biash, lse_i, t.rowd[bh * p.tok_stride + i]);
        if (g.kept) {
          w = g.dA * scale;
          qrow = bh * p.tok_stride + i;
          sum_dA += g.dA;
          sum_dquad += g.dquad;
        }
      }
    }
    w_s[threadIdx.x] = w;
    qrow_s[threadIdx.x] = qrow;
    __syncthreads();
    if (p.has_pos)
      accumulate_rows<T, Acc>(drel_s, w_s, qrow_s, t.qpos, p.D,
                              min(items - e0, static_cast<int64_t>(blockDim.x)));
    __syncthreads();
  }
  if (p.has_bias) dbias_u += block_reduce<Acc>(sum_dA, red, false);
  if (p.has_sigma) {
    // d sigma_d += d quad * d quad / d sigma_d = d quad * (-x_d^2 / sigma_d^3), x_d fixed by the offset
    const double total = static_cast<double>(block_reduce<Acc>(sum_dquad, red, false));
    if (threadIdx.x == 0 && total != 0.0)
      for (int d = 0; d < p.g.ndim; ++d) {
        if (p.g.n[d] <= 1) continue;
        const double x = normalised_offset(delta[d], p.g.n[d]);
        const double is = 1.0 / t.sigma[h * p.G_in + p.g.axis[d]];
        dsig[d] += -total * x * x * is * is * is;
      }
  }
}

template <typename T, typename Acc, bool kPacked>
__global__ void __launch_bounds__(kThreads)
    relpos_backward_offset_kernel(RelposParams p, int64_t per_head, RelposTensors<T> t) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  int64_t* qrow_s = reinterpret_cast<int64_t*>(smem_raw);     // blockDim: flat (b, h, i) of a chunk's queries
  Acc* drel_s = reinterpret_cast<Acc*>(qrow_s + blockDim.x);  // D
  Acc* w_s = drel_s + p.D;                                    // blockDim: dA * scale of a chunk
  Acc* red = w_s + blockDim.x;                                // blockDim
  const int64_t blk = blockIdx.x % per_head, h = blockIdx.x / per_head;
  Head<Acc> hd;  // (a packed call's samples load their own)
  if constexpr (!kPacked) load_span_head<Acc>(p, h, t.sigma, hd);
  double dsig[kMaxGridDims] = {};  // this block's d sigma per kept axis of the (max) grid (thread 0)
  for (int64_t u = blk; u < p.U; u += per_head) {
    int64_t delta[kMaxGridDims];
    offset_of_row(u, p.g.n, p.g.ndim, delta);
    __syncthreads();  // the previous offset is done with drel_s, w_s, qrow_s and red
    for (int64_t c = threadIdx.x; c < p.D; c += blockDim.x) drel_s[c] = 0;
    Acc dbias_u = 0;
    if constexpr (!kPacked) {
      offset_pairs<T, Acc>(p, t, hd, h, delta, qrow_s, drel_s, w_s, red, dbias_u, dsig);
    } else {
      for (int64_t s = 0; s < p.packed_samples; ++s) {  // in sample order
        bool on_grid =
            true;  // (a cheap test first: thousands of small samples, most offsets off their grids)
        for (int d = 0; d < p.g.ndim; ++d) {
          const int64_t ad = delta[d] < 0 ? -delta[d] : delta[d];
          on_grid = on_grid && ad < t.packed_shapes[s * p.G_in + p.g.axis[d]];
        }
        if (!on_grid) continue;
        RelposParams sp;
        RelposTensors<T> st;
        if (!cuda_packed::packed_sample(p, t, s, sp, st)) continue;  // (reported by the check kernel)
        Head<Acc> sh;
        load_span_head<Acc>(sp, h, t.sigma, sh);
        offset_pairs<T, Acc>(sp, st, sh, h, delta, qrow_s, drel_s, w_s, red, dbias_u, dsig);
      }
    }
    __syncthreads();  // (drel_s complete)
    if (p.has_pos)
      for (int64_t c = threadIdx.x; c < p.D; c += blockDim.x)
        t.drel[(h * p.U + u) * p.D + c] = from_acc<T>(drel_s[c]);
    if (p.has_bias && threadIdx.x == 0) t.dbias[h * p.U + u] = from_acc<T>(dbias_u);
  }
  if (p.has_sigma && threadIdx.x == 0)
    for (int d = 0; d < p.g.ndim; ++d) t.dsig_part[(h * per_head + blk) * p.G_in + p.g.axis[d]] = dsig[d];
}

// ---- launchers ---------------------------------------------------------------

// Blocks per head of the offset kernel: every offset once, at most kOffsetBlocks.
inline int64_t offset_blocks_per_head(const RelposParams& p) {
  return std::min<int64_t>(p.U, kOffsetBlocks);
}

// Thread blocks of the per-token kernels (forward, dq, dkv) and of the offset kernel.
inline int64_t token_blocks(const RelposParams& p) {
  return p.B * p.H * p.N;
}
inline int64_t offset_blocks(const RelposParams& p) {
  return p.H * offset_blocks_per_head(p);
}

// Dynamic shared memory of each kernel (the caller checks it against the device).
template <typename T>
size_t forward_smem(const RelposParams& p) {
  return sizeof(int64_t) * kThreads + sizeof(acc_t<T>) * (2 * p.D + p.Dv + 2 * kThreads);
}
template <typename T>
size_t backward_dq_smem(const RelposParams& p) {
  return 2 * sizeof(int64_t) * kThreads + sizeof(acc_t<T>) * (4 * p.D + p.Dv + kThreads);
}
template <typename T>
size_t backward_dkv_smem(const RelposParams& p) {
  return sizeof(int64_t) * kThreads + sizeof(acc_t<T>) * (2 * p.D + 2 * p.Dv + 2 * kThreads);
}
template <typename T>
size_t backward_offset_smem(const RelposParams& p) {
  return sizeof(int64_t) * kThreads + sizeof(acc_t<T>) * (p.D + 2 * kThreads);
}

// out and lse (a packed call's values checked first). The caller has checked token_blocks(p) <=
// INT_MAX and the shared memory.
template <typename T>
cudaError_t launch_forward(const RelposParams& p, const RelposTensors<T>& t, cudaStream_t stream) {
  const cudaError_t err = cuda_packed::launch_packed_check(p, t.packed_offsets, t.packed_shapes, stream);
  if (err != cudaSuccess) return err;
  return cuda::launch(p.packed_samples > 0 ? relpos_forward_kernel<T, acc_t<T>, true>
                                           : relpos_forward_kernel<T, acc_t<T>, false>,
                      token_blocks(p), kThreads, forward_smem<T>(p), stream, p, t);
}

// dq and d q_pos (query-major; the first of the backward's kernels: a packed call's values checked first).
template <typename T>
cudaError_t launch_backward_dq(const RelposParams& p, const RelposTensors<T>& t, cudaStream_t stream) {
  const cudaError_t err = cuda_packed::launch_packed_check(p, t.packed_offsets, t.packed_shapes, stream);
  if (err != cudaSuccess) return err;
  return cuda::launch(p.packed_samples > 0 ? relpos_backward_dq_kernel<T, acc_t<T>, true>
                                           : relpos_backward_dq_kernel<T, acc_t<T>, false>,
                      token_blocks(p), kThreads, backward_dq_smem<T>(p), stream, p, t);
}

// dk and dv (key-major).
template <typename T>
cudaError_t launch_backward_dkv(const RelposParams& p, const RelposTensors<T>& t, cudaStream_t stream) {
  return cuda::launch(p.packed_samples > 0 ? relpos_backward_dkv_kernel<T, acc_t<T>, true>
                                           : relpos_backward_dkv_kernel<T, acc_t<T>, false>,
                      token_blocks(p), kThreads, backward_dkv_smem<T>(p), stream, p, t);
}

// d rel, d bias and the d sigma partials (nothing to do without q_pos, bias and sigma).
template <typename T>
cudaError_t launch_backward_offset(const RelposParams& p, const RelposTensors<T>& t, cudaStream_t stream) {
  if (!(p.has_pos || p.has_bias || p.has_sigma)) return cudaSuccess;
  return cuda::launch(p.packed_samples > 0 ? relpos_backward_offset_kernel<T, acc_t<T>, true>
                                           : relpos_backward_offset_kernel<T, acc_t<T>, false>,
                      offset_blocks(p), kThreads, backward_offset_smem<T>(p), stream, p,
                      offset_blocks_per_head(p), t);
}

}  // namespace cuda_general
}  // namespace relpos
}  // namespace posattn
