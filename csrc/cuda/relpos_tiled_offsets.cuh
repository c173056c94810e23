// d rel, d bias and d sigma of relpos_attention on the tensor cores, for the calls
// the tiled kernels' conditions allow (relpos_plan.cuh) where its shared memory fits, beside the
// fast or the general backward (on relpos_tiled_backward.cuh's layout and pair_gradients);
// it replaces the general path's offset kernel there, which recomputes every pair
// one thread at a time (that kernel took 89 % of a 64 x 64 forward + backward on
// the H200 of 2026-11-26; this one has not run on a real GPU yet).
//
// The pairs are visited by tile offset: tile I of queries against tile J = I + dT
// of keys, so that every pair of the block has its offset in one small box (the
// "block box", dT * tile +- (tile - 1) per axis, clipped to the head's reach and
// to the grid). A block per (head, dT) recomputes the pair's dA (the tiled
// backward's pair_gradients) for every batch element and every such I, in a
// fixed order, scatters scale * dA to (query slot, block-box entry) 64 entries at
// a time (as the query-major kernel does for d q_pos) and adds
//   d rel[box] += (scale dA_box)^T Q_pos        (tensor cores)
//   d bias[box] += column sums of dA_box         (float, fixed order)
// into float accumulators in shared memory; d sigma is each thread's sum of
// d quad * d quad / d sigma over its pairs (double), reduced in a fixed order.
//
// Deterministic without atomics: the boxes of two tile offsets whose every
// component has the same parity are disjoint (boxes are 2 tile - 1 wide, 2 tile
// apart), so the launcher runs one launch per parity class (2^G of them, in a fixed
// order; axes whose tile is one cell wide are not split: their boxes are single
// offsets), each block adding its box into float32 d rel / d bias accumulators in
// global memory that no other block of its launch touches; a last kernel rounds
// them to the inputs' dtype. scale * dA is rounded to the inputs' dtype for the
// tensor cores, as for d q_pos in the query-major kernel.
// Torch-free: the glue (csrc/relpos/relpos_tiled_cuda.cu) and the simulator
// harness call launch_backward_offsets.
#pragma once

#include <cstdint>

#include "relpos_tiled_backward.cuh"

