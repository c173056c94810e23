// The fast path's forward, FlashAttention-2's structure on the warp-level primitives
// (warp_primitives.cuh): out = softmax(logits) v and its lse over the N tokens of each
// (batch, head), with causal masking (token order). POS = false: logits = scale q k^T
// (calls with no term per offset; the FA2 control the positional kernels are measured
// against). POS = true:
// logits = scale (q k^T + q_pos rel[u]) + add[u], times mul[u], with u the pair's
// offset row and add / mul the per-offset tables (bias, the span) of RelposTensors; with
// q_pos and rel null (a call with a bias or span and no q_pos), the tables only.
// Grids of NDIM = 1, 2, 3 axes (relpos_fast_boxes.cuh: the boxes). Windows (NATTEN's
// vocabulary: kernel split, query stride, causal axes, clip or shift at the borders) and
// span boxes (a threshold) as per-axis key ranges of each query (axis_key_range, the
// other paths' rule): a tile visits only the box of key blocks that covers its queries'
// ranges, a warp skips the blocks none of its rows keeps a key of, and masks only where
// some row of it does not keep every key.
//
// A block owns a query tile (a box of 64 queries, 16 per warp, each warp's a sub-box);
// key blocks (boxes of 64 keys, row-major over the tile's box of them) stream through two
// shared-memory stages, block j + 1 copied by cp.async while block j is computed. K, V
// and q_pos rows are copied per row, so a box's rows may lie anywhere in the tensors;
// rows outside the grid are zero-filled. Per key block and warp: S = Q K^T (16 x 64) in
// mma.sync accumulators, the online softmax on those registers (a row's max and sum
// across its 4 lanes by shuffles), P rounded to T in registers and fed as the A
// operand of O += P V (FA2's register reuse: S's accumulator layout is P's A layout).
//
// The positional term per warp on the tensor cores: q_pos (16 x D) times the rel rows
// of the warp's offset box (the offsets between its 16 queries and the key block), taken
// by row address from the tile's offset box (the rows between the query tile and the key
// block, which streams through the pipeline), into a per-warp shared buffer with the
// bias and span applied per offset; then a skewed read into S: pair (i, j) sits at column
// kpart(j) - qpart(i) + C0, a per-thread constant plus a compile-time one. Keys outside
// a row's ranges (the grid's end included) or after its causal limit are masked only on
// the key blocks where the warp has any. One barrier per key block (two where the offset
// tile has one stage, as two do not fit sm_90's shared memory: D = 128 on 2-D and 3-D
// grids). Where whole rows do not fit the device's class of shared memory (FwdLayout::shape,
// relpos_fast_common.cuh: float32 at D = 128 on sm_90, more on the smaller classes) the offset
// tile comes in chunks of columns (RC of DC: the products summed over them, each chunk loaded
// once every warp is done with the one before: two barriers a chunk), q_pos's fragments held
// in registers or loaded per chunk from its rows in shared memory (float32 at D = 128, whose
// fragments would not fit the registers beside Q's and O's; and with one stage of K and V where
// the positional buffers cannot hold both Q and q_pos to copy them in), and where two do not
// fit K and V in one stage (loaded once every warp is done with the last block: a barrier
// more, no overlap). Where not even that fits (99 KiB: 16-bit D = 128 and float32 D = 64, 128
// on 3-D grids, float32 D = 128 on 1-2 axes) K and V take turns in one buffer (FwdShape::kvc:
// K's columns for S, then V's for O, each part loaded once every warp is done with the one
// before), and where no region is free for Q's rows (or q_pos's) to come through, their
// fragments are read straight from the tensors (q_global, qpos_global).
// Positions within a (batch, head) in 32 bits, offsets into the tensors in 64.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "../core/relpos_params.h"
#include "../core/relpos_tensors.h"
#include "relpos_fast_boxes.cuh"
#include "relpos_fast_common.cuh"
#include "relpos_packed.cuh"
#include "warp_primitives.cuh"

