// The fast path's d rel, d bias and d sigma: the offset kernel in the structure of the fast
// backward (relpos_fast_backward.cuh), deterministic (fixed orders, no floating-point atomics).
//
// Every pair of a query tile I and a key block J = I + dT (dT: the tile offset, in tiles
// per axis) has its offset in the same tile offset box, the rows of rel the fast kernels
// copy per (tile, key block) pair. So a block owns one tile offset dT of one head: it copies
// that box's rel rows and add / mul entries once, then streams the pairs (batch element b,
// tile I) of its dT in a fixed order (two cp.async stages of q_pos, one of Q, dO, K, V; in the
// smallest layouts q_pos in chunks too, OffLayout's QCH),
// and per pair every warp recomputes its 16 queries' logits, P and dS' as the backward does.
// Then:
//   d rel[box] += X q_pos: X (tile offset box x 64 queries) holds dS' at (offset of (i,
//     j), i), a permutation of each query's row, 0 elsewhere (T, in the warp's pbuf, whose
//     positional products are spent by then); warp w owns the box's 16-row chunks w, w + 4,
//     ... and adds their X q_pos (the tensor cores; 16 x 16 blocks of X that no query group
//     reaches skipped at compile time) into float accumulators in shared memory;
//   d bias, d sigma: per warp column sums over its 16 rows of dA (d bias's, each pair's times
//     the offset's mul; d quad's with span add) and, with span multiply, of dA times the logit
//     (d quad's), in float registers per column of the warp's offset box; added into the tile
//     offset box in warp order at the end (a packed call with a span: d quad's per sample, as
//     the sample's pairs end, each sample's d sigma by its own grid's normalisation).
// At the end the block writes its d sigma partial and adds its box into float32 d rel / d bias
// accumulators in global memory. Boxes of tile offsets within one of each other on every axis
// overlap (2 tile - 1 wide, a tile apart), so the adds are ordered (FA3's deterministic
// backward orders its dQ adds alike): one launch holds every item (head, tile offset, column
// block), numbered heaviest tile offsets first; a block takes the next item by ticket as it
// starts, and before its adds waits for the done flags of the items numbered before it whose
// boxes overlap its own. So every offset row receives its adds in item order, whatever the
// blocks' timing (bitwise reproducible), and the waits cannot deadlock: an item waited on is
// held by a block that started earlier. (Before: one launch per parity class of tile offsets,
// 2^NDIM in a row, each with its own tail, a class's heaviest block alone at the end.) A last
// kernel rounds d rel and d bias to T. A call with a bias or span and no q_pos (rel null): the
// same stream and sums, without X and d rel.
#pragma once

#include <algorithm>
#include <climits>

#include "cuda_common.cuh"
#include "relpos_fast_backward.cuh"
#include "relpos_packed.cuh"
#include "relpos_fast_tables.cuh"

