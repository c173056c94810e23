// Tiled tensor-core forward of relpos_attention (FlashAttention-2 style), float16 /
// bfloat16 inputs with float32 accumulation, and float32 inputs through TF32 where
// the user allows it (torch.backends.cuda.matmul.allow_tf32); D == Dv in
// {32, 64, 128}, sm_80+.
//
// A block (4 warps) owns a query tile: a box of at most 64 cells of the grid
// (tiling::choose_tile, as on the CPU). It visits only the keys its queries may
// keep (tiling::key_region: the union of their span / window boxes, and nothing
// past the tile with causal attention), cut into key chunks of the tile's shape,
// so that the time falls with the kept keys. Per chunk:
//   S  = Q K^T                              wmma 16x16x16, fp32 accumulators
//   S += Qpos RelBox^T, scattered           the rows of rel for the offsets between
//                                           the tile and the chunk (the "offset box"
//                                           of extent tile + chunk - 1 per axis, clipped
//                                           to the head's reach), 64 rows at a time;
//                                           entry (query r, key c) sits at qbox[r] + kbox[c]
//   logits: scale, bias, span, masks        per element, 2 threads per query row
//   online softmax in registers, P (bf16 / f16) in shared memory, O += P V (wmma)
// lse is stored in float32; the backward (the fast or general kernels, the tiled or general
// offset kernel) reads it. Torch-free: the extension's glue
// (csrc/relpos/relpos_tiled_cuda.cu) and the simulator harness call the launcher.
#pragma once

#include <cstdint>

#include "relpos_tiled_common.cuh"