namespace posattn::relpos::cuda_fast {

// How the forward keeps its inputs in shared memory (FwdLayout; offsets_shape is the offset
// kernel's twin): kv_stages of K and V (2: block j + 1 copied while block j is computed);
// rel_stages of the offset tile (2: likewise; 1: refilled once every warp is done with it);
// its rel rows dc columns at a time (dc < D: the positional products summed over D / dc
// chunks, each loaded once every warp is done with the one before); q_pos's rows kept in
// shared memory (qpos_smem: its fragments loaded per chunk; else held in registers, as Q's
// are, or with qpos_global read per chunk from the tensor). Where even one stage of K and V
// does not fit: kvc > 0, K and V take turns in one buffer of kvc columns (K's D / kvc parts of
// the columns for S, then V's for O, each loaded once every warp is done with the one before).
// q_global: Q's fragments (and q_pos's, where in registers) read from the tensors, where no
// region of shared memory is free for them to come through. kv_stages 0: no shape fits.
struct FwdShape {
  int kv_stages = 0, rel_stages = 0, dc = 0;
  bool qpos_smem = false;
  int kvc = 0;
  bool q_global = false, qpos_global = false;
};

constexpr bool operator==(const FwdShape& a, const FwdShape& b) {
  return a.kv_stages == b.kv_stages && a.rel_stages == b.rel_stages && a.dc == b.dc &&
         a.qpos_smem == b.qpos_smem && a.kvc == b.kvc && a.q_global == b.q_global &&
         a.qpos_global == b.qpos_global;
}

// SC: the shared-memory class it is sized for (relpos_fast_common.cuh, smem_budget).
template <typename T, int D, bool POS, int NDIM, int SC = 0>
struct FwdLayout {
  static_assert(D % 16 == 0 && D <= 128, "D a multiple of 16, at most 128");
  static_assert(volume<NDIM>(Box::kTile) == kBlockM && volume<NDIM>(Box::kKey) == kBlockN,
                "the boxes' sizes");
  // row stride in elements: 16 bytes of padding put the 8 rows an ldmatrix reads at
  // consecutive rows on distinct banks (float: a stride of 4 mod 32 words, the TF32
  // fragments' 32-bit loads likewise, warp_primitives.cuh)
  static constexpr int kPad = 16 / static_cast<int>(sizeof(T));
  static constexpr int kLd = D + kPad;
  static constexpr int kTile = kBlockN * kLd;  // a K or V tile (Q's, kBlockM rows, is as big)
  // the offset rows between the query tile and a key block; a warp's, padded to n-blocks
  // of 16 columns
  static constexpr int kTileOffsets = volume<NDIM>(Box::kTileOffsets);
  static constexpr int kWarpOffsets = volume<NDIM>(Box::kWarpOffsets);
  static constexpr int kWarpCols = (kWarpOffsets + 15) / 16 * 16;
  // per warp: its positional products (16 rows of its columns) and a row of scale mul
  // (+8 columns: the float2 stores free of bank conflicts)
  static constexpr int kPLd = kWarpCols + 8;
  static constexpr int kPbuf = 17 * kPLd;
  // per warp and row: its key range [lo, hi] along each axis (int2: window, span box)
  static constexpr size_t kRangeBytes = static_cast<size_t>(kWarps) * 16 * NDIM * sizeof(int2);
  static constexpr size_t kBudget = smem_budget(SC);
  // T: K and V per stage (or the one buffer of kvc columns), q_pos's tile (qpos_smem), the offset
  // tile per stage (dc + kPad columns a row); floats: the warps' positional buffers and add / mul
  // tables (per rel stage); ints: the warps' column maps; the ranges
  static constexpr size_t bytes(FwdShape f) {
    return static_cast<size_t>((f.kvc > 0 ? kBlockN * (f.kvc + kPad) : 2 * f.kv_stages * kTile) +
                               (f.qpos_smem ? kTile : 0) + f.rel_stages * kTileOffsets * (f.dc + kPad)) *
               sizeof(T) +
           static_cast<size_t>(kWarps * kPbuf + f.rel_stages * kWarps * 2 * kWarpCols +
                               2 * kWarps * kWarpCols) *
               sizeof(float) +
           kRangeBytes;
  }
  // Q's (and q_pos's, in registers) rows come through the second stage of K and V, or with one
  // stage through the warps' positional buffers (not used before their fragments are read), where
  // those hold them; else their fragments are read from the tensors
  static constexpr bool q_has_home(int kv, bool qpos_regs) {
    return kv == 2 || kWarps * kPbuf * sizeof(float) >= (qpos_regs ? 2 : 1) * kTile * sizeof(T);
  }
  // the shape: whole rows in two stages of each where they fit, else one stage of the offset
  // tile; else the offset tile in chunks, K and V in two stages where they fit with the widest
  // chunk, else in one (Q, and q_pos where it goes to registers, then copied in through the
  // warps' positional buffers, which must hold them), each chunk width first with q_pos in
  // registers, then in shared memory (always there where Q's and q_pos's fragments would not fit
  // the registers with O's: float32 at D = 128). Where none of those fits (the smaller classes):
  // the same order again with chunks down to one mma's k (8 columns in float32), Q's fragments
  // from the tensors where it has no home, q_pos's per chunk from the tensor as the last choice;
  // then K and V in turn in one buffer of D, then D / 2 columns. Plain attention: two stages of K
  // and V, else one with Q's fragments from the tensor.
  static constexpr FwdShape shape() {
    FwdShape f{};  // (one return: nvcc warns of the loop after an early one)
    if (!POS) {    // (K, V in two stages, the ranges)
      if (static_cast<size_t>(4 * kTile) * sizeof(T) + kRangeBytes <= kBudget) {
        f = FwdShape{2, 0, D, false};
      } else if (static_cast<size_t>(2 * kTile) * sizeof(T) + kRangeBytes <= kBudget) {
        f = FwdShape{1, 0, D, false, 0, true};
      }
    } else if (!(sizeof(T) == 4 && D == 128) && bytes(FwdShape{2, 2, D, false}) <= kBudget) {
      f = FwdShape{2, 2, D, false};
    } else if (!(sizeof(T) == 4 && D == 128) && bytes(FwdShape{2, 1, D, false}) <= kBudget) {
      f = FwdShape{2, 1, D, false};
    } else {
      const bool regs = !(sizeof(T) == 4 && D == 128);
      for (int kv = 2; kv >= 1 && f.kv_stages == 0; --kv)
        for (int dc = D; dc >= 16 && f.kv_stages == 0; dc /= 2)
          for (int qs = regs ? 0 : 1; qs <= 1 && f.kv_stages == 0; ++qs)
            if (D % dc == 0 && bytes(FwdShape{kv, 1, dc, qs == 1}) <= kBudget && q_has_home(kv, qs == 0))
              f = FwdShape{kv, 1, dc, qs == 1};
      // modes 0, 1: two stages, one; 2, 3: K and V in turn in one buffer of D, D / 2 columns;
      // q_pos: 0 registers, 1 shared memory, 2 read per chunk from the tensor
      constexpr int kMinDc = warp::Mma<T>::kK;
      for (int mode = 0; mode < 4 && f.kv_stages == 0; ++mode)
        for (int dc = D; dc >= kMinDc && f.kv_stages == 0; dc /= 2)
          for (int qp = regs ? 0 : 1; qp <= 2 && f.kv_stages == 0; ++qp) {
            const int kv = mode == 0 ? 2 : 1, kvc = mode < 2 ? 0 : mode == 2 ? D : D / 2;
            const FwdShape c{kv, 1, dc, qp == 1, kvc, kvc > 0 || !q_has_home(kv, qp == 0), qp == 2};
            // (a chunk's q_pos fragments, not held in registers, at most 32 registers: float32
            // at D = 128 with 128 columns a chunk spilled on sm_80)
            const bool frags_fit = qp == 0 || dc / kMinDc <= 8;
            if (D % dc == 0 && frags_fit && bytes(c) <= kBudget) f = c;
          }
    }
    return f;
  }
  static constexpr FwdShape kShape = shape();
  static constexpr bool kFits = kShape.kv_stages > 0;
  static constexpr int kKVStages = kFits ? kShape.kv_stages : 2, kRelStages = kFits ? kShape.rel_stages : 1;
  static constexpr int kDC = kFits ? kShape.dc : D, kRelChunks = D / kDC;
  static constexpr bool kQposSmem = kShape.qpos_smem, kQGlobal = kShape.q_global,
                        kQposGlobal = kShape.qpos_global;
  // K and V in turn in one buffer (kSerial) of kKVC columns, kKVParts parts of them each, rows kKVLd
  // apart (else whole rows, kLd apart)
  static constexpr bool kSerial = kShape.kvc > 0;
  static constexpr int kKVC = kSerial ? kShape.kvc : D, kKVParts = D / kKVC, kKVLd = kKVC + kPad;
  // the positional products chunk by chunk (for_chunks: the offset tile in chunks, or q_pos's
  // fragments from shared memory or the tensor), K and V of the next block copied after the last
  // chunk
  static constexpr bool kChunked = kQposSmem || kQposGlobal || kSerial || kRelChunks > 1;
  static constexpr int kRLd = kDC + kPad;  // the offset tile's rows
  static constexpr int kRTile = kTileOffsets * kRLd;
  // in elements of T: K0 V0 (K1 V1) or the one buffer of K and V, q_pos's tile (qpos_smem), then
  // (POS) the offset tile's stages; Q (and q_pos, where it goes to registers) read once, from where
  // K1 and V1 go later, or with one stage of K and V from the warps' positional buffers (kQGlobal:
  // from the tensors)
  static constexpr int kKV = kSerial ? kBlockN * kKVLd : 2 * kKVStages * kTile;
  static __device__ __forceinline__ int k_at(int stage) { return 2 * stage * kTile; }
  static __device__ __forceinline__ int v_at(int stage) { return (2 * stage + 1) * kTile; }
  static constexpr int kR0 = kKV + (kQposSmem ? kTile : 0);
  static __device__ __forceinline__ int r_at(int stage) { return kR0 + stage * kRTile; }
  static constexpr size_t kTBytes = static_cast<size_t>(POS ? kR0 + kRelStages * kRTile : kKV) * sizeof(T);
  static constexpr int kQ = kKVStages == 2 ? 2 * kTile : static_cast<int>(kTBytes / sizeof(T));
  static constexpr int kQposAt = kQposSmem ? kKV : kQ + kTile;
  static_assert(kTBytes % 16 == 0 && kWarpCols % 4 == 0, "the floats 16-byte aligned (float4 columns)");
  // then floats: the warps' positional buffers, their add and mul tables (per stage, warp,
  // table: kWarpCols entries); then ints: per warp, each column's offset row relative to
  // the key block's first (woff) and its row in the offset tile (wrow)
  static __device__ __forceinline__ int table_at(int stage, int w, int which) {
    return kWarps * kPbuf + ((stage * kWarps + w) * 2 + which) * kWarpCols;
  }
  static constexpr int kFloats = kWarps * kPbuf + kRelStages * kWarps * 2 * kWarpCols;
  // then (both kernels) the rows' key ranges, in bytes from the start
  static constexpr size_t kRangesAt =
      POS ? kTBytes + static_cast<size_t>(kFloats + 2 * kWarps * kWarpCols) * sizeof(float) : kTBytes;
  static constexpr size_t kBytes = kRangesAt + kRangeBytes;
  static_assert(kRangesAt % alignof(int2) == 0, "the ranges aligned");
  static_assert(!kFits || kBytes == (POS ? bytes(kShape) : kBytes), "the regions as bytes() counts them");
  static_assert(!kFits || kBytes <= kBudget, "the class's shared memory");
};

// The largest class (the smallest SC) whose forward layout is class SC's: the one instance
// that runs both (relpos_fast_common.cuh).
template <typename T, int D, bool POS, int NDIM, int SC>
constexpr int fwd_canonical_class() {
  if constexpr (SC > 0) {
    if constexpr (FwdLayout<T, D, POS, NDIM, SC - 1>::kShape == FwdLayout<T, D, POS, NDIM, SC>::kShape)
      return fwd_canonical_class<T, D, POS, NDIM, SC - 1>();
  }
  return SC;
}

// S += Q K^T over part H of K's columns, [H C, (H + 1) C), at Kp (a key per row, rows LDK apart):
// 8 n-blocks of 8 keys, Q's A fragments qf (all D columns) in registers.
template <typename T, int D, int C, int H, int LDK>
__device__ __forceinline__ void q_times_k(float (&s)[kBlockN / 8][4],
                                          const uint32_t (&qf)[D / warp::Mma<T>::kK][4], const T* Kp,
                                          int lane) {
  using F = warp::Mma<T>;
  constexpr int KK = F::kK;
#pragma unroll
  for (int kk = 0; kk < C / KK; ++kk) {
#pragma unroll
    for (int nb = 0; nb < kBlockN / 8; nb += 2) {
      uint32_t b[4];
      F::load_b_nmajor2(b, Kp + 8 * nb * LDK + KK * kk, LDK, lane);
      F::mma(s[nb], qf[H * (C / KK) + kk], {b[0], b[1]});
      F::mma(s[nb + 1], qf[H * (C / KK) + kk], {b[2], b[3]});
    }
  }
}

// O += P V over part H of V's columns, [H C, (H + 1) C), at Vp (a key per row, rows LDV apart):
// P's A fragments straight from S's accumulators, V's B fragments (ldmatrix.trans).
template <typename T, int D, int C, int H, int LDV>
__device__ __forceinline__ void p_times_v(float (&o)[D / 8][4], const float (&s)[kBlockN / 8][4], const T* Vp,
                                          int lane) {
  using F = warp::Mma<T>;
  constexpr int KK = F::kK;
  static_assert(C % 16 == 0, "two n-blocks of V's columns at a time");
#pragma unroll
  for (int kk = 0; kk < kBlockN / KK; ++kk) {
    uint32_t a[4];
    F::p_frag(a, s, kk);
#pragma unroll
    for (int nd = 0; nd < C / 8; nd += 2) {
      uint32_t b[4];
      F::load_b_kmajor2(b, Vp + KK * kk * LDV + 8 * nd, LDV, lane);
      F::mma(o[H * (C / 8) + nd], a, {b[0], b[1]});
      F::mma(o[H * (C / 8) + nd + 1], a, {b[2], b[3]});
    }
  }
}

// Grid (query tiles, H, B); PACKED: a packed call (B = 1), blocks over every sample's query tiles
// (relpos_packed.cuh: packed_block_sample), each run as a call of its sample's grid
// (__launch_bounds__'s minimum of 1 block per SM: without it ptxas aimed at fewer registers and
// spilled on the 1-D grid at D = 32; held to the blocks per SM that shared memory allows,
// the control spilled at D = 64 and 128. Occupancy against registers is for ncu on a GPU.)
template <typename T, int D, bool POS, int NDIM, int SC, bool PACKED = false>
__global__ void __launch_bounds__(kThreads, 1) fast_forward_kernel(RelposParams p, RelposTensors<T> t) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  __trap();  // mma.sync with bf16, ldmatrix and cp.async need sm_80; the host never launches this below it
#else
  using L = FwdLayout<T, D, POS, NDIM, SC>;
  using LR = RelRows<L>;   // (the offset tile's rows)
  using F = warp::Mma<T>;  // m16n8k16 (bf16, f16) or TF32 m16n8k8 (float)
  constexpr int LD = L::kLd, KK = F::kK, DC = L::kDC, RC = L::kRelChunks;
  constexpr float kLog2e = 1.4426950408889634f, kLn2 = 0.6931471805599453f;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* smem = reinterpret_cast<T*>(smem_raw);

