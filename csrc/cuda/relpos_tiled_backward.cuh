// Tiled tensor-core backward of relpos_attention for the calls the tiled forward
// takes (relpos_tiled_forward.cuh): d q, d q_pos (query-major) and d k, d v (key-major),
// deterministic (every gradient row is owned by one block, every sum in a fixed
// order, no atomics). d rel, d bias and d sigma come from the offset kernel in
// relpos_tiled_offsets.cuh (or the general path's, where its shared memory does not
// fit). All three kernels recompute the logits of a (query box, key box) pair
// as the forward does, then, with P = exp(s - lse) and D_i = dO_i . out_i - d lse_i:
//   dP = dO V^T, dS = P (dP - D), dA = dS (times exp(-quad) for the multiply span)
//   key-major:   dV += P^T dO,  dK += scale dA^T Q          (over the query boxes that may keep the keys)
//   query-major: dQ += scale dA K, dQpos += scale dA_box RelBox  (dA scattered to the offset box)
// Torch-free: the extension's glue (csrc/relpos/relpos_tiled_cuda.cu) and the
// simulator harness call the launcher at the end.
#pragma once

#include <cstdint>

#include "relpos_tiled_common.cuh"

namespace posattn {
namespace relpos {
namespace cuda_tiled {

// Shared memory of both kernels: five input tiles (row stride LD), two 64 x 64
// tiles (P and dA, or dA and the scattered dA box; stride LP) that also hold a
// piece of rel while the logits are recomputed, one float tile (the S scratch,
// stride LS; at the end it stages the gradients, whose accumulators live in
// each warp's registers), then the slots' small arrays.
template <typename CT, int D>
struct BwdLayout {
  static constexpr int LD = D + kPad, LS = (D > kBK ? D : kBK) + 4, LP = kBK + kPad;
  static_assert(2 * LP >= LD, "a piece of rel must fit the P / dA tiles");
  __host__ __device__ static constexpr size_t bytes(int G) {
    return (size_t(5) * 64 * LD + size_t(2) * 64 * LP) * sizeof(CT) + size_t(64) * LS * 4 +
           size_t(64) * 4 * 2         // lse, rowd of the query slots
           + size_t(64) * 8 * 3       // qrel, krel, row_off
           + size_t(64) * 4 * 4       // qtok, ktok, qbox, kbox
           + size_t(64) * G * 4 * 4;  // qc, klo, khi, kc
  }
};

// The pointers into the shared memory of BwdLayout.
template <typename CT>
struct BwdSmem {
  CT *Q, *Qp, *dO, *K, *V, *P, *DS;
  float *S, *lse, *rowd;
  int64_t *qrel, *krel, *row_off;
  int *qtok, *ktok, *qbox, *kbox, *qc, *klo, *khi, *kc;
};

template <typename CT, int D>
__device__ BwdSmem<CT> carve(unsigned char* smem, int G) {
  using L = BwdLayout<CT, D>;
  BwdSmem<CT> m;
  m.Q = reinterpret_cast<CT*>(smem);
  m.Qp = m.Q + 64 * L::LD;
  m.dO = m.Qp + 64 * L::LD;
  m.K = m.dO + 64 * L::LD;
  m.V = m.K + 64 * L::LD;
  m.P = m.V + 64 * L::LD;
  m.DS = m.P + 64 * L::LP;
  m.S = reinterpret_cast<float*>(m.DS + 64 * L::LP);
  m.lse = m.S + 64 * L::LS;
  m.rowd = m.lse + 64;
  m.qrel = reinterpret_cast<int64_t*>(m.rowd + 64);
  m.krel = m.qrel + 64;
  m.row_off = m.krel + 64;
  m.qtok = reinterpret_cast<int*>(m.row_off + 64);
  m.ktok = m.qtok + 64;
  m.qbox = m.ktok + 64;
  m.kbox = m.qbox + 64;
  m.qc = m.kbox + 64;
  m.klo = m.qc + 64 * G;
  m.khi = m.klo + 64 * G;
  m.kc = m.khi + 64 * G;
  return m;
}

// Query slot r of a backward kernel: fill_query_slot, plus the row's lse, rowd
// and the offset of its rows in q, q_pos and grad_out (-1 for an empty slot).
template <typename CT>
__device__ void fill_bwd_query_slot(const RelposParams& p, const TileHead& hd, const tiling::Box& qb, int r,
                                    int64_t bh, const float* __restrict__ lse, const float* __restrict__ rowd,
                                    const BwdSmem<CT>& m) {
  fill_query_slot(p, hd, qb, r, m.qtok, m.qc, m.klo, m.khi, m.qrel);
  const bool ok = m.qtok[r] >= 0;
  m.lse[r] = ok ? lse[bh * p.N + m.qtok[r]] : -INFINITY;
  m.rowd[r] = ok ? rowd[bh * p.N + m.qtok[r]] : 0.f;
  m.row_off[r] = ok ? bh * p.N + m.qtok[r] : -1;
}

// What every backward kernel does for one (query box, key box) pair once the slots, the
// offset box indices and the Q, Q_pos, dO, K, V tiles are in place: the logits
// (S = Q K^T, the positional term through pieces of rel in the P / dA tiles,
// bias, span, masks), P, dP = dO V^T and dA * scale, per thread for query slot
// r and key slots 2 j + half. Leaves P in m.P and dA * scale in m.DS (16-bit),
// and dA * scale in `das`. With OFFSETS (the offset kernel, relpos_tiled_offsets.cuh)
// m.P and m.DS are not written, and dA itself (d bias) goes to `da` and d quad (the
// span's exponent) to `dquad`, as the general path's pair_backward defines them;
// 0 for a masked pair.
template <typename CT, int D, bool OFFSETS = false>
__device__ void pair_gradients(const RelposParams& p, const TileHead& hd, int64_t h, const OffsetBox& ob,
                               const BwdSmem<CT>& m, const CT* __restrict__ rel, const CT* __restrict__ bias,
                               int r, int half, int warp, float* das, float* da = nullptr,
                               float* dquad = nullptr) {
  using L = BwdLayout<CT, D>;
  constexpr int LD = L::LD, LS = L::LS, LP = L::LP;
  CT* Rs = m.P;  // a piece of rel, while P and dA are not yet written
  warp_mma<CT, D, kBK / 16, true>(m.Q + warp * 16 * LD, LD, m.K, LD, m.S + warp * 16 * LS, LS);
  __syncthreads();
  float s[32], g[32];
#pragma unroll
  for (int j = 0; j < 32; ++j) s[j] = m.S[r * LS + 2 * j + half];
  if (p.has_pos) {
    for (int64_t p0 = 0; p0 < ob.R; p0 += kBK) {
      __syncthreads();  // every thread has read S (or the previous piece)
      if (threadIdx.x < kBK) m.row_off[threadIdx.x] = offset_box_rel_row(p, ob, h, p0 + threadIdx.x);
      __syncthreads();
      load_rows<CT, D, LD>(Rs, rel, m.row_off, kBK);
      __syncthreads();
      warp_mma<CT, D, kBK / 16, true>(m.Qp + warp * 16 * LD, LD, Rs, LD, m.S + warp * 16 * LS, LS);
      __syncthreads();
      const int qb = m.qbox[r];
#pragma unroll
      for (int j = 0; j < 32; ++j) {
        const int64_t e = static_cast<int64_t>(qb) + m.kbox[2 * j + half] - p0;
        if (e >= 0 && e < kBK) s[j] += m.S[r * LS + e];
      }
    }
  }
  finish_logits<CT>(p, hd, h, bias, r, half, m.qtok, m.ktok, m.qc, m.kc, m.klo, m.khi, m.qrel, m.krel, s, g);
  __syncthreads();  // every thread is done with S and the rel piece
  // dP = dO V^T
  warp_mma<CT, D, kBK / 16, true>(m.dO + warp * 16 * LD, LD, m.V, LD, m.S + warp * 16 * LS, LS);
  __syncthreads();
  const float lse_r = m.lse[r], rowd_r = m.rowd[r], scale = static_cast<float>(p.scale);
#pragma unroll
  for (int j = 0; j < 32; ++j) {
    const int c = 2 * j + half;
    const bool kept = s[j] != -INFINITY && lse_r != -INFINITY;
    const float pj = kept ? expf(s[j] - lse_r) : 0.f;
    // a masked pair adds exactly 0; a kept one P (dP - D), also where P underflows to 0, so that a
    // NaN in dP or D (or a +inf lse) stays visible as in the general path and the reference. The
    // tile products still multiply the masked zeros with every row of the tiles: a non-finite
    // input row reaches the gradients of its tile (never beyond the dense reference's NaN)
    const float ds = kept ? pj * (m.S[r * LS + c] - rowd_r) : 0.f;
    das[j] = kept ? ds * g[j] * scale : 0.f;
    if constexpr (OFFSETS) {
      da[j] = kept ? ds * g[j] : 0.f;
      // d quad: -dS (added span), -dS * x with x the multiplied logit (multiply span)
      dquad[j] = kept ? (p.has_sigma && p.mode == SpanMode::kMultiply ? -ds * s[j] : -ds) : 0.f;
    }
    if constexpr (!OFFSETS) {  // (the offset kernel needs neither)
      m.P[r * LP + c] = from_acc<CT>(pj);
      m.DS[r * LP + c] = from_acc<CT>(das[j]);
    }
  }
  __syncthreads();
}

// Where a backward block works (blockIdx.x = (batch, head) row bh times the tiles per
// head, plus its tile) and its thread's place: warp, query slot r (two threads per
// slot) and which half of the slot's columns.
struct BlockCoords {
  int64_t tile_index, bh, h;
  int warp, r, half;
  __device__ explicit BlockCoords(const TiledArgs& a)
      : tile_index(blockIdx.x % a.tiles),
        bh(blockIdx.x / a.tiles),
        h(bh % a.p.H),
        warp(threadIdx.x / 32),
        r(threadIdx.x >> 1),
        half(threadIdx.x & 1) {}
};

// Writes a warp's accumulator (its 16 slots' rows of a gradient) to dst through
// the warp's rows of the S scratch: thread (r, half) owns half of slot r's row,
// and slot r's row belongs to the thread's own warp, so a warp barrier suffices.
// The caller has made sure that no warp still reads S.
template <typename CT, int D>
__device__ __forceinline__ void store_rows(CT* __restrict__ dst, const WarpAcc<CT, D / 16>& acc, float* S,
                                           const int* tok, const BlockCoords& bc, int64_t N) {
  constexpr int LS = BwdLayout<CT, D>::LS, OC = D / 2;
  const int r = bc.r, half = bc.half;
  acc.store(S + bc.warp * 16 * LS, LS);
  __syncwarp();
  if (tok[r] >= 0) {
    CT* row = dst + (bc.bh * N + tok[r]) * D + half * OC;
    for (int j = 0; j < OC; ++j) row[j] = from_acc<CT>(S[r * LS + half * OC + j]);
  }
  __syncwarp();  // S is free for the next accumulator
}

// dK, dV: a block per (batch, head, key box = a tile of the grid); the query boxes
// of the tile's shape over the queries that may keep its keys (tiling::query_region).
template <typename CT, int D>
__device__ void dkv_block(const TiledArgs& a, const RelposTensors<CT>& t, const BwdSmem<CT>& m,
                          const TileHead& hd, const BlockCoords& bc) {
  constexpr int LD = BwdLayout<CT, D>::LD, LP = BwdLayout<CT, D>::LP;
  const RelposParams& p = a.p;
  WarpAcc<CT, D / 16> dKacc(0.f), dVacc(0.f);  // warp w: key slots 16 w ... 16 w + 15

  const tiling::Box kb = tiling::tile_box(p.g, a.tile, bc.tile_index);
  if (threadIdx.x < kBK) fill_key_slot(p, kb, threadIdx.x, m.ktok, m.kc, m.krel);
  __syncthreads();
  if (threadIdx.x < kBK)
    m.row_off[threadIdx.x] = m.ktok[threadIdx.x] >= 0 ? bc.bh * p.N + m.ktok[threadIdx.x] : -1;
  __syncthreads();
  load_rows<CT, D, LD>(m.K, t.k, m.row_off, kBK);
  load_rows<CT, D, LD>(m.V, t.v, m.row_off, kBK);
  const int64_t first_key = ravel_index(kb.lo, p.g.n, p.g.ndim);
  // The queries that may keep these keys (exactly, per axis: for shifted windows the
  // head's reach would be twice too wide), cut into boxes of the tile's shape.
  const BoxChunks chunks =
      make_box_chunks(a, tiling::query_region(p.g, kb, p.has_box ? hd.lim : nullptr, p.causal));
  for (int64_t chunk = 0; chunk < chunks.n; ++chunk) {
    const tiling::Box qb = region_chunk(a, chunks, chunk);
    // a query box wholly before the first key keeps none of them (uniform)
    if (p.causal && box_last_token(p, qb) < first_key) continue;
    const OffsetBox ob = make_offset_box(p, hd, qb, kb);
    if (ob.R == 0) continue;
    __syncthreads();  // the previous query box is done with the slots and tiles
    if (threadIdx.x < kBQ) {
      fill_bwd_query_slot(p, hd, qb, threadIdx.x, bc.bh, t.lse, t.rowd, m);
      m.qbox[threadIdx.x] = query_box_index(p, ob, m.qc, m.qtok, threadIdx.x);
    } else {
      const int c = threadIdx.x - kBQ;
      m.kbox[c] = key_box_index(p, ob, m.kc, m.ktok, c);
    }
    __syncthreads();
    load_rows<CT, D, LD>(m.Q, t.q, m.row_off, kBQ);
    if (p.has_pos) load_rows<CT, D, LD>(m.Qp, t.qpos, m.row_off, kBQ);
    load_rows<CT, D, LD>(m.dO, t.gout, m.row_off, kBQ);
    __syncthreads();
    float das[32];
    pair_gradients<CT, D>(p, hd, bc.h, ob, m, t.rel, t.bias, bc.r, bc.half, bc.warp, das);
    // dV += P^T dO, dK += (scale dA)^T Q: warp w owns key rows 16 w ... 16 w + 15
    warp_mma_acc<CT, kBQ, D / 16, true, false>(m.P + bc.warp * 16, LP, m.dO, LD, dVacc);
    warp_mma_acc<CT, kBQ, D / 16, true, false>(m.DS + bc.warp * 16, LP, m.Q, LD, dKacc);
  }
  __syncthreads();  // every warp is done with S
  store_rows<CT, D>(t.dk, dKacc, m.S, m.ktok, bc, p.N);
  store_rows<CT, D>(t.dv, dVacc, m.S, m.ktok, bc, p.N);
}

// dQ, dQpos: a block per (batch, head, query tile); the key boxes of its key region.
template <typename CT, int D>
__device__ void dq_block(const TiledArgs& a, const RelposTensors<CT>& t, const BwdSmem<CT>& m,
                         const TileHead& hd, const BlockCoords& bc) {
  constexpr int LD = BwdLayout<CT, D>::LD, LP = BwdLayout<CT, D>::LP;
  const RelposParams& p = a.p;
  WarpAcc<CT, D / 16> dQacc(0.f), dQpacc(0.f);  // warp w: query slots 16 w ... 16 w + 15

  const tiling::Box qb = tiling::tile_box(p.g, a.tile, bc.tile_index);
  if (threadIdx.x < kBQ) fill_bwd_query_slot(p, hd, qb, threadIdx.x, bc.bh, t.lse, t.rowd, m);
  __syncthreads();
  load_rows<CT, D, LD>(m.Q, t.q, m.row_off, kBQ);
  if (p.has_pos) load_rows<CT, D, LD>(m.Qp, t.qpos, m.row_off, kBQ);
  load_rows<CT, D, LD>(m.dO, t.gout, m.row_off, kBQ);
  const int64_t last_query = box_last_token(p, qb);
  const BoxChunks chunks =
      make_box_chunks(a, tiling::key_region(p.g, qb, p.has_box ? hd.lim : nullptr, p.causal));
  for (int64_t chunk = 0; chunk < chunks.n; ++chunk) {
    const tiling::Box kb = region_chunk(a, chunks, chunk);
    if (p.causal && ravel_index(kb.lo, p.g.n, p.g.ndim) > last_query) continue;  // uniform
    const OffsetBox ob = make_offset_box(p, hd, qb, kb);
    if (ob.R == 0) continue;
    __syncthreads();  // the previous key box is done with the slots and tiles
    if (threadIdx.x < kBK) {
      const int c = threadIdx.x;
      fill_key_slot(p, kb, c, m.ktok, m.kc, m.krel);
      m.kbox[c] = key_box_index(p, ob, m.kc, m.ktok, c);
      m.row_off[c] = m.ktok[c] >= 0 ? bc.bh * p.N + m.ktok[c] : -1;
    } else {
      const int s = threadIdx.x - kBK;
      m.qbox[s] = query_box_index(p, ob, m.qc, m.qtok, s);
    }
    __syncthreads();
    load_rows<CT, D, LD>(m.K, t.k, m.row_off, kBK);
    load_rows<CT, D, LD>(m.V, t.v, m.row_off, kBK);
    __syncthreads();
    float das[32];
    pair_gradients<CT, D>(p, hd, bc.h, ob, m, t.rel, t.bias, bc.r, bc.half, bc.warp, das);
    // dQ += (scale dA) K
    warp_mma_acc<CT, kBK, D / 16, false, false>(m.DS + bc.warp * 16 * LP, LP, m.K, LD, dQacc);
    // dQpos += (scale dA) scattered to the offset box, times its rows of rel (64 at a time; V is dead: it
    // holds them)
    if (p.has_pos) {
      CT* Tp = m.P;  // dA scattered to 64 offset-box entries (P itself is not needed here)
      CT* Rs = m.V;
      for (int64_t p0 = 0; p0 < ob.R; p0 += kBK) {
        __syncthreads();  // the previous piece's product is done with Tp and Rs (and the dQ product with DS)
        for (int i = threadIdx.x; i < 64 * LP; i += blockDim.x) Tp[i] = from_acc<CT>(0.f);
        if (threadIdx.x < kBK) m.row_off[threadIdx.x] = offset_box_rel_row(p, ob, bc.h, p0 + threadIdx.x);
        __syncthreads();
        const int r = bc.r, half = bc.half, qbr = m.qbox[r];
#pragma unroll
        for (int j = 0; j < 32; ++j) {
          const int64_t e = static_cast<int64_t>(qbr) + m.kbox[2 * j + half] - p0;
          if (e >= 0 && e < kBK && das[j] != 0.f) Tp[r * LP + e] = from_acc<CT>(das[j]);
        }
        load_rows<CT, D, LD>(Rs, t.rel, m.row_off, kBK);
        __syncthreads();
        warp_mma_acc<CT, kBK, D / 16, false, false>(Tp + bc.warp * 16 * LP, LP, Rs, LD, dQpacc);
      }
    }
  }
  __syncthreads();  // every warp is done with S
  store_rows<CT, D>(t.dq, dQacc, m.S, m.qtok, bc, p.N);
  if (p.has_pos) store_rows<CT, D>(t.dqpos, dQpacc, m.S, m.qtok, bc, p.N);
}

// Both backward kernels: the shared memory, the head, then the block's work.
template <typename CT, int D, bool KEY_MAJOR>
__global__ void __launch_bounds__(kThreads) relpos_tiled_backward_kernel(TiledArgs a, RelposTensors<CT> t) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  __trap();  // bf16 tensor cores need sm_80; the host never launches this below it
#else
  extern __shared__ __align__(128) unsigned char smem[];
  const BwdSmem<CT> m = carve<CT, D>(smem, a.p.g.ndim);
  const BlockCoords bc(a);
  TileHead hd;
  load_span_head<float>(a.p, bc.h, t.sigma, hd);
  if constexpr (KEY_MAJOR)
    dkv_block<CT, D>(a, t, m, hd, bc);
  else
    dq_block<CT, D>(a, t, m, hd, bc);
#endif
}

// d k, d v (key-major kernel) and d q, d q_pos (query-major kernel). The caller has
// checked that the kernels apply (BwdLayout<CT, D>::bytes(G) within the device's
// opt-in limit, sm_80+) and that a.blocks fits a launch.
template <typename CT, int D>
cudaError_t launch_backward(const TiledArgs& a, const RelposTensors<CT>& t, cudaStream_t stream) {
  const size_t smem = BwdLayout<CT, D>::bytes(a.p.g.ndim);
  cudaError_t err =
      cuda::launch(relpos_tiled_backward_kernel<CT, D, true>, a.blocks, kThreads, smem, stream, a, t);
  if (err != cudaSuccess) return err;
  return cuda::launch(relpos_tiled_backward_kernel<CT, D, false>, a.blocks, kThreads, smem, stream, a, t);
}

}  // namespace cuda_tiled
}  // namespace relpos
}  // namespace posattn