namespace posattn::relpos::cuda_fast {

// The tile offsets of a call: per axis the tiles (nt) and dT_a in [-reach_a, reach_a] (nt_a
// - 1, or fewer where a window bounds every head's offsets); count: d sigma partials per head.
struct OffsetTiles {
  int nt[3] = {1, 1, 1};
  int reach[3] = {0, 0, 0};
  int count = 1;
};

template <int NDIM>
inline OffsetTiles offset_tiles(const RelposParams& p) {
  OffsetTiles o;
  for (int a = 0; a < NDIM; ++a) {
    // (a packed call's tiles: the max grid's, which holds every sample's)
    const int64_t n = NDIM == 1 && p.packed_samples == 0 ? p.N : p.g.n[a], e = extent<NDIM>(Box::kTile, a);
    int64_t lim = n - 1;  // the largest offset a key may have along the axis
    if (p.has_box && p.g.ndim == NDIM)
      lim = std::min<int64_t>(lim, axis_max_offset(window_limit(p, a, n - 1)));
    o.nt[a] = static_cast<int>((n + e - 1) / e);
    o.reach[a] = static_cast<int>(std::min<int64_t>(o.nt[a] - 1, (std::max<int64_t>(lim, 0) + e - 1) / e));
    o.count *= 2 * o.reach[a] + 1;
  }
  return o;
}

// The rank the fast kernels take a call with (relpos_fast_backward.cuh, launch_*_by_rank).
inline OffsetTiles fast_offset_tiles(const RelposParams& p) {
  return p.g.ndim == 3 ? offset_tiles<3>(p) : p.g.ndim == 2 ? offset_tiles<2>(p) : offset_tiles<1>(p);
}

// DA: the columns of d rel a block accumulates (D, or a part of D where D's accumulator does
// not fit: a block per part, each recomputing the logits). DC: the columns of Q, dO, K, V and
// the offset tile's rel rows in shared memory at a time (D, or a chunk of D where the whole
// rows do not fit: the logits and dP summed over D / DC chunks, each loaded after the last
// one's products, the rel rows per pair); q_pos's rows are whole. AR: d rel's accumulators in
// registers (each warp's chunks of the tile offset box), not in shared memory: written at the end
// into the inputs' region, spent by then (the smaller classes' layouts, where the shared ones do not
// fit; at most kMaxAccRegs registers a thread). QCH (the smallest classes, with DC < D): q_pos's rows in
// chunks as well, one stage (its products' columns with the chunk), and the DA columns of d rel's
// X q_pos in a tile of their own, loaded with the last chunk; else q_pos's whole rows in two
// stages. XP: X in XP parts of the tile offset box's chunks, each written and multiplied in turn
// (float32, whose X outgrows the positional products).
template <typename T, int D, int NDIM, int DA = D, int DC = D, bool AR = false, bool QCH = false, int XP = 1>
struct OffLayout {
  // the narrowest chunk: one k-step of the MMA (16 columns; float32 through TF32, 8)
  static constexpr int kMinChunk = sizeof(T) == 4 ? 8 : 16;
  // d rel's accumulators in registers: at most 48 a thread (3-D grids' 6 chunks of 16 columns a
  // warp), float32 only with chunks of 8 columns (ptxas for sm_80 / sm_86 / sm_90: 252-255
  // registers, no spills; float32 with chunks of 16 spilled 28 bytes on sm_86), else 32
  static constexpr int kMaxAccRegs = sizeof(T) == 2 || DC == 8 ? 48 : 32;
  static_assert(D % 16 == 0 && D <= 128 && D % DA == 0 && DA % 16 == 0, "D a multiple of 16, at most 128");
  static_assert(D % DC == 0 && DC % kMinChunk == 0, "chunks of 16 columns or more (float32: 8)");
  static_assert(!QCH || DC < D, "q_pos in chunks: the inputs' rows in chunks");
  static_assert(XP == 1 || XP == 2, "X whole or in two parts");
  static constexpr int kChunksD = D / DC;
  // (16 bytes of row padding, as the backward's: for float kLd and kXLd are 4 mod 8 words)
  static constexpr int kPad = 16 / static_cast<int>(sizeof(T));
  static constexpr int kLd = DC + kPad, kQLd = D + kPad;  // Q, dO, K, V, rel; q_pos's whole rows
  static constexpr int kTile = 64 * kLd, kQTile = 64 * kQLd;
  // the stride of the q_pos rows X q_pos reads (the kernel's qa_col: their first column of d rel's block)
  static constexpr int kQaLd = QCH ? DA + kPad : kQLd;
  static constexpr int kTileOffsets = volume<NDIM>(Box::kTileOffsets);
  static constexpr int kWarpOffsets = volume<NDIM>(Box::kWarpOffsets);
  static constexpr int kWarpCols = (kWarpOffsets + 15) / 16 * 16;
  static constexpr int kPLd = kWarpCols + 8;  // the positional products (float), as the backward's
  static constexpr int kCols = (kWarpOffsets + 31) / 32;  // a lane's columns of the warp's offset box
  static constexpr int kChunks = (kTileOffsets + 15) / 16, kRows = 16 * kChunks;
  // X's parts (of kPartChunks chunks) and rows (T), one per query, in its warp's pbuf
  static constexpr int kPartChunks = (kChunks + XP - 1) / XP;
  static constexpr int kXLd = 16 * kPartChunks + kPad;
  // per warp: its positional products (17 rows, as the backward's), later its rows of X (in
  // float, more than the products: the buffer is the larger of the two)
  static constexpr int kXFloats = (16 * kXLd * static_cast<int>(sizeof(T)) / 4 + 3) / 4 * 4;
  static constexpr int kPbuf = 17 * kPLd > kXFloats ? 17 * kPLd : kXFloats;
  static constexpr int kALd = DA + 8;  // the d rel accumulator's rows (float)
  // T: Q, dO, K, V, q_pos in two stages (QCH: its chunk, then its rows of d rel's columns), the
  // offset tile
  static constexpr int kQ = 0, kDO = kTile, kK = 2 * kTile, kV = 3 * kTile;
  static constexpr int kQA = 5 * kTile;  // (QCH)
  static constexpr int kR = 4 * kTile + (QCH ? kTile + 64 * kQaLd : 2 * kQTile);
  static __device__ __forceinline__ int qpos_at(int stage) { return 4 * kTile + (QCH ? 0 : stage * kQTile); }
  static constexpr int kTElems = (kR + kTileOffsets * kLd + 7) / 8 * 8;
  static constexpr size_t kTBytes = static_cast<size_t>(kTElems) * sizeof(T);
  // floats: per warp pbuf, per warp its add / mul entries, the d rel accumulator (not with AR),
  // the pair's lse and rowd, the block's ticket (a slot of its own: nothing else writes it)
  static constexpr int kTables = kWarps * kPbuf;
  static constexpr int kAcc = kTables + kWarps * 2 * kWarpCols;
  // AR: a warp's chunks of the tile offset box (w, w + 4, ...), each thread's registers for them
  static constexpr int kWarpChunks = (kChunks + kWarps - 1) / kWarps;
  static constexpr int kAccRegs = kWarpChunks * DA / 2;
  static constexpr bool kAccInInputs = static_cast<size_t>(kRows) * kALd * 4 <= kTBytes;
  static constexpr int kRowsF = kAcc + (AR ? 0 : kRows * kALd);
  static constexpr int kTicket = kRowsF + 2 * kBlockM;
  static constexpr int kFloats = kTicket + 4;
  // at the end, over the spent pbufs: d sigma's reduction (kThreads doubles from fs), then the
  // sums per tile offset (d bias's, d quad's)
  static constexpr int kSums = 2 * kThreads;
  static_assert(kSums + 2 * kRows <= kTables, "the end's sums within the pbufs");
  // ints: per warp its columns' offset rows (woff), then per warp its tile offset box rows
  // (wrow), then the rows with a pair per column (wmask: the same for every warp, one copy);
  // int2: per warp its rows' key ranges
  static constexpr size_t kIntsAt = kTBytes + static_cast<size_t>(kFloats) * 4;
  static constexpr size_t kRangesAt = kIntsAt + (2 * kWarps + 1) * kWarpCols * 4;
  static constexpr size_t kBytes = kRangesAt + kWarps * 16 * NDIM * 8;
  static_assert(16 * kXLd * sizeof(T) <= kPbuf * 4, "a warp's rows of X fit its pbuf");
  static_assert(kTBytes % 16 == 0 && kPbuf % 4 == 0 && kIntsAt % 8 == 0 && kAcc % 2 == 0 &&
                    kRangesAt % 8 == 0,
                "the regions aligned (uint4, float2, int2)");
  static __device__ __forceinline__ int table_at(int, int w, int which) {
    return kTables + (2 * w + which) * kWarpCols;
  }
};

// Per 16-row chunk c of the tile offset box, which warps' query groups q reach it: X's 16 x
// 16 blocks that are not all zero (bit 4 c + q of two 64-bit words: constants, where a table
// indexed at run time would go to local memory).
template <int NDIM>
struct ChunkGroups {
  static constexpr int kTileOffsets = volume<NDIM>(Box::kTileOffsets);
  static_assert((kTileOffsets + 15) / 16 * kWarps <= 128, "two words of bits");
  unsigned long long bits[2] = {};
  // column part (tile offset box strides) of key 8 nb
  int col[kBlockN / 8] = {};
  constexpr ChunkGroups() {
    for (int e = 0; e < kTileOffsets; ++e)
      for (int g = 0; g < kWarps; ++g) {
        bool in = true;  // e inside warp g's offset box (every entry of which some pair has)
        for (int a = 0; a < NDIM; ++a) {
          const int y = coord<NDIM>(Box::kTileOffsets, e, a);
          const int lo = warp_to_tile_offset<NDIM>(g, 0, a);
          in = in && y >= lo && y < lo + extent<NDIM>(Box::kWarpOffsets, a);
        }
        const int bit = e / 16 * kWarps + g;
        if (in) bits[bit / 64] |= 1ull << (bit % 64);
      }
    for (int nb = 0; nb < kBlockN / 8; ++nb)
      for (int a = 0; a < NDIM; ++a)
        col[nb] += coord<NDIM>(Box::kKey, 8 * nb, a) * stride<NDIM>(Box::kTileOffsets, a);
  }
  __device__ __forceinline__ bool reaches(int c, int q) const {
    const int bit = c * kWarps + q;
    return ((bit < 64 ? bits[0] >> bit : bits[1] >> (bit - 64)) & 1) != 0;
  }
};

// The order the fast offset kernel takes its items in: tile offsets by sum_a |dT_a| (the ones
// with the most pairs first, roughly), ties by their number (row-major over dT + reach: the
// d sigma partial's slot); within a tile offset its column blocks, within those the heads.
// Item k: head k % H, column block (k / H) % Z, the tile offset of rank k / (H Z). (On a GPU's
// 132 SMs, by benchmarks/offset_order_model.py, B = 4, H = 8: 1.13x the ideal makespan at 64 x 64,
// 1.70x at 32 x 32, 1.16x on 16 x 16 x 16; the parity launches before, 1.11x, 3.25x, 1.43x;
// row-major order by each component's |dT| rank, 1.48x, 1.94x, 1.66x.)
template <int NDIM>
__host__ __device__ __forceinline__ void tile_offset_of(const OffsetTiles& ot, int index, int* dT) {
#pragma unroll
  for (int a = NDIM - 1; a >= 0; --a) {
    const int cnt = 2 * ot.reach[a] + 1;
    dT[a] = index % cnt - ot.reach[a];
    index /= cnt;
  }
}
template <int NDIM>
__host__ __device__ __forceinline__ int tile_offset_index(const OffsetTiles& ot, const int* dT) {
  int index = 0;
#pragma unroll
  for (int a = 0; a < NDIM; ++a) index = index * (2 * ot.reach[a] + 1) + dT[a] + ot.reach[a];
  return index;
}
template <int NDIM>
__host__ __device__ __forceinline__ int tile_offset_l1(const int* dT) {
  int l1 = 0;
#pragma unroll
  for (int a = 0; a < NDIM; ++a) l1 += dT[a] < 0 ? -dT[a] : dT[a];
  return l1;
}

// The table of that order for NDIM > 1: table[r], the number of the tile offset of rank r (a
// counting sort by sum |dT_a|, a thread per sum; one block, before the offset kernel). 1-D needs
// none: rank r is dT = 0, -1, 1, -2, 2, ... (rank_to_dT1).
template <int NDIM>
__global__ void fast_offsets_order_kernel(OffsetTiles ot, int* __restrict__ table) {
  int sums = 1;
  for (int a = 0; a < NDIM; ++a) sums += ot.reach[a];
  for (int l1 = threadIdx.x; l1 < sums; l1 += blockDim.x) {
    int r = 0;  // the tile offsets of a smaller sum, then of this one before each
    for (int i = 0; i < ot.count; ++i) {
      int dT[NDIM];
      tile_offset_of<NDIM>(ot, i, dT);
      r += tile_offset_l1<NDIM>(dT) < l1;
    }
    for (int i = 0; i < ot.count; ++i) {
      int dT[NDIM];
      tile_offset_of<NDIM>(ot, i, dT);
      if (tile_offset_l1<NDIM>(dT) == l1) table[r++] = i;
    }
  }
}
__host__ __device__ __forceinline__ int rank_to_dT1(int r) {
  return (r + 1) / 2 * (r % 2 != 0 ? -1 : 1);
}

// The m-th (0 <= m < 3^NDIM) tile offset within one of dT on every axis, whose box overlaps dT's
// (boxes 2 tile - 1 wide, a tile apart): its number where it is in range and comes before dT in
// the order (its adds come first), else -1.
template <int NDIM>
__host__ __device__ __forceinline__ int earlier_neighbour(const OffsetTiles& ot, const int* dT, int m) {
  int d[NDIM];
  bool in = true;
#pragma unroll
  for (int a = 0; a < NDIM; ++a) {
    d[a] = dT[a] + m % 3 - 1;
    m /= 3;
    in = in && d[a] >= -ot.reach[a] && d[a] <= ot.reach[a];
  }
  if (!in) return -1;
  const int l1 = tile_offset_l1<NDIM>(dT), l1n = tile_offset_l1<NDIM>(d);
  const int index = tile_offset_index<NDIM>(ot, d);
  return l1n < l1 || (l1n == l1 && index < tile_offset_index<NDIM>(ot, dT)) ? index : -1;
}

// Waits until the items taken before this one whose boxes overlap its own (earlier_neighbour,
// same head and column block) have added theirs (done: a flag per item, numbered (tile offset
// number x Z + z) x H + h): the adds into each offset row of d rel and d bias then come in item
// order, whatever the blocks' timing. (One thread polls; volatile loads come from L2, never a
// stale L1 line. Deadlock-free: tickets are taken as blocks start, so every item waited on is
// held by a block that started earlier.)
template <int NDIM>
__device__ __forceinline__ void await_earlier_neighbours(const int* done, const OffsetTiles& ot,
                                                         const int* dT, int z, int Z, int h, int H) {
  constexpr int kNeighbours = NDIM == 1 ? 3 : NDIM == 2 ? 9 : 27;
  for (int m = 0; m < kNeighbours; ++m) {
    const int k = earlier_neighbour<NDIM>(ot, dT, m);
    if (k < 0) continue;
    unsigned spins = 0;
    while (*reinterpret_cast<const volatile int*>(done + (k * Z + z) * H + h) == 0)
      if (++spins == 1u << 31) __trap();  // (a lost flag: an error after ~10-20 minutes, not a hang)
  }
  __threadfence();  // (the acquire side: the earlier items' adds before this block's loads)
}

// Whether the fast offset kernel's instance of a packed call takes a span (each sample's own
// tables, d bias and d sigma per sample) on NDIM axes in a shape with d rel's accumulators in
// registers (AR) and q_pos's rows in chunks (QCH): where the forward's does (packed_span_fits:
// the float32 and 16-bit D = 128 instances with this code spilled 4 to 32 bytes on sm_80), but not
// 16-bit D = 64 on 3-D grids in the 99 KiB class's shape (AR and QCH: 4 bytes on sm_80 and
// sm_90); the plan gives such calls' d rel, d bias, d sigma the general kernels.
template <typename T, int D>
__host__ __device__ constexpr bool packed_span_offsets_fit(int ndim, bool acc_regs, bool qpos_chunks) {
  return packed_span_fits<T, D>() && !(D == 64 && ndim == 3 && acc_regs && qpos_chunks);
}

// One block per work item, taken by ticket (t.offset_order[0]) as blocks start, in the order
// above: d rel's DA columns of one tile offset dT of one head (the d bias and d sigma sums: column
// block 0); its done flag set when its adds are in memory. PACKED: a packed call (B = 1): the tile
// offsets of the max grid, whose boxes' rows every sample shares, and the pairs of every sample in
// sample order (each a pair of its sample's grid, as the backward has them); with a span (own) the
// add / mul entries are the sample's own (sample_tables), each warp's copied as a sample's pairs
// begin, and d sigma's partial adds each sample's, normalised by its grid, in sample order.
template <typename T, int D, int NDIM, int DA, int DC, bool AR = false, bool QCH = false, int XP = 1,
          bool PACKED = false>
__global__ void __launch_bounds__(kThreads, 1)
    fast_offsets_kernel(RelposParams p, RelposTensors<T> t, OffsetTiles ot) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  __trap();  // as the forward: sm_80 instructions, never launched below it
#else
  using L = OffLayout<T, D, NDIM, DA, DC, AR, QCH, XP>;
  static_assert(!AR || (L::kAccInInputs && L::kAccRegs <= L::kMaxAccRegs),
                "AR: the accumulators' registers and end region");
  using F = warp::Mma<T>;  // m16n8k16 (bf16, f16) or TF32 m16n8k8 (float)
  constexpr int LD = L::kLd, QLD = L::kQLd, KK = F::kK, kNC = L::kChunksD;
  // float: the logits' k-steps two at a time (all of them unrolled load fragments so far ahead
  // that 255 registers spill at D = 64; two: 244 registers, no spill)
  constexpr int kKUnroll = sizeof(T) == 4 ? (DC / KK < 2 ? DC / KK : 2) : DC / KK;
  constexpr KeyBlockParts<NDIM> kParts{};
  constexpr ChunkGroups<NDIM> kGroups{};
  constexpr float kLog2e = 1.4426950408889634f;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* smem = reinterpret_cast<T*>(smem_raw);
  float* fs = reinterpret_cast<float*>(smem_raw + L::kTBytes);
  int* ticket = reinterpret_cast<int*>(fs + L::kTicket);