  const int w = threadIdx.x / 32, lane = threadIdx.x % 32;
  FastGrid<NDIM> g(p);  // extents, token strides, offset-row strides
  int tile = blockIdx.x;
  int64_t first = 0;           // the call's first token (PACKED: its sample's)
  [[maybe_unused]] int s = 0;  // (PACKED) its sample
  if constexpr (PACKED) {
    if (!cuda_packed::packed_block_sample(p, t.packed_tiles, blockIdx.x, &s, &tile)) return;
    g.set_sample(p, t.packed_offsets, t.packed_shapes, s);
    first = t.packed_offsets[s];
  }
  const int (&n)[NDIM] = g.n;
  const int (&gs)[NDIM] = g.gs;
  const int (&rs)[NDIM] = g.rs;
  // the query tile's origin (tiles row-major over the grid) and its first token
  int t0[NDIM], tile_first = 0;
  g.box_origin(tile, t0);
#pragma unroll
  for (int a = 0; a < NDIM; ++a) tile_first += t0[a] * gs[a];
  const int64_t bh = blockIdx.z * p.H + blockIdx.y;
  const int64_t row0 = bh * p.tok_stride + first;  // the call's first row of the (batch, head)
  const int64_t head = row0 * D;                   // its offset in q, k, v, out
  const T* q = t.q + head;
  const T* k = t.k + head;
  const T* v = t.v + head;