namespace posattn {
namespace relpos {
namespace cuda_tiled {

template <typename CT, int D>
__global__ void __launch_bounds__(kThreads) relpos_tiled_forward_kernel(TiledArgs a, RelposTensors<CT> t) {
  const CT* __restrict__ q = t.q, * __restrict__ k = t.k, * __restrict__ v = t.v, * __restrict__ qpos = t.qpos, * __restrict__ rel = t.rel, * __restrict__ bias = t.bias;
  const double* __restrict__ sigma = t.sigma;
  CT* __restrict__ out = t.out;
  float* __restrict__ lse = t.lse;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  __trap();  // bf16 tensor cores need sm_80; the host never launches this below it
#else
  using L = Layout<CT, D>;
  constexpr int LD = L::LD, LS = L::LS, LP = L::LP;
  const RelposParams& p = a.p;
  const int G = p.g.ndim;
  const int64_t tile_index = blockIdx.x % a.tiles, bh = blockIdx.x / a.tiles, h = bh % p.H;
  const int warp = threadIdx.x / 32;

  extern __shared__ __align__(128) unsigned char smem[];
  CT* Qs = reinterpret_cast<CT*>(smem);
  CT* Qps = Qs + kBQ * LD;
  CT* Ks = Qps + kBQ * LD;
  CT* Vs = Ks + kBK * LD;
  CT* Rs = Ks;  // the rel rows of an offset-box piece reuse K's tile: K is dead once S = Q K^T is read
  CT* Ps = Vs + kBK * LD;
  float* Ss = reinterpret_cast<float*>(
      Ps + kBQ * LP);  // 32-byte aligned: every tile above is 64 rows of 16-byte multiples
  int64_t* qrel = reinterpret_cast<int64_t*>(Ss + kBQ * LS);  // sum_d q_d rel_stride_d
  int64_t* krel = qrel + kBQ;                                 // sum_d (k_d + n_d - 1) rel_stride_d
  int64_t* row_off = krel + kBK;                              // the rows of a load
  int* qtok = reinterpret_cast<int*>(row_off + kBK);          // token of each query slot (-1: none)
  int* ktok = qtok + kBQ;
  int* qbox = ktok + kBK;   // query part of the offset-box index
  int* kbox = qbox + kBQ;   // key part
  int* qc = kbox + kBK;     // (kBQ, G) coordinates
  int* klo = qc + kBQ * G;  // (kBQ, G) kept keys per axis
  int* khi = klo + kBQ * G;
  int* kc = khi + kBQ * G;  // (kBK, G)

  TileHead hd;
  load_span_head<float>(p, h, sigma, hd);

  // The query tile.
  const tiling::Box tb = tiling::tile_box(p.g, a.tile, tile_index);
  if (threadIdx.x < kBQ) {
    fill_query_slot(p, hd, tb, threadIdx.x, qtok, qc, klo, khi, qrel);
    row_off[threadIdx.x] = qtok[threadIdx.x] >= 0 ? bh * p.N + qtok[threadIdx.x] : -1;
  }
  __syncthreads();
  load_rows<CT, D, LD>(Qs, q, row_off, kBQ);
  if (p.has_pos) load_rows<CT, D, LD>(Qps, qpos, row_off, kBQ);
  const int64_t tile_last_tok = box_last_token(p, tb);

  // The keys the tile may keep, cut into chunks of the tile's shape.
  const BoxChunks chunks =
      make_box_chunks(a, tiling::key_region(p.g, tb, p.has_box ? hd.lim : nullptr, p.causal));

  // Each thread owns half a query row: row r = tid / 2, the key slots 2 j + half
  // (interleaved: fewer shared-memory bank conflicts) and the output columns
  // half * D / 2 ... + D / 2 - 1.
  const int r = threadIdx.x >> 1, half = threadIdx.x & 1;
  constexpr int OC = D / 2;
  float o[OC];
  for (int j = 0; j < OC; ++j) o[j] = 0.f;
  float m = -INFINITY, l = 0.f;

  for (int64_t chunk = 0; chunk < chunks.n; ++chunk) {
    const tiling::Box cb = region_chunk(a, chunks, chunk);
    // with causal attention, a chunk whose first key comes after the tile's last query is skipped
    if (p.causal && ravel_index(cb.lo, p.g.n, G) > tile_last_tok) continue;  // uniform across the block
    const OffsetBox ob = make_offset_box(p, hd, tb, cb);
    if (ob.R == 0) continue;  // no offset of this chunk is within the head's reach: every pair is masked
    __syncthreads();          // the previous chunk is done with the key slots and the scratch
    if (threadIdx.x < kBK) {
      const int c = threadIdx.x;
      fill_key_slot(p, cb, c, ktok, kc, krel);
      kbox[c] = key_box_index(p, ob, kc, ktok, c);
      row_off[c] = ktok[c] >= 0 ? bh * p.N + ktok[c] : -1;
    } else {
      const int rr = threadIdx.x - kBK;
      qbox[rr] = query_box_index(p, ob, qc, qtok, rr);
    }
    __syncthreads();
    load_rows<CT, D, LD>(Ks, k, row_off, kBK);
    load_rows<CT, D, LD>(Vs, v, row_off, kBK);
    __syncthreads();
    // S = Q K^T (each warp its 16 rows)
    warp_mma<CT, D, kBK / 16, true>(Qs + warp * 16 * LD, LD, Ks, LD, Ss + warp * 16 * LS, LS);
    __syncthreads();
    float s[32];
#pragma unroll
    for (int j = 0; j < 32; ++j) s[j] = Ss[r * LS + 2 * j + half];
    // S += Qpos RelBox^T, 64 offset-box rows at a time, scattered to the pairs
    if (p.has_pos) {
      for (int64_t p0 = 0; p0 < ob.R; p0 += kBK) {
        __syncthreads();  // every thread has read Ss (and the previous piece's rows)
        if (threadIdx.x < kBK) row_off[threadIdx.x] = offset_box_rel_row(p, ob, h, p0 + threadIdx.x);
        __syncthreads();
        load_rows<CT, D, LD>(Rs, rel, row_off, kBK);
        __syncthreads();
        warp_mma<CT, D, kBK / 16, true>(Qps + warp * 16 * LD, LD, Rs, LD, Ss + warp * 16 * LS, LS);
        __syncthreads();
        const int qb = qbox[r];
#pragma unroll
        for (int j = 0; j < 32; ++j) {
          const int64_t e = static_cast<int64_t>(qb) + kbox[2 * j + half] - p0;
          if (e >= 0 && e < kBK) s[j] += Ss[r * LS + e];
        }
      }
    }
    // logits (scale, bias, span, masks), then the online softmax (2 threads per row); the
    // scratch is next written after the barrier that publishes P, so no barrier here
    float gauss[32];
    finish_logits<CT>(p, hd, h, bias, r, half, qtok, ktok, qc, kc, klo, khi, qrel, krel, s, gauss);
    float rowmax = -INFINITY;
#pragma unroll
    for (int j = 0; j < 32; ++j) rowmax = nan_max(rowmax, s[j]);
    rowmax = nan_max(rowmax, __shfl_xor_sync(0xffffffffu, rowmax, 1));
    const float m_new = nan_max(m, rowmax);
    float alpha = 1.f, psum = 0.f;
    if (m_new != -INFINITY) {
      // 0 while the row had nothing; NaN sticks; a +inf maximum that stays counts 1 per +inf logit
      // (exp(inf - inf) would be NaN): lse becomes +inf, as in the reference
      alpha = m == m_new ? 1.f : expf(m - m_new);
#pragma unroll
      for (int j = 0; j < 32; ++j) {
        const float pj = s[j] == -INFINITY ? 0.f : (s[j] == m_new ? 1.f : expf(s[j] - m_new));
        s[j] = pj;
        psum += pj;
      }
    } else {
      for (int j = 0; j < 32; ++j) s[j] = 0.f;
    }
    psum += __shfl_xor_sync(0xffffffffu, psum, 1);
    l = l * alpha + psum;
    m = m_new;
#pragma unroll
    for (int j = 0; j < 32; ++j) Ps[r * LP + 2 * j + half] = from_acc<CT>(s[j]);
    __syncthreads();
    // O = O * alpha + P V (each warp its 16 rows)
    warp_mma<CT, kBK, D / 16, false>(Ps + warp * 16 * LP, LP, Vs, LD, Ss + warp * 16 * LS, LS);
    __syncthreads();
    for (int j = 0; j < OC; ++j) o[j] = o[j] * alpha + Ss[r * LS + half * OC + j];
  }

  const int qt = qtok[r];
  if (qt >= 0) {
    const bool empty = m == -INFINITY || l <= 0.f;
    // a +inf logit: its weight is exp(inf - inf), so the row's output is NaN, as in the reference
    const float inv_l = empty ? 0.f : (m == INFINITY ? NAN : 1.f / l);
    CT* orow = out + (bh * p.N + qt) * D + half * OC;
    for (int j = 0; j < OC; ++j) orow[j] = from_acc<CT>(empty ? 0.f : o[j] * inv_l);
    if (half == 0) lse[bh * p.N + qt] = empty ? -INFINITY : m + logf(l);
  }
#endif
}

template <typename CT, int D>
cudaError_t forward_attributes(cudaFuncAttributes* attr) {
  return cudaFuncGetAttributes(attr, relpos_tiled_forward_kernel<CT, D>);
}

// out and lse. The caller has checked that the kernel applies (dtype, D, sm_80+,
// shared memory: Layout<CT, D>::bytes(G) within the device's opt-in limit) and
// that a.blocks fits a launch.
template <typename CT, int D>
cudaError_t launch_forward(const TiledArgs& a, const RelposTensors<CT>& t, cudaStream_t stream) {
  return cuda::launch(relpos_tiled_forward_kernel<CT, D>, a.blocks, kThreads,
                      Layout<CT, D>::bytes(a.p.g.ndim), stream, a, t);
}

}  // namespace cuda_tiled
}  // namespace relpos
}  // namespace posattn