  const int w = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int H = static_cast<int>(p.H), N = static_cast<int>(p.N), U = static_cast<int>(p.U);
  const int Z = t.rel != nullptr ? D / DA : 1;
  if (threadIdx.x == 0) *ticket = atomicAdd(t.offset_order, 1);
  __syncthreads();
  const int item = *ticket, h = item % H, zc = item / H % Z, rank = item / (H * Z);
  int* const done = t.offset_order + 1;  // then (NDIM > 1) the order's table
  // the grid of the tile offsets and offset rows (gm; PACKED: the max grid) and that of the pairs
  // (g; PACKED: the sample of the pair decode last took)
  FastGrid<NDIM> gm(p);
  if constexpr (PACKED && NDIM == 1) gm.n[0] = static_cast<int>(p.g.n[0]);
  const int (&n)[NDIM] = gm.n;
  FastGrid<NDIM> g = gm;
  // this item's tile offset, its number among the head's (row-major over dT + reach: its d sigma
  // partial), the query tiles it pairs
  int dT[NDIM], icnt[NDIM], ilo[NDIM], tiles = 1;
  if constexpr (NDIM == 1)
    dT[0] = rank_to_dT1(rank);
  else
    tile_offset_of<NDIM>(ot, done[static_cast<int64_t>(ot.count) * Z * H + rank], dT);
  const int dT_index = tile_offset_index<NDIM>(ot, dT);
#pragma unroll
  for (int a = 0; a < NDIM; ++a) {
    icnt[a] = ot.nt[a] - abs(dT[a]);
    ilo[a] = max(0, -dT[a]);
    tiles *= icnt[a];
  }
  // pairs (b, I), b-major; PACKED: pair j is tile I (j's low 32 bits, of those of sample s whose key
  // block lies in s) of sample s = j >> 32 (b: s)
  const int64_t total = PACKED ? p.packed_samples << 32 : static_cast<int64_t>(p.B) * tiles;
  KeyRanges<NDIM, PACKED> kr(p, t.sigma, g, h);
  const auto key_range = [&](int a, int c) { return kr(p, g, a, c); };
  // PACKED: g, kr, icnt and tiles for sample s (its pairs of dT; none where its values are bad: the
  // backward's kernels report them), unless they are already s's (cur)
  int cur = -1;
  const auto set_sample = [&](int s) {
    if constexpr (PACKED) {
      if (s == cur) return;
      cur = s;
      const bool valid = cuda_packed::packed_sample_grid<NDIM>(p, t.packed_offsets, t.packed_shapes, s, g.n);
      tiles = valid ? 1 : 0;
#pragma unroll
      for (int a = 0; a < NDIM; ++a) {
        const int e = extent<NDIM>(Box::kTile, a);
        icnt[a] = max(0, (g.n[a] + e - 1) / e - abs(dT[a]));
        tiles *= icnt[a];
      }
#pragma unroll
      for (int a = NDIM - 1, st = 1; a >= 0; --a) g.gs[a] = st, st *= g.n[a];
      kr = KeyRanges<NDIM, PACKED>(p, t.sigma, g, h);
    }
  };
  // the first row of batch element (PACKED: sample) b of the head
  const auto rows_of = [&](int b) -> int64_t {
    return PACKED ? h * p.tok_stride + t.packed_offsets[b] : (static_cast<int64_t>(b) * p.H + h) * N;
  };
  // pair j: its batch element (PACKED: sample, g its grid), query tile origin and key block origin
  const auto decode = [&](int64_t j, int& b, int* qo, int* kb) {
    int rest;
    if constexpr (PACKED) {
      b = static_cast<int>(j >> 32);
      rest = static_cast<int>(j & 0xffffffff);
      set_sample(b);
    } else {
      b = static_cast<int>(j / tiles);
      rest = static_cast<int>(j % tiles);
    }
#pragma unroll
    for (int a = NDIM - 1; a >= 0; --a) {
      const int e = extent<NDIM>(Box::kTile, a);
      const int cnt = PACKED ? max(icnt[a], 1) : icnt[a];  // (a sample without pairs: none decoded)
      qo[a] = (ilo[a] + rest % cnt) * e;
      kb[a] = qo[a] + dT[a] * e;
      rest /= cnt;
    }
  };
  // the first pair from j on whose key block meets its tile's key ranges (and causal limit)
  const auto next_pair = [&](int64_t j) {
    for (; j < total; ++j) {
      int b, qo[NDIM], kb[NDIM];
      decode(j, b, qo, kb);
      if constexpr (PACKED) {
        if ((j & 0xffffffff) >= tiles) {  // past sample b's pairs: the next sample's first
          j = ((static_cast<int64_t>(b) + 1) << 32) - 1;
          continue;
        }
      }
      bool meets = true;
      int first_key = 0, last_query = 0;
#pragma unroll
      for (int a = 0; a < NDIM; ++a) {
        const int e = extent<NDIM>(Box::kTile, a), last = min(qo[a] + e, g.n[a]) - 1;
        meets = meets && kb[a] <= key_range(a, last).y && kb[a] + e - 1 >= key_range(a, qo[a]).x;
        first_key += kb[a] * g.gs[a];
        last_query += last * g.gs[a];
      }
      if (meets && (!p.causal || first_key <= last_query)) break;
    }
    return j;
  };
  int64_t j = next_pair(0);
  if (j >= total) {  // no pair (uniform; nothing copied yet): this box adds nothing
    if (threadIdx.x == 0) atomicExch(done + (dT_index * Z + zc) * H + h, 1);
    return;
  }