  // which keys a query keeps along axis a (KeyRanges: windows and span boxes)
  const KeyRanges<NDIM, PACKED> kr(p, t.sigma, g, blockIdx.y);
  const auto key_range = [&](int a, int c) { return kr(p, g, a, c); };
  // each row's ranges (row lane of warp w; rows past the grid's end as its last cell's),
  // read by the warp from its first barrier on
  const int2* ranges = reinterpret_cast<const int2*>(smem_raw + L::kRangesAt) + w * 16 * NDIM;
  if (lane < 16) {
    for_axes<NDIM>([&](auto ax) {
      constexpr int a = decltype(ax)::value;
      reinterpret_cast<int2*>(smem_raw + L::kRangesAt)[(w * 16 + lane) * NDIM + a] =
          key_range(a, g.template query_coord<a>(t0, 16 * w + lane));
    });
  }

  // the key blocks the tile visits: the box of blocks that covers its queries' ranges
  // (origins kfirst ... klast per axis), row-major; with causal masking those whose first
  // key is at most the tile's last query (a prefix of that order)
  int kfirst[NDIM], klast[NDIM], blocks = 1;
#pragma unroll
  for (int a = 0; a < NDIM; ++a) {
    const int K = extent<NDIM>(Box::kKey, a), last = min(t0[a] + extent<NDIM>(Box::kTile, a), n[a]) - 1;
    kfirst[a] = key_range(a, t0[a]).x / K * K;
    klast[a] = key_range(a, last).y / K * K;
    blocks *= (klast[a] - kfirst[a]) / K + 1;
  }
  if (p.causal) {
    int rank = 0;  // of the last such block
    bool tight = true;
#pragma unroll
    for (int a = 0; a < NDIM; ++a) {
      const int K = extent<NDIM>(Box::kKey, a), last = min(t0[a] + extent<NDIM>(Box::kTile, a), n[a]) - 1;
      // (a query keeps itself, so kfirst <= its coordinate and b >= kfirst)
      const int b = tight ? min(last / K * K, klast[a]) : klast[a];
      rank = rank * ((klast[a] - kfirst[a]) / K + 1) + (b - kfirst[a]) / K;
      tight = tight && b == last;
    }
    blocks = rank + 1;
  }

  // a tile row's token (row 16 w' + i: query i of warp w'), -1 outside the grid
  const auto query_token = [&](int r) { return g.query_token(t0, r); };