namespace posattn {
namespace relpos {
namespace cuda_tiled {

// The tile-offset grid of a call: per axis the tiles (nt) and the offsets
// between them (2 nt - 1), and the largest block box (rows of the accumulator,
// rounded up to whole 64-row pieces).
struct OffsetGrid {
  int64_t nt[kMaxGridDims];
  int64_t count;  // prod_d (2 nt_d - 1): the tile offsets, one d sigma partial each
  int64_t rows;   // accumulator rows: prod_d min(2 tile_d - 1, 2 reach_d + 1), rounded up to 64
};

inline OffsetGrid make_offset_grid(const TiledArgs& a) {
  OffsetGrid o;
  o.count = 1;
  int64_t box = 1;
  for (int d = 0; d < a.p.g.ndim; ++d) {
    o.nt[d] = (a.p.g.n[d] + a.tile[d] - 1) / a.tile[d];
    o.count *= 2 * o.nt[d] - 1;
    // the window's reach (n_d - 1 without one) bounds every head's (a span only narrows it)
    const int64_t reach = axis_max_offset(window_limit(a.p, d, a.p.g.n[d] - 1));
    box *= std::min<int64_t>(2 * a.tile[d] - 1, 2 * std::min<int64_t>(reach, a.p.g.n[d] - 1) + 1);
  }
  o.rows = (box + 63) / 64 * 64;
  return o;
}

// Whether tile offsets along axis d are split by parity (a one-cell tile's boxes are
// single offsets, disjoint already).
__host__ __device__ inline bool parity_split(const TiledArgs& a, int d) {
  return a.tile[d] > 1;
}

// Tile offsets per head of parity class `parity` (0: an axis with one tile has no odd one).
__host__ __device__ inline int64_t parity_class_size(const TiledArgs& a, const OffsetGrid& og, int parity) {
  int64_t n = 1;
  for (int d = 0; d < a.p.g.ndim; ++d)
    n *= parity_split(a, d) ? og.nt[d] - ((parity >> d) & 1) : 2 * og.nt[d] - 1;
  return n;
}

// Shared memory of the offset kernel: the backward's layout,
// then the d rel accumulator (rows x LA floats) and the d bias one (rows floats).
template <typename CT, int D>
struct OffsetLayout {
  static constexpr int LA = D + 4;  // row stride of the d rel accumulator (a multiple of 4 floats)
  // 128-byte aligned: tensor-core loads and stores need 32-byte aligned rows
  __host__ __device__ static constexpr size_t base(int G) {
    return (BwdLayout<CT, D>::bytes(G) + 127) / 128 * 128;
  }
  __host__ __device__ static constexpr size_t bytes(int G, int64_t rows) {
    return base(G) + static_cast<size_t>(rows) * (LA + 1) * sizeof(float);
  }
};

// The block box of tile offset dT: entry (query q, key k) = qbox(q) + kbox(k) as in
// make_offset_box, over dT_d tile_d +- (tile_d - 1), clipped to the head's reach and to
// the grid's offsets (so that every entry names a row of rel). Every pair of tile I
// and tile I + dT has its offset in it or is masked (its offset beyond the reach).
__device__ inline OffsetBox block_offset_box(const TiledArgs& a, const TileHead& hd, const int64_t* dT) {
  const RelposParams& p = a.p;
  OffsetBox o;
  o.R = 1;
  for (int d = p.g.ndim - 1; d >= 0; --d) {
    int64_t lo = dT[d] * a.tile[d] - (a.tile[d] - 1), hi = dT[d] * a.tile[d] + (a.tile[d] - 1);
    const int64_t lim = hd.reach[d] < p.g.n[d] - 1 ? hd.reach[d] : p.g.n[d] - 1;
    if (lo < -lim) lo = -lim;
    if (hi > lim) hi = lim;
    o.olo[d] = lo;
    o.W[d] = hi >= lo ? hi - lo + 1 : 0;
    o.Wstride[d] = o.R;
    o.R *= o.W[d];
  }
  return o;
}

// One block: tile offset number `cls_index` of parity class `parity` (bit d: dT_d
// odd when counted from -(nt_d - 1); always 0 on an axis not split) of head h.
template <typename CT, int D>
__device__ void offsets_block(const TiledArgs& a, const OffsetGrid& og, int parity,
                              const RelposTensors<CT>& t, const BwdSmem<CT>& m, float* acc, float* bacc,
                              const TileHead& hd, int64_t h, int64_t cls_index) {
  using L = BwdLayout<CT, D>;
  constexpr int LD = L::LD, LS = L::LS, LP = L::LP, LA = OffsetLayout<CT, D>::LA;
  const RelposParams& p = a.p;
  const int G = p.g.ndim;
  const int warp = threadIdx.x / 32, r = threadIdx.x >> 1, half = threadIdx.x & 1;
  // this block's tile offset, its index among all of them, and the query tiles it pairs
  int64_t dT[kMaxGridDims], ilo[kMaxGridDims], icnt[kMaxGridDims];
  int64_t dT_index = 0, pairs = 1;
  {
    int64_t rest = cls_index;
    for (int d = G - 1; d >= 0; --d) {
      const bool split = parity_split(a, d);
      const int bit = (parity >> d) & 1;
      const int64_t cnt =
          split ? og.nt[d] - bit : 2 * og.nt[d] - 1;  // values of this parity in 0 ... 2 nt - 2
      const int64_t k = rest % cnt;
      rest /= cnt;
      dT[d] = (split ? bit + 2 * k : k) - (og.nt[d] - 1);
    }
    for (int d = 0; d < G; ++d) {
      dT_index = dT_index * (2 * og.nt[d] - 1) + dT[d] + og.nt[d] - 1;
      ilo[d] = dT[d] < 0 ? -dT[d] : 0;  // query tiles i with 0 <= i + dT < nt
      icnt[d] = og.nt[d] - (dT[d] < 0 ? -dT[d] : dT[d]);
      pairs *= icnt[d];
    }
  }
  const OffsetBox fb = block_offset_box(a, hd, dT);
  if (fb.R == 0) return;  // no kept pair at these offsets (uniform: before any barrier)
  if (p.has_pos)
    for (int64_t i = threadIdx.x; i < og.rows * LA; i += blockDim.x) acc[i] = 0.f;
  if (p.has_bias)
    for (int64_t i = threadIdx.x; i < og.rows; i += blockDim.x) bacc[i] = 0.f;
  bool visited = false;                           // some pair of tiles was visited (uniform)
  double dsq[kMaxGridDims], inv_n[kMaxGridDims];  // this thread's sum of d quad * x_d^2 per axis
#pragma unroll
  for (int d = 0; d < kMaxGridDims; ++d) {
    dsq[d] = 0.0;
    inv_n[d] = d < G ? normalised_offset(1, p.g.n[d]) : 0.0;  // x_d = (k_d - q_d) inv_n_d
  }
  CT* Tp = m.P;      // scale dA scattered to 64 block-box entries
  float* T32 = m.S;  // dA scattered likewise, in float (d bias)

  for (int64_t b = 0; b < p.B; ++b) {
    const int64_t bh = b * p.H + h;
    for (int64_t pi = 0; pi < pairs; ++pi) {
      tiling::Box qb, kb;
      {
        int64_t rest = pi;
        for (int d = G - 1; d >= 0; --d) {
          const int64_t it = ilo[d] + rest % icnt[d];
          rest /= icnt[d];
          const int64_t jt = it + dT[d];
          qb.lo[d] = it * a.tile[d];
          qb.hi[d] = qb.lo[d] + a.tile[d] < p.g.n[d] ? qb.lo[d] + a.tile[d] : p.g.n[d];
          kb.lo[d] = jt * a.tile[d];
          kb.hi[d] = kb.lo[d] + a.tile[d] < p.g.n[d] ? kb.lo[d] + a.tile[d] : p.g.n[d];
        }
      }
      // skip (uniformly) a pair of tiles with no kept pair: keys all after the queries,
      // outside their key region, or beyond the reach
      if (p.causal && ravel_index(kb.lo, p.g.n, G) > box_last_token(p, qb)) continue;
      {
        const tiling::Box kr = tiling::key_region(p.g, qb, p.has_box ? hd.lim : nullptr, p.causal);
        bool meets = true;
        for (int d = 0; d < G; ++d) meets &= kb.lo[d] < kr.hi[d] && kr.lo[d] < kb.hi[d];
        if (!meets) continue;
      }
      if (make_offset_box(p, hd, qb, kb).R == 0) continue;
      visited = true;
      __syncthreads();  // the previous pair of tiles is done with the slots and tiles
      if (threadIdx.x < kBQ) {
        fill_bwd_query_slot(p, hd, qb, threadIdx.x, bh, t.lse, t.rowd, m);
        m.qbox[threadIdx.x] = query_box_index(p, fb, m.qc, m.qtok, threadIdx.x);
      }
      __syncthreads();
      load_rows<CT, D, LD>(m.Q, t.q, m.row_off, kBQ);
      if (p.has_pos) load_rows<CT, D, LD>(m.Qp, t.qpos, m.row_off, kBQ);
      load_rows<CT, D, LD>(m.dO, t.gout, m.row_off, kBQ);
      __syncthreads();  // row_off is rewritten for the keys
      if (threadIdx.x < kBK) {
        const int c = threadIdx.x;
        fill_key_slot(p, kb, c, m.ktok, m.kc, m.krel);
        m.kbox[c] = key_box_index(p, fb, m.kc, m.ktok, c);
        m.row_off[c] = m.ktok[c] >= 0 ? bh * p.N + m.ktok[c] : -1;
      }
      __syncthreads();
      load_rows<CT, D, LD>(m.K, t.k, m.row_off, kBK);
      load_rows<CT, D, LD>(m.V, t.v, m.row_off, kBK);
      __syncthreads();
      float das[32], da[32], dquad[32];
      pair_gradients<CT, D>(p, hd, h, fb, m, t.rel, t.bias, r, half, warp, das, da, dquad);
      if (p.has_sigma) {
#pragma unroll
        for (int j = 0; j < 32; ++j) {
          if (dquad[j] == 0.f) continue;
          const int c = 2 * j + half;
#pragma unroll
          for (int d = 0; d < kMaxGridDims; ++d) {
            if (d >= G) break;
            const double x = static_cast<double>(m.kc[c * G + d] - m.qc[r * G + d]) * inv_n[d];
            dsq[d] += static_cast<double>(dquad[j]) * x * x;
          }
        }
      }
      if (!(p.has_pos || p.has_bias)) continue;
      for (int64_t p0 = 0; p0 < fb.R; p0 += 64) {
        // the previous piece is done with Tp, T32 (pair_gradients ends with a barrier)
        if (p0 > 0) __syncthreads();
        if (p.has_pos)
          for (int i = threadIdx.x; i < 64 * LP; i += blockDim.x) Tp[i] = from_acc<CT>(0.f);
        if (p.has_bias)
          for (int i = threadIdx.x; i < 64 * LS; i += blockDim.x) T32[i] = 0.f;
        __syncthreads();
        const int qbr = m.qbox[r];
#pragma unroll
        for (int j = 0; j < 32; ++j) {
          const int64_t e = static_cast<int64_t>(qbr) + m.kbox[2 * j + half] - p0;
          // a masked pair may alias a kept one's entry: only kept pairs (dA != 0) write
          if (e >= 0 && e < 64 && (das[j] != 0.f || da[j] != 0.f)) {
            if (p.has_pos) Tp[r * LP + e] = from_acc<CT>(das[j]);
            if (p.has_bias) T32[r * LS + e] = da[j];
          }
        }
        __syncthreads();
        if (p.has_pos) {  // warp w: accumulator rows p0 + 16 w ... p0 + 16 w + 15
          WarpAcc<CT, D / 16> w;
          float* rows = acc + (p0 + 16 * warp) * LA;
#pragma unroll
          for (int nt = 0; nt < D / 16; ++nt)
            nvcuda::wmma::load_matrix_sync(w.f[nt], rows + nt * 16, LA, nvcuda::wmma::mem_row_major);
          warp_mma_acc<CT, kBQ, D / 16, true, false>(Tp + warp * 16, LP, m.Qp, LD, w);
          w.store(rows, LA);
        }
        if (p.has_bias && threadIdx.x < 64) {
          float s = 0.f;
          for (int q = 0; q < kBQ; ++q) s += T32[q * LS + threadIdx.x];
          bacc[p0 + threadIdx.x] += s;
        }
      }
    }
  }
  if (!visited) return;  // nothing to add (uniform; d sigma's partial stays 0)
  __syncthreads();       // the accumulators are complete
  // add the block box into the float32 outputs (no other block of this launch has its rows)
  for (int64_t i = threadIdx.x; i < fb.R * (p.has_pos ? D : 0); i += blockDim.x) {
    const int64_t e = i / D, c = i % D;
    t.drel_acc[offset_box_rel_row(p, fb, h, e) * D + c] += acc[e * LA + c];
  }
  if (p.has_bias)
    for (int64_t e = threadIdx.x; e < fb.R; e += blockDim.x)
      t.dbias_acc[offset_box_rel_row(p, fb, h, e)] += bacc[e];
  if (p.has_sigma) {  // d sigma_d = sum d quad * (-x_d^2 / sigma_d^3), the threads' sums in order
    double* red = reinterpret_cast<double*>(m.S);  // 128 doubles fit the float scratch
    for (int d = 0; d < G; ++d) {
      __syncthreads();
      red[threadIdx.x] = dsq[d];
      __syncthreads();
      if (threadIdx.x == 0 && p.g.n[d] > 1) {
        double total = 0.0;
        for (int i = 0; i < static_cast<int>(blockDim.x); ++i) total += red[i];
        const double is = 1.0 / t.sigma[h * p.G_in + p.g.axis[d]];
        t.dsig_part[(h * og.count + dT_index) * p.G_in + p.g.axis[d]] = -total * is * is * is;
      }
    }
  }
}

template <typename CT, int D>
__global__ void __launch_bounds__(kThreads)
    relpos_tiled_offsets_kernel(TiledArgs a, OffsetGrid og, int parity, int64_t per_head,
                                RelposTensors<CT> t) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  __trap();  // bf16 tensor cores need sm_80; the host never launches this below it
#else
  extern __shared__ __align__(128) unsigned char smem[];
  const int G = a.p.g.ndim;
  const BwdSmem<CT> m = carve<CT, D>(smem, G);
  float* acc = reinterpret_cast<float*>(smem + OffsetLayout<CT, D>::base(G));
  float* bacc = acc + og.rows * OffsetLayout<CT, D>::LA;
  const int64_t h = blockIdx.x / per_head;
  TileHead hd;
  load_span_head<float>(a.p, h, t.sigma, hd);
  offsets_block<CT, D>(a, og, parity, t, m, acc, bacc, hd, h, blockIdx.x % per_head);
#endif
}

// d rel (t.drel, (H, U, D)) and d bias (t.dbias, (H, U)) in CT, through the float32
// accumulators t.drel_acc / t.dbias_acc, and the d sigma partials t.dsig_part
// (H, og.count, G_in), each only where the call has q_pos / bias / sigma. The
// caller has checked OffsetLayout<CT, D>::bytes(G, og.rows) against the device's
// opt-in limit and that H * og.count fits a launch.
template <typename CT, int D>
cudaError_t launch_backward_offsets(const TiledArgs& a, const RelposTensors<CT>& t, cudaStream_t stream) {
  const RelposParams& p = a.p;
  if (!(p.has_pos || p.has_bias || p.has_sigma)) return cudaSuccess;
  const OffsetGrid og = make_offset_grid(a);
  const size_t smem = OffsetLayout<CT, D>::bytes(p.g.ndim, og.rows);
  cudaError_t err = cudaSuccess;
  if (p.has_pos) err = cudaMemsetAsync(t.drel_acc, 0, sizeof(float) * p.H * p.U * D, stream);
  if (err == cudaSuccess && p.has_bias)
    err = cudaMemsetAsync(t.dbias_acc, 0, sizeof(float) * p.H * p.U, stream);
  if (err == cudaSuccess && p.has_sigma)
    err = cudaMemsetAsync(t.dsig_part, 0, sizeof(double) * p.H * og.count * p.G_in, stream);
  for (int parity = 0; err == cudaSuccess && parity < (1 << p.g.ndim); ++parity) {
    bool valid = true;  // no parity bit on an axis that is not split
    for (int d = 0; d < p.g.ndim; ++d) valid &= parity_split(a, d) || ((parity >> d) & 1) == 0;
    const int64_t per_head = valid ? parity_class_size(a, og, parity) : 0;
    if (per_head == 0) continue;
    err = cuda::launch(relpos_tiled_offsets_kernel<CT, D>, p.H * per_head, kThreads, smem, stream, a, og,
                       parity, per_head, t);
  }
  if (err == cudaSuccess && p.has_pos)
    err = cuda::launch_round_to<CT>(t.drel_acc, t.drel, p.H * p.U * D, stream);
  if (err == cudaSuccess && p.has_bias)
    err = cuda::launch_round_to<CT>(t.dbias_acc, t.dbias, p.H * p.U, stream);
  return err;
}

}  // namespace cuda_tiled
}  // namespace relpos
}  // namespace posattn
