// What the tiled offset kernel (relpos_tiled_offsets.cuh: d rel, d bias, d sigma) shares
// with the tiled backward it was written beside (that backward's d q, d k, d v kernels are
// gone: on an H200 they took as long as the general path's, and the fast backward took their
// calls): its shared-memory layout and pair_gradients, which recomputes the logits of a
// (query box, key box) pair as the tiled forward does (relpos_tiled_forward.cuh), then, with
// P = exp(s - lse) and D_i = dO_i . out_i - d lse_i:
//   dP = dO V^T, dS = P (dP - D), dA = dS (times exp(-quad) for the multiply span).
// Torch-free.
#pragma once

#include <cstdint>

#include "relpos_tiled_common.cuh"

namespace posattn {
namespace relpos {
namespace cuda_tiled {

// Shared memory of the tiled backward's kernels, the offset kernel's base: five input tiles (row stride LD),
// two 64 x 64 tiles (P and dA, or dA and the scattered dA box; stride LP) that also hold a piece of rel while
// the logits are recomputed, one float tile (the S scratch, stride LS; at the end it stages the gradients,
// whose accumulators live in each warp's registers), then the slots' small arrays.
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

// What the offset kernel (relpos_tiled_offsets.cuh) does for one (query box, key box) pair
// once the slots, the offset box indices and the Q, Q_pos, dO, K, V tiles are in place: the
// logits (S = Q K^T, the positional term through pieces of rel in the P tile, bias, span,
// masks), P, dP = dO V^T, per thread for query slot r and key slots 2 j + half: dA * scale
// into `das`, dA itself (d bias) into `da` and d quad (the span's exponent) into `dquad`, as
// the general path's pair_backward defines them; 0 for a masked pair.
template <typename CT, int D>
__device__ void pair_gradients(const RelposParams& p, const TileHead& hd, int64_t h, const OffsetBox& ob,
                               const BwdSmem<CT>& m, const CT* __restrict__ rel, const CT* __restrict__ bias,
                               int r, int half, int warp, float* das, float* da, float* dquad) {
  using L = BwdLayout<CT, D>;
  constexpr int LD = L::LD, LS = L::LS;
  CT* Rs = m.P;  // a piece of rel
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
    da[j] = kept ? ds * g[j] : 0.f;
    // d quad: -dS (added span), -dS * x with x the multiplied logit (multiply span)
    dquad[j] = kept ? (p.has_sigma && p.mode == SpanMode::kMultiply ? -ds * s[j] : -ds) : 0.f;
  }
  __syncthreads();
}

}  // namespace cuda_tiled
}  // namespace relpos
}  // namespace posattn