  // the head's offset tables, the warp's buffers and maps; rel null where the call has no
  // q_pos (tables only: d bias and d sigma, no X and no d rel)
  const T* rel = t.rel ? t.rel + static_cast<int64_t>(h) * U * D : nullptr;
  const bool pos = rel != nullptr;
  // (own: the head's sample_tables, sample s's rows from slot packed_offsets[s] << table_shift;
  // packed_span_offsets_fit)
  constexpr bool kOwn = PACKED && packed_span_offsets_fit<T, D>(NDIM, AR, QCH);
  const bool own = kOwn && p.has_sigma;
  const int64_t table_len = own ? static_cast<int64_t>(N) << table_shift(p) : U;
  const float* add = t.offset_add ? t.offset_add + h * table_len : nullptr;
  const float* mul = t.offset_mul ? t.offset_mul + h * table_len : nullptr;
  const bool has_add = add != nullptr, has_mul = mul != nullptr;
  const int dcol = zc * DA;  // this block's columns of d rel
  // the sums per offset (the block of columns 0): of dA (d bias, times mul; d quad with span
  // add) and of dA times the logit (d quad with span multiply)
  const bool first = zc == 0;
  const bool da_sums = first && (p.has_bias || (p.has_sigma && !has_mul));
  const bool quad_sums = first && p.has_sigma && has_mul, sums = da_sums || quad_sums;
  float* pbuf = fs + w * L::kPbuf;
  T* X = reinterpret_cast<T*>(pbuf);  // the warp's rows of X (after its positional products)
  int* woff = reinterpret_cast<int*>(smem_raw + L::kIntsAt) + w * L::kWarpCols;
  int* wrow = woff + kWarps * L::kWarpCols;
  unsigned* wmask = reinterpret_cast<unsigned*>(smem_raw + L::kIntsAt) + 2 * kWarps * L::kWarpCols;
  int2* ranges = reinterpret_cast<int2*>(smem_raw + L::kRangesAt) + w * 16 * NDIM;
  float* rows = fs + L::kRowsF;  // the pair's lse and rowd
  // d rel's accumulators (AR: filled from the registers at the end, over the spent inputs)
  float* acc = AR ? reinterpret_cast<float*>(smem_raw) : fs + L::kAcc;
  const float scale = static_cast<float>(p.scale);
  fill_warp_columns<NDIM, L>(w, lane, gm.rs, woff, wrow);
  if (own)  // (woff holds bacc below)
    for (int c = lane; c < L::kWarpCols; c += 32) reinterpret_cast<float*>(woff)[c] = 0.f;
  if constexpr (!AR)
    for (int i = threadIdx.x; i < L::kRows * L::kALd; i += kThreads) acc[i] = 0.f;
  __syncwarp();

  // the tile offset box's first offset row (its rel rows: once, or per pair and chunk)
  int u0 = 0;
#pragma unroll
  for (int a = 0; a < NDIM; ++a) {
    const int e = extent<NDIM>(Box::kTile, a);
    u0 += (dT[a] * e - (e - 1) + n[a] - 1) * gm.rs[a];
  }
  // columns [c DC, (c + 1) DC) of the pair's Q, dO, K, V rows (one stage) and, where the rows
  // come in chunks, of the tile offset box's rel rows (QCH: and of q_pos's, with the last chunk
  // its DA columns of d rel's block)
  const auto load_chunk = [&](int c, int b, const int* qo, const int* kb) {
    const int64_t bh_rows = rows_of(b) * D, head = bh_rows + c * DC;
    const auto tok = [&](unsigned r) { return g.query_token(qo, static_cast<int>(r)); };
    if (QCH && pos) {
      load_rows_async<T, DC, LD, kBlockM, D>(smem + L::qpos_at(0), t.qpos + head, tok);
      if (c == kNC - 1)
        load_rows_async<T, DA, L::kQaLd, kBlockM, D>(smem + L::kQA, t.qpos + bh_rows + dcol, tok);
    }
    load_rows_async<T, DC, LD, kBlockM, D>(smem + L::kQ, t.q + head, tok);
    load_rows_async<T, DC, LD, kBlockM, D>(smem + L::kDO, t.gout + head, tok);
    load_box_async<T, DC, LD, NDIM, Box::kKey, true, D>(
        smem + L::kK, t.k + head, smem + L::kV, t.v + head,
        [&g, kb](const int* x) { return g.key_token(kb, x); });
    if (kNC > 1 && pos)
      load_offset_tile<T, DC, NDIM, L, D>(smem + L::kR, rel + c * DC, u0, U, gm.rs, nullptr, nullptr,
                                          SameRows{}, nullptr, nullptr, woff, lane);
  };
  // (own) the warp's add / mul entries of the tile offset box in sample s's tables (g: s's grid;
  // their rows delta + n - 1 row-major, zero-filled outside them; the caller commits)
  const auto load_own_tables = [&](int s) {
    if constexpr (kOwn) {
      int ts[NDIM], u = 0, rows = 1;
#pragma unroll
      for (int a = NDIM - 1; a >= 0; --a) {
        const int e = extent<NDIM>(Box::kTile, a);
        ts[a] = rows;
        u += (dT[a] * e - (e - 1) + g.n[a] - 1) * rows;
        rows *= 2 * g.n[a] - 1;
      }
      const int64_t base = static_cast<int64_t>(t.packed_offsets[s]) << table_shift(p);
      float* add_w = fs + L::table_at(0, w, 0);
      float* mul_w = fs + L::table_at(0, w, 1);
      for (int c = lane; c < L::kWarpCols; c += 32) {
        const int cc = c < L::kWarpOffsets ? c : 0;
        int o = u;
        for_axes<NDIM>([&](auto ax) {
          constexpr int a = decltype(ax)::value;
          o += warp_to_tile_offset<NDIM>(w, coord_of<NDIM, Box::kWarpOffsets, a>(cc), a) * ts[a];
        });
        const bool in = o >= 0 && o < rows;
        if (has_add) warp::cp_async_4(add_w + c, in ? add + base + o : add, in);
        if (has_mul) warp::cp_async_4(mul_w + c, in ? mul + base + o : mul, in);
      }
    }
  };
  // this lane's columns of the warp's offset box (lane + 32 m): their sums of the d bias term and of
  // d quad's (column_sums); own: d sigma's sums per axis of the samples done (flush_sample)
  float bsum[L::kCols] = {}, qsum[L::kCols] = {}, dsq[kOwn ? NDIM : 1] = {};
  // (own, span multiply with a bias) d bias's sums of the samples done, times their mul: per warp a
  // float per column of its offset box, over woff (which own calls never read: their entries come
  // from load_own_tables)
  float* bacc = reinterpret_cast<float*>(woff);
  // (own) as sample s's pairs end (but the last sample's: the end's sums take those), on its grid of
  // extents ns: qsum, its d quad sums per column, into d sigma's sums per axis, dsq[a] += qsum x_a^2,
  // x_a = delta_a / m_a (normalised_offset: m_a = max(ns_a - 1, 1)), so each sample's d sigma has its
  // own grid's normalisation with no sums per sample and offset to keep; with span multiply and a
  // bias, bsum times its mul (the warp's entries of s, still in place) into bacc; both zeroed
  const auto flush_sample = [&](int s) {
    if constexpr (kOwn) {
      int ns[NDIM];
      cuda_packed::packed_sample_grid<NDIM>(p, t.packed_offsets, t.packed_shapes, s, ns);
      float im2[NDIM];  // 1 / m_a^2
#pragma unroll
      for (int a = 0; a < NDIM; ++a) {
        const float m = static_cast<float>(ns[a] > 1 ? ns[a] - 1 : 1);
        im2[a] = 1.f / (m * m);
      }
      const float* mul_w = fs + L::table_at(0, w, 1);
#pragma unroll
      for (int m = 0; m < L::kCols; ++m) {
        const int c = lane + 32 * m;
        if (c < L::kWarpOffsets) {
          for_axes<NDIM>([&](auto ax) {
            constexpr int a = decltype(ax)::value;
            const int e = extent<NDIM>(Box::kTile, a);
            const int d = dT[a] * e - (e - 1) +
                          warp_to_tile_offset<NDIM>(w, coord_of<NDIM, Box::kWarpOffsets, a>(c), a);
            dsq[a] += qsum[m] * static_cast<float>(d * d) * im2[a];
          });
          if (has_mul && p.has_bias) bacc[c] += mul_w[c] * bsum[m];
        }
        qsum[m] = 0.f;
        if (has_mul) bsum[m] = 0.f;
      }
    }
  };
  // the pair's first chunk, its q_pos rows (stage st), lse and rowd (one stage); own: its sample's
  // add / mul entries where the warps hold another's (tb; asked for while the pair before it ends:
  // that pair's last reads of them, its logits and column sums, are done by then)
  int tb = -1;
  const auto load_pair = [&](int st, int b, const int* qo, const int* kb) {
    load_chunk(0, b, qo, kb);
    if (own && b != tb) {
      if (tb >= 0 && first) flush_sample(tb);
      load_own_tables(b);
      tb = b;
    }
    const int64_t row0 = rows_of(b), head = row0 * D;
    const auto tok = [&](unsigned r) { return g.query_token(qo, static_cast<int>(r)); };
    if (!QCH && pos) load_rows_async<T, D, QLD, kBlockM>(smem + L::qpos_at(st), t.qpos + head, tok);
    if (threadIdx.x < kBlockM) {
      const int r = tok(threadIdx.x);
      const float* lse_g = t.lse + row0;
      const float* rowd_g = t.rowd + row0;
      warp::cp_async_4(rows + threadIdx.x, r >= 0 ? lse_g + r : lse_g, r >= 0);
      warp::cp_async_4(rows + kBlockM + threadIdx.x, r >= 0 ? rowd_g + r : rowd_g, r >= 0);
    }
  };
  int b, qo[NDIM], kb[NDIM];
  decode(j, b, qo, kb);
  load_pair(0, b, qo, kb);
  // the tile offset box (the same for every pair): the warp's add / mul entries and (whole
  // rows) its rel rows
  load_offset_tile<T, DC, NDIM, L, D>(smem + L::kR, kNC == 1 ? rel : nullptr, u0, U, gm.rs,
                                      own ? nullptr : add, own ? nullptr : mul, SameRows{},
                                      fs + L::table_at(0, w, 0), fs + L::table_at(0, w, 1), woff, lane);
  warp::cp_async_commit();