  // POS: the head's rel rows and offset tables, the warp's buffers and maps
  const int U = static_cast<int>(p.U);
  // (null where the call has no q_pos: its add / mul tables only)
  const T* rel = POS && t.rel ? t.rel + static_cast<int64_t>(blockIdx.y) * U * D : nullptr;
  // (the head's tables; a packed call's sample_tables, the sample's: own, from its first token's slot;
  // wide, from row s U, indexed as the head's)
  constexpr bool kOwn = PACKED && packed_span_fits<T, D>();
  constexpr bool kWide = PACKED && packed_wide_fits<T, D>(false, NDIM);
  const bool own = kOwn && p.has_sigma;
  const auto tables_at = [&]() -> int64_t {
    if constexpr (kOwn) {
      if (own) return (static_cast<int64_t>(blockIdx.y) * p.N + first) << table_shift(p);
    } else if constexpr (kWide) {
      if (p.has_sigma) return (static_cast<int64_t>(blockIdx.y) * p.packed_samples + s) * U;
    }
    return static_cast<int64_t>(blockIdx.y) * U;
  };
  const float* add = POS && t.offset_add ? t.offset_add + tables_at() : nullptr;
  const float* mul = POS && t.offset_mul ? t.offset_mul + tables_at() : nullptr;
  const bool has_add = add != nullptr, has_mul = mul != nullptr;
  float* fsmem = reinterpret_cast<float*>(smem_raw + L::kTBytes);
  float* pbuf = fsmem + w * L::kPbuf;
  int* woff = reinterpret_cast<int*>(fsmem + L::kFloats) + w * L::kWarpCols;
  int* wrow = woff + kWarps * L::kWarpCols;
  const float scale = static_cast<float>(p.scale);
  if constexpr (POS) {
    if constexpr (kOwn) {
      int ts[NDIM];  // the tables' row strides
#pragma unroll
      for (int a = 0; a < NDIM; ++a) ts[a] = rs[a];
      if (own) g.own_strides(ts);
      fill_warp_columns<NDIM, L>(w, lane, ts, woff, wrow);
    } else {
      fill_warp_columns<NDIM, L>(w, lane, rs, woff, wrow);
    }
    __syncwarp();
  }
  // chunk c of the offset tile of key block kb into rel stage rst: its rel rows' columns
  // [c DC, (c + 1) DC) and, with chunk 0, the warp's add / mul entries
  const auto load_offsets = [&](int rst, const int* kb, int c) {
    const auto first_row = [&] { return PACKED ? g.first_offset_packed(t0, kb) : g.first_offset(t0, kb); };
    const auto table_rows = [&] {  // (own: the sample's tables' rows)
      int rows = U;
      const int u = kOwn && own ? g.first_offset_own(t0, kb, &rows) : first_row();
      return make_int2(u, rows);
    };
    load_offset_tile<T, DC, NDIM, LR, D>(smem + L::r_at(rst), rel != nullptr ? rel + c * DC : nullptr,
                                         first_row(), U, rs, c == 0 ? add : nullptr, c == 0 ? mul : nullptr,
                                         table_rows, fsmem + L::table_at(rst, w, 0),
                                         fsmem + L::table_at(rst, w, 1), woff, lane);
  };
  // (kSerial) part h of key block kb's rows of x (K or V: columns h kKVC ...) into the one buffer
  const auto load_part = [&](const T* x, int h, const int* kb) {
    load_box_async<T, L::kKVC, L::kKVLd, NDIM, Box::kKey, false, D>(
        smem, x + h * L::kKVC, nullptr, nullptr, [&](const int* y) { return g.key_token(kb, y); });
  };
  // key block kb's K and V rows into stage st (kSerial: K's first part)
  const auto load_keys = [&](int st, const int* kb) {
    if constexpr (L::kSerial) {
      load_part(k, 0, kb);
    } else {
      load_box_async<T, D, LD, NDIM, Box::kKey, true>(smem + L::k_at(st), k, smem + L::v_at(st), v,
                                                      [&](const int* x) { return g.key_token(kb, x); });
    }
  };

  int kb[NDIM];  // key block j's origin
#pragma unroll
  for (int a = 0; a < NDIM; ++a) kb[a] = kfirst[a];
  // Q's rows and q_pos's (in shared memory, or where their fragments go to registers through it)
  constexpr bool kQposRows = L::kQposSmem || !(L::kQGlobal || L::kQposGlobal);
  if constexpr (!L::kQGlobal) load_rows_async<T, D, LD, kBlockM>(smem + L::kQ, q, query_token);
  if (POS && kQposRows && rel != nullptr)
    load_rows_async<T, D, LD, kBlockM>(smem + L::kQposAt, t.qpos + head, query_token);
  load_keys(0, kb);
  if constexpr (POS) load_offsets(0, kb, 0);
  warp::cp_async_commit();

