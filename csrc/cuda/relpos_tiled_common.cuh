// What the tiled tensor-core kernels of relpos_attention share (the forward in
// relpos_tiled_forward.cuh, d rel / d bias / d sigma in relpos_tiled_offsets.cuh on
// relpos_tiled_backward.cuh's layout; torch-free): tile sizes,
// the per-dtype tensor-core shape, row loads, the warp-level products, and the
// geometry of a query box, a key box and the offset box between them.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <mma.h>

#include <cfloat>
#include <climits>
#include <cstdint>
#include <type_traits>

#include "../core/grid_index.h"
#include "../core/relpos_params.h"
#include "../core/relpos_tensors.h"
#include "../core/relpos_tiling.h"
#include "cuda_common.cuh"
#include "relpos_head.cuh"

namespace posattn {
namespace relpos {
namespace cuda_tiled {

constexpr int kBQ = 64;        // query slots of a tile
constexpr int kBK = 64;        // key slots of a chunk
constexpr int kThreads = 128;  // 4 warps, 16 query rows each
static_assert(kThreads == kBQ + kBK, "the slot fills give one thread to each query slot and each key slot");
constexpr int kPad = 8;  // elements of padding per row (wmma needs ldm % 8 == 0 for 16-bit, % 4 for 32-bit)

using cuda::from_acc;
using cuda::to_acc;

// The tensor-core shape per input type: 16x16x16 for 16-bit inputs, 16x16x8 TF32
// for float32 (operands rounded to TF32 after loading).
template <typename CT>
struct Mma {
  using In = CT;
  static constexpr int K = 16;
};
template <>
struct Mma<float> {
  using In = nvcuda::wmma::precision::tf32;
  static constexpr int K = 8;
};

struct TiledArgs {
  RelposParams p;
  int64_t tile[kMaxGridDims];  // tile extents per axis of p.g
  int64_t tiles;               // tiles per (batch, head)
  int64_t blocks;              // B * H * tiles: one block per (batch, head, tile) in every tiled kernel
};

// The tiling of a call (tiling::choose_tile, as on the CPU), shared by the forward
// and both backward kernels.
inline TiledArgs make_tiled_args(const RelposParams& p) {
  TiledArgs a;
  a.p = p;
  for (int d = 0; d < kMaxGridDims; ++d) a.tile[d] = 1;
  tiling::choose_tile(p.g, kBQ, a.tile);
  a.tiles = tiling::num_tiles(p.g, a.tile);
  a.blocks = p.B * p.H * a.tiles;  // the caller checks it against a launch's limit
  return a;
}

template <typename CT, int D>
struct Layout {
  static constexpr int LD = D + kPad;                                      // row stride of the input tiles
  static constexpr int LS = (D > kBK ? D : kBK) + 4;                       // row stride of the float scratch
  static constexpr int LP = kBK + kPad;                                    // row stride of P
  static constexpr size_t tiles = size_t(4) * 64 * LD + size_t(kBQ) * LP;  // Q, Qpos, K (and Rel), V, P
  static constexpr size_t bytes(int G) {
    return tiles * sizeof(CT) + size_t(kBQ) * LS * 4         // S / T / O scratch
           + size_t(kBQ + kBK + kBK) * 8                     // qrel, krel, row_off (int64)
           + size_t(kBQ + kBK) * 4 * 2                       // qtok, ktok, qbox, kbox
           + size_t(kBQ) * G * 4 * 3 + size_t(kBK) * G * 4;  // qc, klo, khi; kc
  }
};

// Copies `rows` rows of D values (row r from src + row_off[r] * D, zeros where
// row_off[r] < 0) into dst (row stride LD), 16 bytes per thread and step.
template <typename CT, int D, int LD>
__device__ void load_rows(CT* dst, const CT* __restrict__ src, const int64_t* row_off, int rows) {
  constexpr int E = 16 / sizeof(CT);  // values per 16-byte vector
  constexpr int V = D / E;            // vectors per row
  for (int e = threadIdx.x; e < rows * V; e += blockDim.x) {
    const int r = e / V, c = (e % V) * E;
    uint4 val = make_uint4(0, 0, 0, 0);
    if (row_off[r] >= 0) val = *reinterpret_cast<const uint4*>(src + row_off[r] * D + c);
    *reinterpret_cast<uint4*>(dst + r * LD + c) = val;
  }
}

// C (16 rows x 16 * NT cols, float, row stride ldc) = A (16 x K, row-major, lda) times
// B^T when B_ROWS (B given as the rows of a row-major (16 * NT x K) matrix, ldb:
// C = A B^T), else times B (a row-major K x 16 * NT matrix, ldb).
template <typename CT, int K, int NT, bool B_ROWS>
__device__ void warp_mma(const CT* A, int lda, const CT* B, int ldb, float* C, int ldc) {
  using namespace nvcuda;
  using BLayout = typename std::conditional<B_ROWS, wmma::col_major, wmma::row_major>::type;
  using In = typename Mma<CT>::In;
  constexpr int KS = Mma<CT>::K;
  for (int nt = 0; nt < NT; ++nt) {
    wmma::fragment<wmma::accumulator, 16, 16, KS, float> acc;
    wmma::fill_fragment(acc, 0.0f);
    for (int k0 = 0; k0 < K; k0 += KS) {
      wmma::fragment<wmma::matrix_a, 16, 16, KS, In, wmma::row_major> fa;
      wmma::fragment<wmma::matrix_b, 16, 16, KS, In, BLayout> fb;
      wmma::load_matrix_sync(fa, A + k0, lda);
      wmma::load_matrix_sync(fb, B_ROWS ? B + nt * 16 * ldb + k0 : B + k0 * ldb + nt * 16, ldb);
      if constexpr (std::is_same<CT, float>::value) {
        for (int t = 0; t < fa.num_elements; ++t) fa.x[t] = wmma::__float_to_tf32(fa.x[t]);
        for (int t = 0; t < fb.num_elements; ++t) fb.x[t] = wmma::__float_to_tf32(fb.x[t]);
      }
      wmma::mma_sync(acc, fa, fb, acc);
    }
    wmma::store_matrix_sync(C + nt * 16, acc, ldc, wmma::mem_row_major);
  }
}

// max that lets a NaN through, so that a NaN logit reaches the row's output
__device__ __forceinline__ float nan_max(float a, float b) {
  return (a > b || a != a) ? a : b;
}

// A warp's 16 x 16 NT float accumulator, held in tensor-core fragments
// (registers) across a kernel's loop instead of in shared memory (its users are
// force-inlined so that the fragments never pass through local memory).
template <typename CT, int NT>
struct WarpAcc {
  nvcuda::wmma::fragment<nvcuda::wmma::accumulator, 16, 16, Mma<CT>::K, float> f[NT];