  // this thread's rows (accumulator rows lane / 4 and + 8 of the warp's 16): where its pbuf
  // reads start (pcol) and its X writes (xcol: the pair's tile offset box entry; xe: its column,
  // which tells the part of X where XP > 1)
  int pcol[2], xcol[2], xe[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int il = lane / 4 + 8 * r;
    pcol[r] = skew_start<NDIM, L>(lane, il);
    int x = 0;
    for_axes<NDIM>([&](auto ax) {
      constexpr int a = decltype(ax)::value;
      const int q = warp_origin<NDIM>(w, a) + coord_of<NDIM, Box::kWarp, a>(il);
      x += (coord_of<NDIM, Box::kKey, a>(2 * (lane % 4)) - q + extent<NDIM>(Box::kTile, a) - 1) *
           stride<NDIM>(Box::kTileOffsets, a);
    });
    xe[r] = x;
    xcol[r] = il * L::kXLd + x;
  }
  // this lane's columns of the warp's offset box (lane + 32 m): the rows that have a pair there
  // (bit r: wmask, in shared memory where registers are short; the same for every warp, written
  // by warp 0, read after the pair loop's first barrier) (their sums: bsum, qsum above)
#pragma unroll 1
  for (int m = 0; w == 0 && m < L::kCols; ++m) {
    const int c = lane + 32 * m;
    unsigned mask = 0;
    for (int r = 0; c < L::kWarpOffsets && r < 16; ++r) {
      bool in = true;
      for_axes<NDIM>([&](auto ax) {
        constexpr int a = decltype(ax)::value;
        const int k = coord_of<NDIM, Box::kWarpOffsets, a>(c) + coord_of<NDIM, Box::kWarp, a>(r) -
                      (extent<NDIM>(Box::kWarp, a) - 1);
        in = in && k >= 0 && k < extent<NDIM>(Box::kKey, a);
      });
      mask |= in ? 1u << r : 0u;
    }
    if (c < L::kWarpCols) wmask[c] = mask;
  }
  // the sums over the warp's rows of what each pair wrote at its pbuf position
  const auto column_sums = [&](float (&sum)[L::kCols]) {
    __syncwarp();
#pragma unroll
    for (int m = 0; m < L::kCols; ++m) {
      const int c = lane + 32 * m;
      if (c >= L::kWarpOffsets) continue;
      const unsigned mask = wmask[c];
      float x = 0.f;
#pragma unroll
      for (int r = 0; r < 16; ++r)
        if ((mask >> r) & 1) x += pbuf[r * L::kPLd + c];
      sum[m] += x;
    }
    __syncwarp();
  };