  // this thread's rows of the warp's 16 (accumulator registers 0, 1 and 2, 3): their
  // tokens (-1 outside the grid), and (POS) where their skewed reads start
  int row_tok[2], pcol[2];  // pcol: the row in pbuf + kpart(2 (lane % 4)) - qpart(row) + C0
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int il = lane / 4 + 8 * r;
    row_tok[r] = query_token(16 * w + il);
    pcol[r] = skew_start<NDIM, L>(lane, il);
  }
  const float scale_log2 = scale * kLog2e;
  float o[D / 8][4] = {};                   // O (16 x D): n-blocks of 8 columns
  float m_run[2] = {-INFINITY, -INFINITY};  // running max of the rows, base 2
  float l_run[2] = {0.f, 0.f};              // this thread's part of the rows' sums
  constexpr bool kQposRegs = POS && !L::kQposSmem && !L::kQposGlobal;
  uint32_t qf[D / KK][4];                   // Q's A fragments, loaded once
  uint32_t qpf[kQposRegs ? D / KK : 1][4];  // q_pos's (POS, in registers)
  // this thread's rows g and g + 8 of x (Q, q_pos) in the tensor, null outside the grid (zeros):
  // their fragments read from the tensor (kQGlobal, kQposGlobal)
  const auto rows_of = [&](const T* x, const T*(&rows)[2]) {
#pragma unroll
    for (int r = 0; r < 2; ++r)
      rows[r] = row_tok[r] >= 0 ? x + static_cast<int64_t>(row_tok[r]) * D : nullptr;
  };
  const T* qpos_rows[2] = {nullptr, nullptr};
  if (POS && (L::kQGlobal || L::kQposGlobal) && rel != nullptr) rows_of(t.qpos + head, qpos_rows);
  if constexpr (L::kQGlobal) {  // (no region of shared memory free to copy them in through)
    const T* q_rows[2];
    rows_of(q, q_rows);
#pragma unroll
    for (int kk = 0; kk < D / KK; ++kk) F::load_a_global(qf[kk], q_rows[0], q_rows[1], KK * kk, lane);
    if (kQposRegs && rel != nullptr) {
#pragma unroll
      for (int kk = 0; kk < (kQposRegs ? D / KK : 1); ++kk)
        F::load_a_global(qpf[kk], qpos_rows[0], qpos_rows[1], KK * kk, lane);
    }
  }

  // S's logits (Q K^T) to P = 2^(logits - the rows' running max), in place, and the running
  // max, sums and O rescaled: the positional term (POS), the masks where the key block kb needs
  // them (full: the warp's rows keep every key of it, but for the causal limit)
  const auto to_probabilities = [&](float (&s)[kBlockN / 8][4], bool full) {
    // POS: the logits in natural units, q k (scale mul) + ((scale q_pos rel + add) mul),
    // the pair's column kpart(8 nb) + e past the row's start
    float to_log2 = scale_log2;
    if constexpr (POS) {
      to_log2 = kLog2e;
      skewed_logits<NDIM, L>(s, pbuf, pcol, lane, scale, has_mul);
    }

    // scale to base 2; on key blocks with keys outside a row's ranges (the grid's end
    // included) or after its causal limit, mask; the rows' max
    int key_last = 0;  // the block's last key in the grid
#pragma unroll
    for (int a = 0; a < NDIM; ++a) key_last += (min(kb[a] + extent<NDIM>(Box::kKey, a), n[a]) - 1) * gs[a];
    if (!full || (p.causal && key_last > tile_first)) {
      mask_keys<NDIM>(s, ranges, kb, gs, lane, row_tok, p.causal, to_log2);
    } else {
#pragma unroll
      for (int nb = 0; nb < kBlockN / 8; ++nb)
#pragma unroll
        for (int i = 0; i < 4; ++i) s[nb][i] *= to_log2;
    }
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int nb = 0; nb < kBlockN / 8; ++nb)
#pragma unroll
      for (int i = 0; i < 4; ++i) mx[i >> 1] = fmaxf(mx[i >> 1], s[nb][i]);
    float base[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
      const float m_new = fmaxf(m_run[r], mx[r]);
      // a row with no key kept yet: exponents against 0 (every term is 0), nothing to rescale;
      // a maximum that stays (+inf included) rescales by 1
      base[r] = m_new == -INFINITY ? 0.f : m_new;
      const float alpha = m_run[r] == m_new ? 1.f : warp::exp2_approx(m_run[r] - base[r]);
      m_run[r] = m_new;
      l_run[r] *= alpha;
#pragma unroll
      for (int nd = 0; nd < D / 8; ++nd) {
        o[nd][2 * r] *= alpha;
        o[nd][2 * r + 1] *= alpha;
      }
    }
    // P = 2^(s - max). Non-finite logits as in the reference: a NaN (which fmaxf passed over)
    // gives NaN terms and so a NaN row; a +inf maximum counts 1 per +inf logit (2^(inf - inf)
    // would be NaN), so that lse becomes +inf and the row's output NaN (below)
    if (base[0] == INFINITY || base[1] == INFINITY) {
#pragma unroll
      for (int nb = 0; nb < kBlockN / 8; ++nb) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          s[nb][i] = s[nb][i] == base[i >> 1] ? 1.f : warp::exp2_approx(s[nb][i] - base[i >> 1]);
          l_run[i >> 1] += s[nb][i];
        }
      }
    } else {
#pragma unroll
      for (int nb = 0; nb < kBlockN / 8; ++nb) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          s[nb][i] = warp::exp2_approx(s[nb][i] - base[i >> 1]);
          l_run[i >> 1] += s[nb][i];
        }
      }
    }
  };

  for (int j = 0; j < blocks; ++j) {
    const int stage = L::kKVStages == 2 ? j & 1 : 0, rst = L::kRelStages == 2 ? stage : 0;
    if (L::kKVStages == 1 && j > 0) {  // (one stage: key block j once every warp is done with j - 1)
      __syncthreads();
      load_keys(0, kb);
      warp::cp_async_commit();
    }
    warp::cp_async_wait<0>();
    // key block j visible to every warp, and every warp done with block j - 1's stage
    __syncthreads();
    if (!L::kQGlobal && j == 0) {
#pragma unroll
      for (int kk = 0; kk < D / KK; ++kk) F::load_a(qf[kk], smem + L::kQ + 16 * w * LD + KK * kk, LD, lane);
      if (kQposRegs && rel != nullptr) {
#pragma unroll
        for (int kk = 0; kk < (kQposRegs ? D / KK : 1); ++kk)
          F::load_a(qpf[kk], smem + L::kQposAt + 16 * w * LD + KK * kk, LD, lane);
      }
      // every warp holds Q (and q_pos where it goes to registers): their buffers are K1's and
      // V1's, or with one stage of K and V the warps' positional buffers
      __syncthreads();
    }
    // block j + 1's origin (the next in row-major order over the tile's box of blocks)
    int kn[NDIM];
    {
      bool carry = true;
#pragma unroll
      for (int a = NDIM - 1; a >= 0; --a) {
        kn[a] = kb[a] + (carry ? extent<NDIM>(Box::kKey, a) : 0);
        carry = carry && kn[a] > klast[a];
        if (carry) kn[a] = kfirst[a];
      }
    }
    // the next key block into the other stage, while this one is computed (where the offset
    // tile comes in chunks, after them: a chunk's wait would wait for it too)
    if (L::kKVStages == 2 && !L::kChunked && j + 1 < blocks) {
      load_keys(stage ^ 1, kn);
      if constexpr (POS && L::kRelStages == 2) load_offsets(stage ^ 1, kn, 0);
      warp::cp_async_commit();
    }
    const T* Kj = smem + L::k_at(stage);
    const T* Vj = smem + L::v_at(stage);
    // the warp's rows keep some key of the block (else the warp skips it), all of them every
    // key of it (no mask but the causal one): from the ranges of its first and last row
    bool active = true, full = true;
#pragma unroll
    for (int a = 0; a < NDIM; ++a) {
      const int2 first = ranges[a], last = ranges[15 * NDIM + a];
      const int kend = kb[a] + extent<NDIM>(Box::kKey, a) - 1;
      active = active && kb[a] <= last.y && kend >= first.x;
      full = full && kb[a] >= last.x && kend <= first.y;
    }

    // POS: the warp's positional products first (S's registers are not live yet):
    // column c of row i: (scale q_pos rel + add) mul, and a row of scale mul
    if constexpr (POS && !L::kChunked) {
      if (active) {
        warp_positional_products<T, D, LR, true>(
            qpf, smem + L::r_at(rst), rel != nullptr, wrow, fsmem + L::table_at(rst, w, 0),
            fsmem + L::table_at(rst, w, 1), pbuf, lane, scale, has_add, has_mul);
        __syncwarp();  // the warp's products visible to its lanes
      }
      if constexpr (L::kRelStages == 1) {
        __syncthreads();  // every warp done with the offset tile: refill it with block j + 1's
        if (j + 1 < blocks) {
          load_offsets(0, kn, 0);
          warp::cp_async_commit();
        }
      }
    } else if constexpr (POS) {
      // the offset tile in RC chunks of DC columns, q_pos's fragments of each from shared memory,
      // its registers or the tensor
      for_chunks<RC>(
          [&](auto chunk) {
            constexpr int c = decltype(chunk)::value;
            if (!active) return;
            uint32_t qpc[DC / KK][4];
            if (rel != nullptr) {
#pragma unroll
              for (int kk = 0; kk < DC / KK; ++kk) {
                if constexpr (L::kQposSmem) {
                  F::load_a(qpc[kk], smem + L::kQposAt + 16 * w * LD + c * DC + KK * kk, LD, lane);
                } else if constexpr (L::kQposGlobal) {
                  F::load_a_global(qpc[kk], qpos_rows[0], qpos_rows[1], c * DC + KK * kk, lane);
                } else {
#pragma unroll
                  for (int e = 0; e < 4; ++e) qpc[kk][e] = qpf[c * (DC / KK) + kk][e];
                }
              }
            }
            warp_positional_products<T, DC, LR, true, c, RC>(
                qpc, smem + L::r_at(0), rel != nullptr, wrow, fsmem + L::table_at(0, w, 0),
                fsmem + L::table_at(0, w, 1), pbuf, lane, scale, has_add, has_mul);
          },
          [&](int next) { load_offsets(0, kb, next); });
      __syncthreads();           // every warp done with the last chunk
      if (active) __syncwarp();  // the warp's products visible to its lanes
      // block j + 1's first chunk and (two stages) its keys, while this one is computed
      if (j + 1 < blocks) {
        if constexpr (L::kKVStages == 2) load_keys(stage ^ 1, kn);
        load_offsets(0, kn, 0);
        warp::cp_async_commit();
      }
    }
    if constexpr (L::kSerial) {
      // K's parts for S = Q K^T (the first copied with the block), then P, then V's parts for
      // O += P V, each part copied once every warp is done with the one before
      float s[kBlockN / 8][4] = {};
      for_chunks<L::kKVParts>(
          [&](auto part) {
            if (active) q_times_k<T, D, L::kKVC, decltype(part)::value, L::kKVLd>(s, qf, smem, lane);
          },
          [&](int next) { load_part(k, next, kb); });
      if (active) to_probabilities(s, full);
      __syncthreads();  // every warp done with K's last part
      load_part(v, 0, kb);
      warp::cp_async_commit();
      warp::cp_async_wait<0>();
      __syncthreads();  // V's first part visible to every warp
      for_chunks<L::kKVParts>(
          [&](auto part) {
            if (active) p_times_v<T, D, L::kKVC, decltype(part)::value, L::kKVLd>(o, s, smem, lane);
          },
          [&](int next) { load_part(v, next, kb); });
#pragma unroll
      for (int a = 0; a < NDIM; ++a) kb[a] = kn[a];
      continue;
    }
    if (!active) {
#pragma unroll
      for (int a = 0; a < NDIM; ++a) kb[a] = kn[a];
      continue;
    }

    // S = Q K^T: 8 n-blocks of 8 keys; P; O += P V
    float s[kBlockN / 8][4] = {};
    q_times_k<T, D, D, 0, LD>(s, qf, Kj, lane);
    to_probabilities(s, full);
    p_times_v<T, D, D, 0, LD>(o, s, Vj, lane);
#pragma unroll
    for (int a = 0; a < NDIM; ++a) kb[a] = kn[a];
  }

  // the rows' sums across their 4 lanes; out = O / l, lse = ln(sum of exp): a row with every
  // key masked gets 0 and -inf, a row with a +inf logit NaN and +inf, a NaN row NaN
  T* out = t.out + head;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l_run[r] += __shfl_xor_sync(0xffffffffu, l_run[r], 1);
    l_run[r] += __shfl_xor_sync(0xffffffffu, l_run[r], 2);
    const int row = row_tok[r];
    if (row < 0) continue;
    const float inv = l_run[r] == 0.f ? 0.f : m_run[r] == INFINITY ? NAN : 1.f / l_run[r];