  WarpAcc() = default;  // unset (filled by load_matrix_sync)
  __device__ __forceinline__ explicit WarpAcc(float v) {
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) nvcuda::wmma::fill_fragment(f[nt], v);
  }
  // to C (16 rows x 16 NT cols, row stride ldc)
  __device__ __forceinline__ void store(float* C, int ldc) const {
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
      nvcuda::wmma::store_matrix_sync(C + nt * 16, f[nt], ldc, nvcuda::wmma::mem_row_major);
  }
};

// acc += A B with A (16 x K) row-major (lda), or column-major when A_COLS
// (element (m, k) at A[m + k * lda]: the transpose of a row-major K x 16 block),
// and B as in warp_mma. A's fragment is loaded once per K step for all NT columns.
template <typename CT, int K, int NT, bool A_COLS, bool B_ROWS>
__device__ __forceinline__ void warp_mma_acc(const CT* A, int lda, const CT* B, int ldb,
                                             WarpAcc<CT, NT>& acc) {
  using namespace nvcuda;
  using ALayout = typename std::conditional<A_COLS, wmma::col_major, wmma::row_major>::type;
  using BLayout = typename std::conditional<B_ROWS, wmma::col_major, wmma::row_major>::type;
  using In = typename Mma<CT>::In;
  constexpr int KS = Mma<CT>::K;
  for (int k0 = 0; k0 < K; k0 += KS) {
    wmma::fragment<wmma::matrix_a, 16, 16, KS, In, ALayout> fa;
    wmma::load_matrix_sync(fa, A_COLS ? A + k0 * lda : A + k0, lda);
    if constexpr (std::is_same<CT, float>::value)
      for (int t = 0; t < fa.num_elements; ++t) fa.x[t] = wmma::__float_to_tf32(fa.x[t]);
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      wmma::fragment<wmma::matrix_b, 16, 16, KS, In, BLayout> fb;
      wmma::load_matrix_sync(fb, B_ROWS ? B + nt * 16 * ldb + k0 : B + k0 * ldb + nt * 16, ldb);
      if constexpr (std::is_same<CT, float>::value)
        for (int t = 0; t < fb.num_elements; ++t) fb.x[t] = wmma::__float_to_tf32(fb.x[t]);
      wmma::mma_sync(acc.f[nt], fa, fb, acc.f[nt]);
    }
  }
}

// A head's span and limits (every thread computes its own: load_span_head<float>).
using TileHead = SpanHead<float>;

// Slot r (< 64) of a query box: its token (-1 past the box), coordinates, kept
// keys per axis and the query part of its rel / bias row.
__device__ inline void fill_query_slot(const RelposParams& p, const TileHead& hd, const tiling::Box& b, int r,
                                       int* qtok, int* qc, int* klo, int* khi, int64_t* qrel) {
  const int G = p.g.ndim;
  int64_t ext[kMaxGridDims], c[kMaxGridDims];
  for (int d = 0; d < G; ++d) ext[d] = b.hi[d] - b.lo[d];
  if (r >= tiling::box_volume(b, G)) {
    qtok[r] = -1;
    qrel[r] = 0;
    return;
  }
  unravel_index(r, ext, G, c);
  int64_t qr = 0;
  for (int d = 0; d < G; ++d) {
    c[d] += b.lo[d];
    qc[r * G + d] = static_cast<int>(c[d]);
    int64_t lo, hi;
    axis_key_range(hd.lim[d], c[d], lo, hi);
    klo[r * G + d] = static_cast<int>(lo);
    khi[r * G + d] = static_cast<int>(hi);
    qr += c[d] * p.rel_stride[d];
  }
  qtok[r] = static_cast<int>(ravel_index(c, p.g.n, G));
  qrel[r] = qr;
}

// Slot c (< 64) of a key box: its token (-1 past the box), coordinates and the
// key part of its rel / bias row, sum_d (k_d + n_d - 1) rel_stride_d.
__device__ inline void fill_key_slot(const RelposParams& p, const tiling::Box& b, int c, int* ktok, int* kc,
                                     int64_t* krel) {
  const int G = p.g.ndim;
  int64_t ext[kMaxGridDims], k[kMaxGridDims];
  for (int d = 0; d < G; ++d) ext[d] = b.hi[d] - b.lo[d];
  if (c >= tiling::box_volume(b, G)) {
    ktok[c] = -1;
    krel[c] = 0;
    return;
  }
  unravel_index(c, ext, G, k);
  int64_t kr = 0;
  for (int d = 0; d < G; ++d) {
    k[d] += b.lo[d];
    kc[c * G + d] = static_cast<int>(k[d]);
    kr += (k[d] + p.g.n[d] - 1) * p.rel_stride[d];
  }
  ktok[c] = static_cast<int>(ravel_index(k, p.g.n, G));
  krel[c] = kr;
}

// The offsets between a query box and a key box, clipped to the head's reach
// (kept pairs never leave it): entry (query q, key k) = sum_d (k_d - q_d - olo_d) Wstride_d
// = qbox(q) + kbox(k), with qbox = -sum_d (q_d + olo_d) Wstride_d, kbox = sum_d k_d Wstride_d.
struct OffsetBox {
  int64_t olo[kMaxGridDims], W[kMaxGridDims], Wstride[kMaxGridDims];
  int64_t R;
};

__device__ inline OffsetBox make_offset_box(const RelposParams& p, const TileHead& hd, const tiling::Box& qb,
                                            const tiling::Box& kb) {
  OffsetBox o;
  o.R = 1;
  for (int d = p.g.ndim - 1; d >= 0; --d) {
    int64_t lo = kb.lo[d] - (qb.hi[d] - 1), hi = kb.hi[d] - 1 - qb.lo[d];
    if (lo < -hd.reach[d]) lo = -hd.reach[d];
    if (hi > hd.reach[d]) hi = hd.reach[d];
    o.olo[d] = lo;
    o.W[d] = hi >= lo ? hi - lo + 1 : 0;
    o.Wstride[d] = o.R;
    o.R *= o.W[d];
  }
  return o;
}

// The rel row (offset from the table's start, h * U + row) of offset-box entry e, or -1 past R.
__device__ inline int64_t offset_box_rel_row(const RelposParams& p, const OffsetBox& o, int64_t h,
                                             int64_t e) {
  if (e >= o.R) return -1;
  int64_t row = 0, rest = e;
  for (int d = p.g.ndim - 1; d >= 0; --d) {
    const int64_t ed = rest % o.W[d];
    rest /= o.W[d];
    row += (o.olo[d] + ed + p.g.n[d] - 1) * p.rel_stride[d];
  }
  return h * p.U + row;
}

// A box region cut into chunks of the tile's shape (the last ones clipped): the
// key chunks of a query tile, or the query chunks of a key tile. Row-major order.
// (The CPU kernel cuts its regions differently: tiling::plan_chunks / chunk_box.)
struct BoxChunks {
  tiling::Box region;
  int64_t cnt[kMaxGridDims];  // chunks per axis
  int64_t n;                  // chunks in all (0 for an empty region)
};

__device__ inline BoxChunks make_box_chunks(const TiledArgs& a, const tiling::Box& region) {
  BoxChunks bc;
  bc.region = region;
  bc.n = 1;
  for (int d = 0; d < a.p.g.ndim; ++d) {
    const int64_t ext = region.hi[d] - region.lo[d];
    bc.cnt[d] = ext > 0 ? (ext + a.tile[d] - 1) / a.tile[d] : 0;
    bc.n *= bc.cnt[d];
  }
  return bc;
}

__device__ inline tiling::Box region_chunk(const TiledArgs& a, const BoxChunks& bc, int64_t chunk) {
  tiling::Box b;
  for (int d = a.p.g.ndim - 1; d >= 0; --d) {
    const int64_t i = chunk % bc.cnt[d];
    chunk /= bc.cnt[d];
    b.lo[d] = bc.region.lo[d] + i * a.tile[d];
    b.hi[d] = b.lo[d] + a.tile[d] < bc.region.hi[d] ? b.lo[d] + a.tile[d] : bc.region.hi[d];
  }
  return b;
}

// The token of a box's last cell (its largest token).
__device__ inline int64_t box_last_token(const RelposParams& p, const tiling::Box& b) {
  int64_t c[kMaxGridDims];
  for (int d = 0; d < p.g.ndim; ++d) c[d] = b.hi[d] - 1;
  return ravel_index(c, p.g.n, p.g.ndim);
}

// The query part (qbox) and key part (kbox) of a pair's offset-box entry, from
// the slot's coordinates (row r of qc / kc); 0 for an empty slot.
__device__ inline int query_box_index(const RelposParams& p, const OffsetBox& ob, const int* qc,
                                      const int* qtok, int r) {
  int64_t qb = 0;
  if (qtok[r] >= 0)
    for (int d = 0; d < p.g.ndim; ++d) qb -= (qc[r * p.g.ndim + d] + ob.olo[d]) * ob.Wstride[d];
  return static_cast<int>(qb);
}

__device__ inline int key_box_index(const RelposParams& p, const OffsetBox& ob, const int* kc,
                                    const int* ktok, int c) {
  int64_t kb = 0;
  if (ktok[c] >= 0)
    for (int d = 0; d < p.g.ndim; ++d) kb += static_cast<int64_t>(kc[c * p.g.ndim + d]) * ob.Wstride[d];
  return static_cast<int>(kb);
}

// The 32 logits of a thread (query slot r, key slots 2 j + half) after the scale,
// bias, span and masks (-inf where masked); `raw` holds q.k + q_pos.rel on entry.
// gauss[j] = exp(-quad) (the multiply span's factor, for its backward).
template <typename CT>
__device__ void finish_logits(const RelposParams& p, const TileHead& hd, int64_t h,
                              const CT* __restrict__ bias, int r, int half, const int* qtok, const int* ktok,
                              const int* qc, const int* kc, const int* klo, const int* khi,
                              const int64_t* qrel, const int64_t* krel, float* s, float* gauss) {
  const int G = p.g.ndim;
  const int qt = qtok[r];
  const float scale = static_cast<float>(p.scale);
#pragma unroll
  for (int j = 0; j < 32; ++j) {
    const int c = 2 * j + half;
    const int kt = ktok[c];
    bool keep = qt >= 0 && kt >= 0 && !(p.causal && kt > qt);
    if (keep && p.has_box)
      for (int d = 0; d < G; ++d) {
        const int kd = kc[c * G + d];
        keep &= kd >= klo[r * G + d] && kd <= khi[r * G + d];
      }
    float x = -INFINITY, g = 1.f;
    if (keep) {
      x = scale * s[j];
      if (p.has_bias) x += to_acc<float>(bias[h * p.U + krel[c] - qrel[r]]);
      if (p.has_sigma) {
        float quad = 0.f;
        for (int d = 0; d < G; ++d) {
          const float xd = static_cast<float>(kc[c * G + d] - qc[r * G + d]) * hd.inv_n[d] * hd.inv_sigma[d];
          quad += 0.5f * xd * xd;
        }
        if (p.mode == SpanMode::kMultiply) {
          g = expf(-quad);
          x *= g;
        } else {
          x -= quad;
        }
      }
    }
    s[j] = x;
    gauss[j] = g;
  }
}

}  // namespace cuda_tiled
}  // namespace relpos
}  // namespace posattn