  // chunk c's d rel += X q_pos (a4: its accumulators; Qa: the pair's q_pos rows, d rel's block's
  // columns from column qa_col; c0: the first chunk of X's part); and a4 loaded from or stored to
  // a chunk's rows arow of the shared accumulators
  const auto chunk_product = [&](int c, float (&a4)[DA / 8][4], const T* Qa, int qa_col, int c0) {
#pragma unroll
    for (int q = 0; q < kWarps; ++q) {
      if (!kGroups.reaches(c, q)) continue;
      const T* Xq = reinterpret_cast<const T*>(fs + q * L::kPbuf);
#pragma unroll
      for (int kq = 0; kq < 16 / KK; ++kq) {  // the group's 16 queries, kK at a time
        uint32_t xa[4];
        F::load_a_trans(xa, Xq + KK * kq * L::kXLd + 16 * (c - c0), L::kXLd, lane);
#pragma unroll
        for (int nd = 0; nd < DA / 8; nd += 2) {
          uint32_t bq[4];
          F::load_b_kmajor2(bq, Qa + (16 * q + KK * kq) * L::kQaLd + qa_col + 8 * nd, L::kQaLd, lane);
          F::mma(a4[nd], xa, {bq[0], bq[1]});
          F::mma(a4[nd + 1], xa, {bq[2], bq[3]});
        }
      }
    }
  };
  const auto load_or_store_rows = [&](float* arow, float (&a4)[DA / 8][4], bool store) {
#pragma unroll
    for (int nd = 0; nd < DA / 8; ++nd)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        float2* at = reinterpret_cast<float2*>(arow + (lane / 4 + 8 * r) * L::kALd + 8 * nd + 2 * (lane % 4));
        if (store)
          *at = make_float2(a4[nd][2 * r], a4[nd][2 * r + 1]);
        else
          a4[nd][2 * r] = at->x, a4[nd][2 * r + 1] = at->y;
      }
  };
  float racc[AR ? L::kWarpChunks : 1][DA / 8][4] = {};  // (AR: d rel's accumulators of the warp's chunks)

  for (int st = 0; j < total; st ^= 1) {
    warp::cp_async_wait<0>();
    __syncthreads();  // pair j visible to every warp, every warp done with pair j - 1 (X, q_pos)
    int row_tok[2];
    float lse2[2], rowd[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int i = 16 * w + lane / 4 + 8 * r;
      row_tok[r] = g.query_token(qo, i);
      lse2[r] = row_tok[r] >= 0 ? rows[i] * kLog2e : -INFINITY;
      rowd[r] = rows[kBlockM + i];
    }
    if (lane < 16) {
      for_axes<NDIM>([&](auto ax) {
        constexpr int a = decltype(ax)::value;
        ranges[lane * NDIM + a] = key_range(a, g.template query_coord<a>(qo, 16 * w + lane));
      });
    }
    __syncwarp();
    bool active = true, full = true;
#pragma unroll
    for (int a = 0; a < NDIM; ++a) {
      const int2 fr = ranges[a], lr = ranges[15 * NDIM + a];
      const int kend = kb[a] + extent<NDIM>(Box::kKey, a) - 1;
      active = active && kb[a] <= lr.y && kend >= fr.x;
      full = full && kb[a] >= lr.x && kend <= fr.y;
    }
    const T* Qp = smem + L::qpos_at(st);
    float s[kBlockN / 8][4] = {};   // S, then dA
    float dp[kBlockN / 8][4] = {};  // dP, then dS'
    // the products over D, a chunk of columns at a time
    for_chunks<kNC>(
        [&](auto chunk) {
          constexpr int c = decltype(chunk)::value;
          if (!active) return;
          uint32_t qpf[DC / KK][4];
          if (pos) {
#pragma unroll
            for (int kk = 0; kk < DC / KK; ++kk) {
              if constexpr (QCH)  // (the chunk's columns of q_pos)
                F::load_a(qpf[kk], Qp + 16 * w * LD + KK * kk, LD, lane);
              else
                F::load_a(qpf[kk], Qp + 16 * w * QLD + c * DC + KK * kk, QLD, lane);
            }
          }
          warp_positional_products<T, DC, L, false, c, kNC>(
              qpf, smem + L::kR, pos, wrow, fs + L::table_at(0, w, 0), fs + L::table_at(0, w, 1), pbuf, lane,
              scale, has_add, has_mul);
          warp_qk_and_dov<T, DC, LD, kKUnroll>(s, dp, smem + L::kQ, smem + L::kDO, smem + L::kK, smem + L::kV,
                                               w, lane);
        },
        [&](int next) { load_chunk(next, b, qo, kb); });
    if (active) {
      __syncwarp();  // (the positional products in pbuf)
      warp_finish_logits<true, NDIM, L>(s, lane, pbuf, pcol, ranges, qo, kb, g, row_tok, scale, has_mul,
                                        p.causal, full);
      // (each pair's pbuf position is its own: the logits read it, the sums write it)
      softmax_backward<NDIM, L, true, true>(s, dp, pbuf, pcol, lane, lse2, rowd, scale, has_mul,
                                            [&](int nb, int i, float da, float x) {
                                              if (quad_sums)
                                                pbuf[pcol[i >> 1] + kParts.col[nb] + (i & 1)] = da * x;
                                            });
      if (quad_sums) column_sums(qsum);  // sum dA x (x the base-2 logit)
      if (da_sums) {                     // sum dA (s holds dA: KEEP_DA)
#pragma unroll
        for (int nb = 0; nb < kBlockN / 8; ++nb)
#pragma unroll
          for (int i = 0; i < 4; ++i) pbuf[pcol[i >> 1] + kParts.col[nb] + (i & 1)] = s[nb][i];
        column_sums(bsum);
        if (own && !has_mul) column_sums(qsum);  // (span add: d quad's, the sample's alone)
      }
    }
    // the warp's rows of X, a part at a time (XP > 1: the part's columns of the tile offset box):
    // zeros, then dS' at each pair's entry of the tile offset box; then d rel += X q_pos over the
    // warp's chunks of the part
    const T* Qa = QCH ? smem + L::kQA : Qp;
    const int qa_col = QCH ? 0 : dcol;
    int64_t jn = total;
    int bn = 0, qn[NDIM], kn[NDIM];
    for_axes<XP>([&](auto part) {
      constexpr int c0 = decltype(part)::value * L::kPartChunks, e0 = 16 * c0;
      constexpr int c1 = c0 + L::kPartChunks < L::kChunks ? c0 + L::kPartChunks : L::kChunks;
      if constexpr (c0 > 0) __syncthreads();  // every warp done with X's part before
      __syncwarp();
      for (int i = lane; pos && i < 16 * L::kXLd * static_cast<int>(sizeof(T)) / 16; i += 32)
        reinterpret_cast<uint4*>(X)[i] = make_uint4(0u, 0u, 0u, 0u);
      __syncwarp();
      if (active && pos) {
#pragma unroll
        for (int nb = 0; nb < kBlockN / 8; ++nb)
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const int e = xe[i >> 1] + kGroups.col[nb] + (i & 1);
            if (XP == 1 || (e >= e0 && e < 16 * c1))
              X[xcol[i >> 1] + kGroups.col[nb] + (i & 1) - e0] = posattn::cuda::from_acc<T>(dp[nb][i]);
          }
      }
      __syncthreads();  // X's part complete (the first: every warp done with Q, dO, K, V)
      if constexpr (c0 == 0) {
        // the next pair (found and decoded here: its coordinates take no registers during the math)
        jn = next_pair(j + 1);
        if (jn < total) {
          decode(jn, bn, qn, kn);
          load_pair(st ^ 1, bn, qn, kn);
          warp::cp_async_commit();
        }
      }
      if constexpr (AR) {
#pragma unroll
        for (int m = 0; m < L::kWarpChunks; ++m) {
          const int c = w + kWarps * m;
          if (pos && (c0 == 0 || c >= c0) && c < c1) chunk_product(c, racc[m], Qa, qa_col, c0);
        }
      } else {
#pragma unroll 1
        for (int c = w; pos && c < c1; c += kWarps) {
          if constexpr (c0 > 0)
            if (c < c0) continue;
          float* arow = acc + 16 * c * L::kALd;
          float a4[DA / 8][4];
          load_or_store_rows(arow, a4, false);
          chunk_product(c, a4, Qa, qa_col, c0);
          load_or_store_rows(arow, a4, true);
        }
      }
    });
    j = jn, b = bn;