#pragma unroll
    for (int nd = 0; nd < D / 8; ++nd) {
      F::store2(out + static_cast<int64_t>(row) * D + 8 * nd + 2 * (lane % 4), o[nd][2 * r] * inv,
                o[nd][2 * r + 1] * inv);
    }
    if (lane % 4 == 0) t.lse[row0 + row] = l_run[r] == 0.f ? -INFINITY : (m_run[r] + log2f(l_run[r])) * kLn2;
  }
#endif
}

// Launches the forward over every (batch, head) and query tile, in the layout of the class of
// a device with `optin` bytes of opt-in shared memory per block (smem_class_of; its canonical
// instance). The caller has checked sm_80+ and that the layout fits (fast_forward_layout); this
// checks the rest: the layout within `optin`, check_fast_call's (relpos_fast_common.cuh), out
// aligned to two elements (the paired stores), out and lse given. cudaErrorInvalidValue where
// one fails.
// A packed call (p.packed_samples > 0; B = 1, t.packed_tiles a workspace of 2 S + 1 ints): its
// schedule (relpos_packed.cuh: its offsets and shapes checked on the device, the tail's outputs
// written, the samples ranked by their tiles), then one launch over every sample's query tiles, the
// largest samples' first (as many blocks as the bound from T, S and the max grid allows; those past
// the last tile return); with a span, the samples' own tables (sample_tables).
template <typename T, int D, bool POS, int NDIM>
cudaError_t launch_fast_forward(const RelposParams& p, const RelposTensors<T>& t, size_t optin,
                                cudaStream_t stream) {
  int64_t tiles = 0;
  const cudaError_t bad = check_fast_call<D, POS, NDIM>(p, t, &tiles);
  if (bad != cudaSuccess) return bad;
  if (reinterpret_cast<uintptr_t>(t.out) % (2 * sizeof(T)) != 0) return cudaErrorInvalidValue;
  const int sc = smem_class_of(optin);
  if (sc < 0) return cudaErrorInvalidValue;
  if (p.N == 0 || p.B == 0 || p.H == 0) return cudaSuccess;
  if (t.out == nullptr || t.lse == nullptr) return cudaErrorInvalidValue;
  const bool packed = p.packed_samples > 0;
  if (packed ? !kPackedInstances : !kSingleGridInstances) return cudaErrorNotSupported;
  const int3 tile_box = make_int3(extent<NDIM>(Box::kTile, 0), NDIM > 1 ? extent<NDIM>(Box::kTile, 1) : 1,
                                  NDIM > 2 ? extent<NDIM>(Box::kTile, 2) : 1);
  if (packed) {
    if (p.B != 1 || (p.has_sigma && !packed_span_fits<T, D>() &&
                     !(packed_wide_fits<T, D>(false, NDIM) && wide_tables_fit(p))))
      return cudaErrorInvalidValue;
    const cudaError_t e = cuda_packed::launch_packed_schedule(p, t, NDIM, tile_box, stream);
    if (e != cudaSuccess) return e;
    tiles = cuda_packed::packed_tiles_bound(p, NDIM, tile_box);
    if (tiles >= (int64_t{1} << 31)) return cudaErrorInvalidValue;
  }
  return by_smem_class(sc, [&](auto c) -> cudaError_t {
    constexpr int SC = fwd_canonical_class<T, D, POS, NDIM, decltype(c)::value>();
    using L = FwdLayout<T, D, POS, NDIM, SC>;
    if constexpr (!L::kFits) {
      return cudaErrorInvalidValue;  // (the plan never gives it such a call)
    } else {
      if (L::kBytes > optin) return cudaErrorInvalidValue;
      const auto launch = [&](auto kernel) {
        if (L::kBytes > 48 * 1024) {
          const cudaError_t e =
              cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, L::kBytes);
          if (e != cudaSuccess) return e;
        }
        const dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>(p.H), static_cast<unsigned>(p.B));
        kernel<<<grid, kThreads, L::kBytes, stream>>>(p, t);
        return cudaGetLastError();
      };
      if (packed) {
        if constexpr (kPackedInstances) return launch(fast_forward_kernel<T, D, POS, NDIM, SC, true>);
      } else {
        if constexpr (kSingleGridInstances) return launch(fast_forward_kernel<T, D, POS, NDIM, SC>);
      }
      return cudaErrorNotSupported;
    }
  });
}