#pragma unroll
    for (int a = 0; a < NDIM; ++a) qo[a] = qn[a], kb[a] = kn[a];
  }
  __syncthreads();  // the accumulators complete (AR: every warp done with the inputs)
  if constexpr (AR) {
#pragma unroll
    for (int m = 0; m < L::kWarpChunks; ++m)
      if (pos && w + kWarps * m < L::kChunks)
        load_or_store_rows(acc + 16 * (w + kWarps * m) * L::kALd, racc[m], true);
    __syncthreads();
  }

  // entry e of the tile offset box: its row of rel, -1 where an offset is outside the grid's
  const auto entry_row = [&](int e, int* delta) {
    int u = 0;
    bool in = true;
#pragma unroll
    for (int a = 0; a < NDIM; ++a) {
      const int x = extent<NDIM>(Box::kTile, a);
      delta[a] = dT[a] * x - (x - 1) + coord<NDIM>(Box::kTileOffsets, e, a);
      in = in && delta[a] > -n[a] && delta[a] < n[a];
      u += (delta[a] + n[a] - 1) * gm.rs[a];
    }
    return in ? u : -1;
  };
  // the warps' sums per tile offset, in warp order (sum dA times the column's mul: d bias's), and
  // this item's d sigma partial (its own slot): before the wait, which only the adds need
  float* tsum = fs + L::kSums;  // (over the spent pbufs, after d sigma's reduction)
  if (sums) {
    const float* mul_w = fs + L::table_at(0, w, 1);
    for (int i = threadIdx.x; i < 2 * L::kRows; i += kThreads) tsum[i] = 0.f;
    __syncthreads();
    for (int v = 0; v < kWarps; ++v) {
      if (w == v) {
#pragma unroll
        for (int m = 0; m < L::kCols; ++m) {
          const int c = lane + 32 * m;
          if (c < L::kWarpOffsets) {
            float db = has_mul ? mul_w[c] * bsum[m] : bsum[m];
            if constexpr (kOwn)
              if (own && has_mul) db = bacc[c] + db;  // (the samples' before the last)
            tsum[wrow[c]] += db;
            tsum[L::kRows + wrow[c]] += qsum[m];
          }
        }
      }
      __syncthreads();
    }
    if (p.has_sigma && p.g.ndim == NDIM) {
      // d sigma_a = sum_u d quad[u] (-x_a^2 / sigma_a^3) with d quad = -sum dA (span add) or
      // -sum dA logit (span multiply; the sums in base 2); each thread's entries, then in order
      // (own: the last sample's sums, on its grid ns (with span add qsum's: bsum's are every
      // sample's), and dsq, the samples' before it)
      double* red = reinterpret_cast<double*>(fs);  // (pbuf is spent)
      constexpr double kLn2 = 0.6931471805599453;
      int ns[NDIM];
      if constexpr (kOwn)
        if (own) cuda_packed::packed_sample_grid<NDIM>(p, t.packed_offsets, t.packed_shapes, tb, ns);
#pragma unroll
      for (int a = 0; a < NDIM; ++a) {
        double part = 0.0;
        for (int e = threadIdx.x; e < L::kTileOffsets; e += kThreads) {
          int delta[NDIM];
          if (entry_row(e, delta) < 0) continue;
          const double dquad = quad_sums ? -kLn2 * tsum[L::kRows + e]
                                         : -static_cast<double>(tsum[(kOwn && own ? L::kRows : 0) + e]);
          const double x = normalised_offset(delta[a], kOwn && own ? ns[a] : n[a]);
          part += dquad * x * x;
        }
        if constexpr (kOwn) part -= (quad_sums ? kLn2 : 1.0) * dsq[a];
        __syncthreads();
        red[threadIdx.x] = part;
        __syncthreads();
        if (threadIdx.x == 0 && n[a] > 1) {
          double sum = 0.0;
          for (int i = 0; i < kThreads; ++i) sum += red[i];
          const double is = 1.0 / t.sigma[h * p.G_in + p.g.axis[a]];
          t.dsig_part[(static_cast<int64_t>(h) * ot.count + dT_index) * p.G_in + p.g.axis[a]] =
              -sum * is * is * is;
        }
      }
    }
  }

  // the adds into d rel and d bias, in item order (await_earlier_neighbours) and through L2 (ld.cg,
  // st.cg: another block's adds are never read from a stale L1 line)
  if (threadIdx.x == 0) await_earlier_neighbours<NDIM>(done, ot, dT, zc, Z, h, H);
  __syncthreads();
  // (kBatch loads in flight per thread, then the adds: one load latency per batch, not per entry)
  constexpr int kBatch = 8;
  float* drel = pos ? t.drel_acc + static_cast<int64_t>(h) * U * D + dcol : nullptr;
  for (int i0 = threadIdx.x; pos && i0 < L::kTileOffsets * DA; i0 += kBatch * kThreads) {
    float v[kBatch];
    int64_t at[kBatch];
#pragma unroll
    for (int k = 0; k < kBatch; ++k) {
      const int i = i0 + k * kThreads;
      int delta[NDIM];
      const int u = i < L::kTileOffsets * DA ? entry_row(i / DA, delta) : -1;
      at[k] = u >= 0 ? static_cast<int64_t>(u) * D + i % DA : -1;
      v[k] = at[k] >= 0 ? __ldcg(drel + at[k]) : 0.f;
    }
#pragma unroll
    for (int k = 0; k < kBatch; ++k) {
      const int i = i0 + k * kThreads;
      if (at[k] >= 0) __stcg(drel + at[k], v[k] + acc[i / DA * L::kALd + i % DA]);
    }
  }
  if (sums && p.has_bias) {
    float* dbias = t.dbias_acc + static_cast<int64_t>(h) * U;
    for (int e = threadIdx.x; e < L::kTileOffsets; e += kThreads) {
      int delta[NDIM];
      const int u = entry_row(e, delta);
      if (u >= 0) __stcg(dbias + u, __ldcg(dbias + u) + tsum[e]);
    }
  }
  // the release side: every thread's adds before the barrier, then one cumulative fence and the
  // flag (cooperative groups' grid barrier does the same)
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    atomicExch(done + (dT_index * Z + zc) * H + h, 1);
  }
#endif
}

// The shape of the fast offset kernel's blocks: the columns of d rel a block takes (da) and of
// its inputs in shared memory at a time (dc); da = 0 where no shape fits the class's shared
// memory (the plan then gives the call the general one). The kernel's instance is the shape's:
// classes with one shape share it.
struct OffShape {
  int da, dc;
  bool acc_regs = false;     // (OffLayout's AR)
  bool qpos_chunks = false;  // (QCH)
  int x_parts = 1;           // (XP)
};
// NARROW: the float32 shapes of 8-column chunks (the last tier: 99 KiB on 3-D grids only).
template <typename T, int D, int NDIM, int DA, int DC, int SC, bool AR, bool QCH, int XP, bool NARROW>
constexpr bool offsets_fit() {
  constexpr int kMinChunk = NARROW && sizeof(T) == 4 ? 8 : 16;
  if constexpr (DA < 16 || DC < kMinChunk || D % DA != 0 || D % DC != 0 || (QCH && DC == D)) {
    return false;
  } else {
    using L = OffLayout<T, D, NDIM, DA, DC, AR, QCH, XP>;
    return L::kBytes <= smem_budget(SC) && (!AR || (L::kAccInInputs && L::kAccRegs <= L::kMaxAccRegs));
  }
}
// Whole rows first, with D columns of d rel, else D / 2 (as before chunks existed: 3-D grids
// at D = 64, 1-D at D = 128); else rows in chunks, the most columns of d rel first (the
// fewest blocks recomputing each pair), then the widest chunks (the fewest barriers):
// 16-bit D = 128 on 2-D grids (64, 64) and 3-D (32, 32); float32 D = 32 on 3-D (32, 16), D = 64
// (16, 16), D = 64 on 2-D (64, 16), D = 128 on 1-D (64, 32); float32 D = 128 on 2-3 only with
// q_pos in chunks too (offsets_shape: 32, 32) (class 0, sm_90's 227 KiB; the smaller classes:
// what fits their budget).
// (the index of the last tier's shape in offsets_shape_'s list: 16 columns of d rel, chunks of 8)
constexpr int kNarrowShape = 9;
template <typename T, int D, int NDIM, int SC, bool AR, bool QCH, int XP, int I = 0, int END = 8>
constexpr OffShape offsets_shape_() {
  constexpr int kShapes[10][2] = {{D, D},         {D / 2, D},     {D, D / 2},     {D, D / 4},
                                  {D / 2, D / 2}, {D / 2, D / 4}, {D / 4, D / 2}, {D / 4, D / 4},
                                  {D / 8, D / 8}, {16, 8}};
  if constexpr (I == END)
    return OffShape{0, D, AR, QCH, XP};
  else if constexpr (offsets_fit<T, D, NDIM, kShapes[I][0], kShapes[I][1], SC, AR, QCH, XP,
                                 (I == kNarrowShape)>())
    return OffShape{kShapes[I][0], kShapes[I][1], AR, QCH, XP};
  else
    return offsets_shape_<T, D, NDIM, SC, AR, QCH, XP, I + 1, END>();
}
// Where no shape with d rel's accumulators in shared memory fits, the same order with them in
// registers: in 99 KiB 16-bit D = 32 and 64 on 2-D grids, 16 columns of d rel a block, 16-bit
// D = 128 and float32 D = 32 on 1-D; float32 D = 64 on 2-D and D = 128 on 1-D in an A100's class;
// on 3-D grids (48 registers) float32 D = 64 and 128 in an A100's class.
// Where still none fits, both again with q_pos's rows in chunks (QCH), then with X in two parts
// too (XP); then all of that with D / 8 columns (D = 128: 16 of d rel a block, 8 blocks each
// recomputing the logits, still far faster than the general kernel); then (float32) 16 columns
// of d rel in chunks of 8: 99 KiB on 3-D grids, whose 16-bit types take (16, 16) there, with
// their accumulators in registers and q_pos in chunks.
template <typename T, int D, int NDIM, int SC, int I, int END>
constexpr OffShape offsets_shape_modes() {
  constexpr OffShape kTries[6] = {offsets_shape_<T, D, NDIM, SC, false, false, 1, I, END>(),
                                  offsets_shape_<T, D, NDIM, SC, true, false, 1, I, END>(),
                                  offsets_shape_<T, D, NDIM, SC, false, true, 1, I, END>(),
                                  offsets_shape_<T, D, NDIM, SC, true, true, 1, I, END>(),
                                  offsets_shape_<T, D, NDIM, SC, false, true, 2, I, END>(),
                                  offsets_shape_<T, D, NDIM, SC, true, true, 2, I, END>()};
  for (const OffShape& s : kTries)
    if (s.da != 0) return s;
  return OffShape{0, D};
}
template <typename T, int D, int NDIM, int SC = 0>
constexpr OffShape offsets_shape() {
  constexpr OffShape s = offsets_shape_modes<T, D, NDIM, SC, 0, 8>();
  constexpr OffShape s8 = offsets_shape_modes<T, D, NDIM, SC, 8, 9>();
  if constexpr (s.da != 0)
    return s;
  else if constexpr (s8.da != 0)
    return s8;
  else
    return offsets_shape_modes<T, D, NDIM, SC, kNarrowShape, kNarrowShape + 1>();
}
// The fast offset kernel's shape and shared memory on a grid of NDIM axes in class SC (the plan's
// check and report): bytes 0 where no shape fits.
struct OffLayoutInfo {
  OffShape shape{0, 0};
  size_t bytes = 0;
};
template <typename T, int D, int NDIM, int SC>
constexpr OffLayoutInfo fast_offsets_layout_() {
  constexpr OffShape s = offsets_shape<T, D, NDIM, SC>();
  if constexpr (s.da == 0)
    return OffLayoutInfo{s, 0};
  else
    return OffLayoutInfo{s, OffLayout<T, D, NDIM, s.da, s.dc, s.acc_regs, s.qpos_chunks, s.x_parts>::kBytes};
}
template <typename T, int D, int SC>
constexpr OffLayoutInfo fast_offsets_layout_sc(int ndim) {
  return ndim == 3   ? fast_offsets_layout_<T, D, 3, SC>()
         : ndim == 2 ? fast_offsets_layout_<T, D, 2, SC>()
                     : fast_offsets_layout_<T, D, 1, SC>();
}
// The same on a grid of `ndim` axes in class sc.
template <typename T, int D>
constexpr OffLayoutInfo fast_offsets_layout(int ndim, int sc) {
  return sc == 0   ? fast_offsets_layout_sc<T, D, 0>(ndim)
         : sc == 1 ? fast_offsets_layout_sc<T, D, 1>(ndim)
                   : fast_offsets_layout_sc<T, D, 2>(ndim);
}

// The fast offset kernel's work items (blocks) of a call in class sc: H x tile offsets x column
// blocks (D / offsets_shape's da with q_pos, else 1). t.offset_order holds fast_offset_order_ints:
// its ticket, a flag per item and (grids of 2-3 axes) the order's table, a tile offset number per
// rank.
template <typename T, int D>
int64_t fast_offset_items(const RelposParams& p, int sc) {
  const int da = fast_offsets_layout<T, D>(p.g.ndim == 3 ? 3 : p.g.ndim == 2 ? 2 : 1, sc).shape.da;
  return p.H * fast_offset_tiles(p).count * (p.has_pos && da != 0 ? D / da : 1);
}
template <typename T, int D>
int64_t fast_offset_order_ints(const RelposParams& p, int sc) {
  return 1 + fast_offset_items<T, D>(p, sc) + (p.g.ndim > 1 ? fast_offset_tiles(p).count : 0);
}

// d rel (t.drel), d bias (t.dbias, where the call has one) through the float32 accumulators
// t.drel_acc, t.dbias_acc, and d sigma's partials t.dsig_part ((H, offset_tiles.count, G_in),
// where it has sigma), for a call the fast kernels take (after the fast backward or the
// general one: it needs the inputs, lse and rowd), with the offset tables filled;
// with q_pos and rel null (a bias or span and no q_pos) d bias and d sigma only, one block per
// tile offset.
// In the shape DA, DC of class SC (offsets_shape; DA 0: none fits), which the caller has
// checked against the device's limit `optin` (fast_offsets_layout; and this: the layout within it).
template <typename T, int D, int NDIM, int SC, int DA, int DC, bool AR, bool QCH, int XP>
cudaError_t launch_fast_offsets_shape(const RelposParams& p, const RelposTensors<T>& t, size_t optin,
                                      cudaStream_t stream) {
  using L = OffLayout<T, D, NDIM, DA == 0 ? D : DA, DA == 0 ? D : DC, AR, DA != 0 && QCH, XP>;
  const bool packed = p.packed_samples > 0;  // (B = 1; with a span: packed_span_offsets_fit)
  if (packed && (p.B != 1 || t.packed_offsets == nullptr || t.packed_shapes == nullptr ||
                 (p.has_sigma && !packed_span_offsets_fit<T, D>(NDIM, AR, DA != 0 && QCH))))
    return cudaErrorInvalidValue;
  if (packed ? !kPackedInstances : !kSingleGridInstances) return cudaErrorNotSupported;
  int64_t boxes = 0;
  const cudaError_t bad = check_fast_call<D, true, NDIM>(p, t, &boxes);
  if (bad != cudaSuccess) return bad;
  const bool pos = t.rel != nullptr;  // (else tables only: d bias and d sigma)
  if (t.gout == nullptr || t.rowd == nullptr || t.lse == nullptr ||
      (pos && (t.drel == nullptr || t.drel_acc == nullptr)) ||
      (p.has_bias && (t.dbias == nullptr || t.dbias_acc == nullptr)) ||
      (p.has_sigma && t.dsig_part == nullptr) || reinterpret_cast<uintptr_t>(t.gout) % 16 != 0 ||
      (has_offset_add(p) && t.offset_add == nullptr) || (has_offset_mul(p) && t.offset_mul == nullptr) ||
      t.offset_order == nullptr)
    return cudaErrorInvalidValue;
  if (p.N == 0 || p.H == 0) return cudaSuccess;  // (nothing to add up)
  if constexpr (DA == 0) {
    return cudaErrorInvalidValue;  // (the plan never gives it such a call)
  } else {
    if (L::kBytes > optin) return cudaErrorInvalidValue;
    const OffsetTiles ot = offset_tiles<NDIM>(p);
    cudaError_t e = pos ? cudaMemsetAsync(t.drel_acc, 0, sizeof(float) * p.H * p.U * D, stream) : cudaSuccess;
    if (e == cudaSuccess && p.has_bias)
      e = cudaMemsetAsync(t.dbias_acc, 0, sizeof(float) * p.H * p.U, stream);
    if (e == cudaSuccess && p.has_sigma)
      e = cudaMemsetAsync(t.dsig_part, 0, sizeof(double) * p.H * ot.count * p.G_in, stream);
    // f(the call's kernel): only the instances of the build's kinds of call (kSingleGridInstances,
    // kPackedInstances)
    const auto with_kernel = [&](auto f) {
      if constexpr (kPackedInstances)
        if (packed) f(fast_offsets_kernel<T, D, NDIM, DA, DC, AR, QCH, XP, true>);
      if constexpr (kSingleGridInstances)
        if (!packed) f(fast_offsets_kernel<T, D, NDIM, DA, DC, AR, QCH, XP>);
    };
    if (e == cudaSuccess && L::kBytes > 48 * 1024)
      with_kernel([&](auto kernel) {
        e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 static_cast<int>(L::kBytes));
      });
    const int64_t items = fast_offset_items<T, D>(p, SC);
    if (fast_offset_order_ints<T, D>(p, SC) >= INT_MAX) return cudaErrorInvalidValue;
    if (e == cudaSuccess) e = cudaMemsetAsync(t.offset_order, 0, sizeof(int) * (1 + items), stream);
    if constexpr (NDIM > 1) {
      if (e == cudaSuccess && p.B > 0) {
        fast_offsets_order_kernel<NDIM><<<1, 256, 0, stream>>>(ot, t.offset_order + 1 + items);
        e = cudaGetLastError();
      }
    }
    if (e == cudaSuccess && p.B > 0) {
      with_kernel([&](auto kernel) {
        kernel<<<static_cast<unsigned>(items), kThreads, L::kBytes, stream>>>(p, t, ot);
      });
      e = cudaGetLastError();
    }
    if (e == cudaSuccess && pos) e = cuda::launch_round_to<T>(t.drel_acc, t.drel, p.H * p.U * D, stream);
    if (e == cudaSuccess && p.has_bias) e = cuda::launch_round_to<T>(t.dbias_acc, t.dbias, p.H * p.U, stream);
    return e;
  }
}

// The fast offset kernel in the shape of the class of a device with `optin` bytes of opt-in
// shared memory per block (smem_class_of).
template <typename T, int D, int NDIM>
cudaError_t launch_fast_offsets(const RelposParams& p, const RelposTensors<T>& t, size_t optin,
                                cudaStream_t stream) {
  const int sc = smem_class_of(optin);
  if (sc < 0) return cudaErrorInvalidValue;
  return by_smem_class(sc, [&](auto c) {
    constexpr int SC = decltype(c)::value;
    constexpr OffShape s = offsets_shape<T, D, NDIM, SC>();
    return launch_fast_offsets_shape<T, D, NDIM, SC, s.da, s.dc, s.acc_regs, s.qpos_chunks, s.x_parts>(
        p, t, optin, stream);
  });
}

template <typename T, int D>
cudaError_t launch_fast_offsets_by_rank(const RelposParams& p, const RelposTensors<T>& t, size_t optin,
                                        cudaStream_t stream) {
  if (p.g.ndim == 3) return launch_fast_offsets<T, D, 3>(p, t, optin, stream);
  if (p.g.ndim == 2) return launch_fast_offsets<T, D, 2>(p, t, optin, stream);
  return launch_fast_offsets<T, D, 1>(p, t, optin, stream);
}

}  // namespace posattn::relpos::cuda_fast