// launch_fast_forward for the call's grid rank (p.g.ndim: 2 or 3, else 1: the tokens in a
// row, which the control takes on any grid).
template <typename T, int D, bool POS>
cudaError_t launch_fast_forward_by_rank(const RelposParams& p, const RelposTensors<T>& t, size_t optin,
                                        cudaStream_t stream) {
  if (p.g.ndim == 3) return launch_fast_forward<T, D, POS, 3>(p, t, optin, stream);
  if (p.g.ndim == 2) return launch_fast_forward<T, D, POS, 2>(p, t, optin, stream);
  return launch_fast_forward<T, D, POS, 1>(p, t, optin, stream);
}

// The forward of a call the plan gave the fast path: the positional instance where the call
// has a term per offset (has_offset_terms), else the control's (plain attention, its windows
// and causal masking included).
template <typename T, int D>
cudaError_t launch_fast_forward_call(const RelposParams& p, const RelposTensors<T>& t, size_t optin,
                                     cudaStream_t stream) {
  return has_offset_terms(p) ? launch_fast_forward_by_rank<T, D, true>(p, t, optin, stream)
                             : launch_fast_forward_by_rank<T, D, false>(p, t, optin, stream);
}

// The forward's layout in class sc on a grid of `ndim` axes (the plan's check and report); pos:
// the call has a term per offset (the positional kernel; else the control's). shape.kv_stages
// 0: it does not fit the class.
struct FwdLayoutInfo {
  FwdShape shape;
  size_t bytes = 0;  // 0: it does not fit
};
template <typename T, int D, bool POS, int NDIM, int SC>
constexpr FwdLayoutInfo fast_forward_layout_() {
  using L = FwdLayout<T, D, POS, NDIM, SC>;
  return L::kFits ? FwdLayoutInfo{L::kShape, L::kBytes} : FwdLayoutInfo{};
}
template <typename T, int D, int SC>
constexpr FwdLayoutInfo fast_forward_layout_sc(int ndim, bool pos) {
  if (pos)
    return ndim == 3   ? fast_forward_layout_<T, D, true, 3, SC>()
           : ndim == 2 ? fast_forward_layout_<T, D, true, 2, SC>()
                       : fast_forward_layout_<T, D, true, 1, SC>();
  return ndim == 3   ? fast_forward_layout_<T, D, false, 3, SC>()
         : ndim == 2 ? fast_forward_layout_<T, D, false, 2, SC>()
                     : fast_forward_layout_<T, D, false, 1, SC>();
}
template <typename T, int D>
constexpr FwdLayoutInfo fast_forward_layout(int ndim, bool pos, int sc) {
  return sc == 0   ? fast_forward_layout_sc<T, D, 0>(ndim, pos)
         : sc == 1 ? fast_forward_layout_sc<T, D, 1>(ndim, pos)
                   : fast_forward_layout_sc<T, D, 2>(ndim, pos);
}

}  // namespace posattn::relpos::cuda_fast
