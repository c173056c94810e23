// The fast path's backward: d q, d q_pos (query-major) and d k, d v (key-major),
// FlashAttention-2's structure on the warp-level primitives, deterministic: every
// gradient row is written once, by one warp, from sums in a fixed order (no atomics).
// d rel, d bias and d sigma come from the fast offset kernel (relpos_fast_offsets.cuh) or the
// general one, as the plan says. POS as the
// forward's: q_pos and rel null where the call has a bias or span and no q_pos (tables only).
//
// Both kernels are one template (KEYS: key-major). A block owns a fixed box of 64
// (a query tile, or a key block) and streams the boxes of the other kind through two
// shared-memory stages (cp.async, the next box copied while this one is computed): the
// key blocks that cover its queries' key ranges, as the forward visits them; or the query
// tiles whose queries may keep one of its keys (per axis an interval found by bisection,
// with causal masking a suffix of their row-major order). Per (query tile, key block)
// every warp recomputes its 16 queries' logits against the 64 keys exactly as the forward
// does (relpos_fast_forward.cuh: S = Q K^T in mma.sync accumulators; relpos_fast_common.cuh:
// the positional products per warp offset box, the skewed read, the masks per key range), then, with
// P = 2^(s log2 e - lse log2 e), dP = dO V^T and D_i = dO_i . out_i - d lse_i (rowd):
//   dS' = P (dP - D) times d logit / d (q k): scale, or scale mul[u] (multiply span)
//   query-major: dQ += dS' K (dS' from the accumulators, as P in the forward's PV), and
//                dQpos += box(dS') rel_box, dS' scattered into the warp's offset box (a
//                per-warp buffer whose other entries stay 0: a row's columns are the
//                same for every key block) times the rel rows of the box
//   key-major:   P and dS' of the 64 x 64 pair through shared memory (T), then each warp
//                its 16 keys: dV += P^T dO, dK += dS'^T Q (ldmatrix.trans).
// Two barriers per streamed box in the key-major kernel, one in the query-major (plus
// one where the offset tile or the streamed box has a single stage: D = 64 on 3-D grids,
// D = 128). At 16-bit D = 128 on 3-D grids the offset tile's rel rows come in two chunks
// of 64 columns (BwdLayout::kDC; two barriers a chunk), at float32 D = 64 on 3-D grids in
// four of 16, the query-major kernel's d q_pos taking them again after dS', the last chunk
// (still there) first. Float32 at D = 128 with a term per offset: each kernel in two launches,
// one per half of the gradients' columns, each recomputing the logits (16 x D accumulators for
// two gradients do not fit the registers), its offset tile in chunks. The smaller classes of
// shared memory (BwdShape) put the dS' box, or the key-major kernel's rows of P and dS', in the
// warp's positional buffer (spent once softmax_backward has read it; the next pair's products
// come after the next barrier), and keep q_pos's fragments in registers, its rows copied in
// through the same buffers (the key-major kernel's lse and rowd rows with them); where that is
// not enough (float32), the key-major kernel exchanges P and dS' in turn through one buffer
// (two more barriers a box). Where even that does not fit (16-bit D = 128 and float32 D = 64 in
// 99 KiB, 3-D grids; float32 D = 128 on 2-3-D grids), nothing is held whole (BwdShape::ops): per pair
// one stage holds chunk c of D's columns of every operand (Q, q_pos, dO, K, V) with the offset
// tile's, S, dP and the positional products summed over the chunks; after dS' the chunks again,
// the last (still there) first, reloading only what the gradients' products take (query-major K and
// rel rows, key-major Q and dO): two barriers a chunk, each operand read from L2 up to twice a pair.
// At D = 128 these run in halves of the gradients' columns (16-bit too: whole, they spilled on sm_80).
#pragma once

#include "cuda_common.cuh"
#include "relpos_fast_common.cuh"
#include "relpos_packed.cuh"

namespace posattn::relpos::cuda_fast {

// How a backward kernel keeps its inputs in shared memory (BwdLayout): the streamed box in
// `stages` (2: box j + 1 copied while box j is computed), the offset tile in `rel_stages`, its
// rel rows dc columns at a time (dc < D: chunks, one stage of each); `alias`: the query-major
// kernel's dS' box, or the key-major kernel's rows of P and dS', in the warp's positional
// buffer (spent by then; the box zeroed per pair); `qpos_regs`: q_pos's fragments held in
// registers, its rows copied in through the warps' positional buffers (the query-major kernel
// once, the key-major one per query tile: one stage). stages 0: no shape fits.
// `split`: the key-major kernel's exchange in two passes through one buffer of 64 rows (P, then
// dS' once every warp's dV is done: two more barriers a pair), where the two do not fit (float32).
// With q_pos in registers the key-major kernel's lse and rowd rows come in through the warps'
// positional buffers too, after q_pos's.
// `ops`: the operands too (Q, q_pos, dO, K, V) in chunks of dc columns (down to one mma's k: 8 in
// float32, whose gradient products then take one n-block a chunk), one stage holding chunk c of
// each with the offset tile's: nothing held whole (the smallest classes, D = 128 or 3-D grids; the
// control's too, float32 D = 128 in 99 KiB).
struct BwdShape {
  int stages = 0, rel_stages = 0, dc = 0;
  bool alias = false, qpos_regs = false, split = false;
  int halves = 1;  // (D = 128 with a term per offset, float32 or ops: 2, a launch per half of D's columns)
  bool ops = false;
};

// SC: the shared-memory class it is sized for (relpos_fast_common.cuh, smem_budget).
template <typename T, int D, bool POS, int NDIM, bool KEYS, int SC = 0>
struct BwdLayout {
  static constexpr size_t kBudget = smem_budget(SC);
  static_assert(D % 16 == 0 && D <= 128, "D a multiple of 16, at most 128");
  // (16 bytes of row padding, as the forward's: for float the strides of kLd, kSLd and kXLd are
  // 4 mod 8 words, which keeps the TF32 fragments' 32-bit loads free of bank conflicts)
  static constexpr int kPad = 16 / static_cast<int>(sizeof(T));
  static constexpr int kLd = D + kPad;
  static constexpr int kTile = 64 * kLd;
  static constexpr int kTileOffsets = volume<NDIM>(Box::kTileOffsets);
  static constexpr int kWarpOffsets = volume<NDIM>(Box::kWarpOffsets);
  static constexpr int kWarpCols = (kWarpOffsets + 15) / 16 * 16;
  static constexpr int kPLd = kWarpCols + 8;  // the positional products (float), as the forward's
  static constexpr int kPbuf = 17 * kPLd;
  static constexpr int kSLd = kWarpCols + kPad;  // query-major: the warp's dS' box (T)
  static constexpr int kXLd = kBlockN + kPad;  // key-major kernel: P and dS' of the pair, a row per query (T)
  static constexpr int kRangeInts = kWarps * 16 * NDIM * 2;
  // (ops: the chunk tiles of a pair, Q, q_pos (POS; the control leaves it unused), dO, K, V, in
  // this order)
  static constexpr int kOpTiles = 5;
  // the exchange's buffers of 64 rows (key-major: P and dS', or one at a time where split)
  static constexpr int exchanges(BwdShape f) { return f.split ? 1 : 2; }
  // (a warp's share of what the aliases put in its positional buffer, bytes)
  static constexpr size_t alias_bytes(BwdShape f) {
    return KEYS ? exchanges(f) * 16 * kXLd * sizeof(T) : 16 * kSLd * sizeof(T);
  }
  static constexpr size_t kPbufBytes = static_cast<size_t>(kPbuf) * 4;
  // key-major with q_pos in registers: its lse and rowd rows in the positional buffers too
  static constexpr bool rows_in_pbuf(BwdShape f) { return KEYS && f.qpos_regs; }
  static constexpr size_t kQposRowsBytes = 16 * kLd * sizeof(T);  // (a warp's rows of q_pos)
  // tiles of T: the fixed box's (query-major Q, q_pos, dO; key-major K, V), then per stage the
  // streamed box's (K, V; Q, q_pos, dO); without q_pos (the control, or q_pos in registers)
  // dO the query box's second
  static constexpr int query_tiles(bool qpos_regs) { return POS && !qpos_regs ? 3 : 2; }
  static constexpr size_t bytes(BwdShape f) {
    const int fixed = KEYS ? 2 : query_tiles(f.qpos_regs), per = KEYS ? query_tiles(f.qpos_regs) : 2;
    const size_t tel = (f.ops ? static_cast<size_t>(kOpTiles * 64 * (f.dc + kPad))
                              : static_cast<size_t>((fixed + f.stages * per) * kTile)) +
                       (POS ? f.rel_stages * kTileOffsets * (f.dc + kPad) : 0) +
                       (f.alias ? 0
                        : KEYS  ? exchanges(f) * 64 * kXLd
                                : (POS ? kWarps * 16 * kSLd : 0));
    const size_t fl =
        POS ? kWarps * kPbuf + f.rel_stages * kWarps * 2 * kWarpCols + 2 * kWarps * kWarpCols : 0;
    return tel * sizeof(T) + fl * 4 + (KEYS && !rows_in_pbuf(f) ? f.stages * 2 * 64 * 4 : 0) + kRangeInts * 4;
  }
  // the halves of a shape (float32 D = 128 with a term per offset: two; 16-bit D = 128 with the
  // operands in chunks too, whose whole accumulators spilled on sm_80 on 2-3-D grids)
  static constexpr int halves_of(bool ops) { return D == 128 && (ops || (POS && sizeof(T) == 4)) ? 2 : 1; }
  // the shape: two stages of the streamed box and of the offset tile where they fit, else one
  // of the offset tile, else one of each (refilled after another barrier); else (POS) one of
  // each with the offset tile's rel rows in chunks (the widest that fits: the positional
  // products summed over the chunks; the query-major kernel's d q_pos takes them again, last
  // chunk first, after dS'). Where none of those fits (the smaller classes), the same order
  // again with the aliases, then with q_pos in registers too (the key-major kernel's with one
  // stage). Not q_pos in registers at D = 128 or float32 D = 64: the query-major kernel's
  // accumulators, 16 x D each for two gradients, leave too few registers (float32 D = 128 with
  // a term per offset: the gradients in two halves of their columns, a launch each, each
  // recomputing the logits; chunks then too); nor the aliases with more than 4 chunks (16-bit D
  // = 128 on 3-D grids in an A100's class: 8 chunks of 16 columns, whose query-major kernel
  // spilled 8 bytes on sm_80).
  // Where still none fits, all of that again with the key-major exchange split; then the operands
  // in chunks too (ops: the widest chunks that fit, without the aliases first).
  static constexpr bool admits(BwdShape f) {
    if (f.halves != halves_of(f.ops)) return false;
    if (f.ops && (f.stages != 1 || f.rel_stages != 1 || f.qpos_regs || f.split)) return false;
    if (f.dc < D && !f.ops && (!POS || f.stages != 1 || f.rel_stages != 1)) return false;
    if (f.split && !KEYS) return false;
    if (f.alias && (!POS || alias_bytes(f) > kPbufBytes || (D / f.dc > 4 && !f.ops))) return false;
    if (f.qpos_regs && (!f.alias || D == 128 || (sizeof(T) == 4 && D > 32) || (KEYS && f.stages != 1) ||
                        kQposRowsBytes + (KEYS ? 2 * 16 * 4 : 0) > kPbufBytes))
      return false;
    return bytes(f) <= kBudget;
  }
  static constexpr BwdShape shape() {
    BwdShape f{};  // (one return: nvcc warns of the loop after an early one)
    constexpr int kStaged[3][2] = {{2, 2}, {2, 1}, {1, 1}};
    for (int split = 0; split < 2 && f.stages == 0; ++split)
      for (int mode = 0; mode < 3 && f.stages == 0; ++mode)
        for (int k = 0; k < 3 && f.stages == 0; ++k)
          for (int dc = D; dc >= 16 && f.stages == 0; dc /= 2) {
            const BwdShape c{kStaged[k][0], kStaged[k][1],   dc, mode >= 1, mode == 2,
                             split == 1,    halves_of(false)};
            if (admits(c)) f = c;
          }
    // else the operands in chunks too (the widest that fits, down to one mma's k: 8 columns in
    // float32; the aliases where needed)
    for (int alias = 0; alias < 2 && f.stages == 0; ++alias)
      for (int dc = D; dc >= warp::Mma<T>::kK && f.stages == 0; dc /= 2) {
        const BwdShape c{1, 1, dc, alias == 1, false, false, halves_of(true), true};
        if (admits(c)) f = c;
      }
    return f;
  }
  static constexpr BwdShape kShape = shape();
  static constexpr bool kFits = kShape.stages > 0;
  static constexpr bool kAlias = kShape.alias, kQposRegs = kShape.qpos_regs, kSplit = kShape.split;
  static constexpr bool kOps = kShape.ops;
  // the gradients' columns a block accumulates (kHalves 2: a launch per half of D's columns)
  static constexpr int kHalves = kFits ? kShape.halves : 1, kDH = D / kHalves;
  static constexpr bool kRowsInPbuf = rows_in_pbuf(kShape);
  static constexpr int kExchanges = exchanges(kShape);
  // (kRowsInPbuf: the lse and rowd rows' float offset in a warp's positional buffer; rowd's after
  // lse's: kRowd floats on, in the buffer or in the stage's region of 64 rows)
  static constexpr int kPbufRows = static_cast<int>(kQposRowsBytes / 4);
  static constexpr int kRowd = kRowsInPbuf ? 16 : 64;
  static constexpr int kDC = kFits ? kShape.dc : 0, kRelChunks = kDC > 0 ? D / kDC : 1;
  static constexpr int kStages = kFits ? kShape.stages : 1, kRelStages = kFits ? kShape.rel_stages : 1;
  // (the rows in the buffers are refilled only after the pair's last barrier: one stage)
  static_assert(!kRowsInPbuf || (POS && kAlias && kStages == 1), "lse and rowd in the positional buffers");
  // the query box's tiles: q_pos (POS, in shared memory) 1, dO kDO
  static constexpr int kDO = query_tiles(kQposRegs) - 1;
  static constexpr int kFixed = KEYS ? 2 : kDO + 1, kPer = KEYS ? kDO + 1 : 2;
  static constexpr int kRLd = (kDC > 0 ? kDC : D) + kPad;  // the offset tile's rows
  // the k-steps of Q K^T and dO V^T unrolled: half of them in the float32 query-major kernel
  // with chunks (all: 64 bytes of spills at D = 64 on 3-D grids; half: none)
  static constexpr int kQkUnroll =
      D / warp::Mma<T>::kK / (sizeof(T) == 4 && ((kRelChunks > 1 && !KEYS) || (kSplit && D == 128)) ? 2 : 1);
  // (ops: the k-steps of a chunk's products unrolled, half of them in float32)
  static constexpr int kOpUnroll = kDC / warp::Mma<T>::kK / (sizeof(T) == 4 && kDC > 8 ? 2 : 1);
  static constexpr int kRTile = kTileOffsets * kRLd;
  static_assert(volume<NDIM>(Box::kTile) == kBlockM && volume<NDIM>(Box::kKey) == kBlockN,
                "the boxes' sizes");
  static constexpr bool same_extents() {
    for (int a = 0; a < NDIM; ++a)
      if (extent<NDIM>(Box::kTile, a) != extent<NDIM>(Box::kKey, a)) return false;
    return true;
  }
  static_assert(same_extents(), "query tiles and key blocks of one shape (origin_of walks both)");
  static __device__ __forceinline__ int fixed_at(int i) { return i * kTile; }
  static __device__ __forceinline__ int staged_at(int stage, int i) {
    return (kFixed + stage * kPer + i) * kTile;
  }
  // ops: chunk i's tiles (kOpTiles of them, row stride kOpLd), in place of the tiles above
  static constexpr int kOpLd = kRLd;
  static __device__ __forceinline__ int op_at(int i) { return i * 64 * kOpLd; }
  static constexpr int kR0 = kOps ? kOpTiles * 64 * kOpLd : (kFixed + kStages * kPer) * kTile;
  static __device__ __forceinline__ int r_at(int stage) { return kR0 + stage * kRTile; }
  // the exchange (KEYS) or the dS' boxes, where not in the positional buffers (kAlias)
  static constexpr int kX = kR0 + (POS ? kRelStages * kRTile : 0);
  static constexpr int kTElems = kX + (kAlias ? 0
                                       : KEYS ? kExchanges * 64 * kXLd
                                              : (POS ? kWarps * 16 * kSLd : 0));
  static constexpr size_t kTBytes = static_cast<size_t>(kTElems) * sizeof(T);
  // floats: per warp its positional products, per stage, warp and table its add / mul
  // entries; then ints: per warp its columns' offset rows (woff) and tile rows (wrow)
  static __device__ __forceinline__ int table_at(int stage, int w, int which) {
    return kWarps * kPbuf + ((stage * kWarps + w) * 2 + which) * kWarpCols;
  }
  static constexpr int kFloats = POS ? kWarps * kPbuf + kRelStages * kWarps * 2 * kWarpCols : 0;
  static constexpr int kInts = POS ? 2 * kWarps * kWarpCols : 0;
  // key-major: per stage of the streamed box the query tile's lse (base 2) and rowd, 64 floats each
  static constexpr size_t kRowsAt = kTBytes + static_cast<size_t>(kFloats + kInts) * 4;
  static constexpr size_t kRangesAt = kRowsAt + (KEYS && !kRowsInPbuf ? kStages * 2 * 64 * 4 : 0);
  static constexpr size_t kBytes = kRangesAt + kRangeInts * 4;
  static_assert(kTBytes % 16 == 0 && kRangesAt % 8 == 0 && kPLd % 2 == 0 && kPbuf % 4 == 0,
                "the regions aligned (uint4, float2, int2)");
  static_assert(!kFits || kBytes == bytes(kShape), "the regions as bytes() counts them");
  static_assert(!kFits || kBytes <= kBudget, "the class's shared memory");
  // what makes one layout another: its chunks, stages, aliases
  static constexpr int kKey =
      kFits ? ((((((kDC * 4 + kStages) * 4 + kRelStages) * 2 + kAlias) * 2 + kQposRegs) * 2 + kSplit) * 2 +
               (kHalves - 1)) *
                      2 +
                  kOps
            : -1;
};

// The largest class (the smallest SC) whose layout of this kernel is class SC's: the one
// instance that runs both (relpos_fast_common.cuh).
template <typename T, int D, bool POS, int NDIM, bool KEYS, int SC>
constexpr int bwd_canonical_class() {
  if constexpr (SC > 0) {
    if constexpr (BwdLayout<T, D, POS, NDIM, KEYS, SC - 1>::kKey ==
                  BwdLayout<T, D, POS, NDIM, KEYS, SC>::kKey)
      return bwd_canonical_class<T, D, POS, NDIM, KEYS, SC - 1>();
  }
  return SC;
}

// The warp's products over D columns of a (query tile, key block) pair, added to s and dp:
// Q K^T (Qs, Ks) and dO V^T (dOs, Vs), the tile's and the key block's rows at row stride LD.
// KUNROLL: the k-steps unrolled (fewer: fewer fragments loaded ahead, fewer registers).
template <typename T, int D, int LD, int KUNROLL = D / warp::Mma<T>::kK>
__device__ __forceinline__ void warp_qk_and_dov(float (&s)[kBlockN / 8][4], float (&dp)[kBlockN / 8][4],
                                                const T* Qs, const T* dOs, const T* Ks, const T* Vs, int w,
                                                int lane) {
  using F = warp::Mma<T>;
  constexpr int KK = F::kK;
#pragma unroll(KUNROLL)
  for (int kk = 0; kk < D / KK; ++kk) {
    uint32_t qf[4], df[4];
    F::load_a(qf, Qs + 16 * w * LD + KK * kk, LD, lane);
    F::load_a(df, dOs + 16 * w * LD + KK * kk, LD, lane);
#pragma unroll
    for (int nb = 0; nb < kBlockN / 8; nb += 2) {
      const int at = 8 * nb * LD + KK * kk;
      uint32_t b[4];
      F::load_b_nmajor2(b, Ks + at, LD, lane);
      F::mma(s[nb], qf, {b[0], b[1]});
      F::mma(s[nb + 1], qf, {b[2], b[3]});
      F::load_b_nmajor2(b, Vs + at, LD, lane);
      F::mma(dp[nb], df, {b[0], b[1]});
      F::mma(dp[nb + 1], df, {b[2], b[3]});
    }
  }
}

// The warp's logits from its Q K^T sums s, in base 2 as the forward computes them, -inf where
// masked: POS: with the positional products in pbuf; full: every key of the block is in every
// row's ranges.
template <bool POS, int NDIM, typename L, bool SM>
__device__ __forceinline__ void warp_finish_logits(float (&s)[kBlockN / 8][4], int lane, const float* pbuf,
                                                   const int (&pcol)[2], const int2* ranges, const int* qo,
                                                   const int* kb, const FastGrid<NDIM, SM>& g,
                                                   const int (&row_tok)[2], float scale, bool has_mul,
                                                   bool causal, bool full) {
  constexpr float kLog2e = 1.4426950408889634f;
  const float to_log2 = POS ? kLog2e : scale * kLog2e;
  if constexpr (POS) skewed_logits<NDIM, L>(s, pbuf, pcol, lane, scale, has_mul);
  int key_last = 0, tile_first = 0;
#pragma unroll
  for (int a = 0; a < NDIM; ++a) {
    key_last += (min(kb[a] + extent<NDIM>(Box::kKey, a), g.n[a]) - 1) * g.gs[a];
    tile_first += qo[a] * g.gs[a];
  }
  if (!full || (causal && key_last > tile_first)) {
    mask_keys<NDIM>(s, ranges, kb, g.gs, lane, row_tok, causal, to_log2);
  } else {
#pragma unroll
    for (int nb = 0; nb < kBlockN / 8; ++nb)
#pragma unroll
      for (int i = 0; i < 4; ++i) s[nb][i] *= to_log2;
  }
}

// P and dS' in place of the base-2 logits s and of dp: P = 2^(s - lse2), dS' = P (dP - D) g
// with g = d logit / d (q k): scale, or scale mul[u] (row 16 of pbuf). A masked pair (or a
// row with no key kept) adds exactly 0, a kept one P (dP - D) also where P underflows to 0,
// so that a NaN in dP or D (or a +inf lse) stays visible as in the reference. each(nb, i,
// dA, x): every pair's dA = P (dP - D) and base-2 logit x (both 0 where not kept). KEEP_DA:
// s holds dA instead of P.
template <int NDIM, typename L, bool POS, bool KEEP_DA = false, typename Each>
__device__ __forceinline__ void softmax_backward(float (&s)[kBlockN / 8][4], float (&dp)[kBlockN / 8][4],
                                                 const float* pbuf, const int (&pcol)[2], int lane,
                                                 const float (&lse2)[2], const float (&rowd)[2], float scale,
                                                 bool has_mul, Each&& each) {
  constexpr KeyBlockParts<NDIM> kParts{};
#pragma unroll
  for (int nb = 0; nb < kBlockN / 8; ++nb) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int r = i >> 1;
      const bool kept = s[nb][i] != -INFINITY && lse2[r] != -INFINITY;
      const float pr = kept ? warp::exp2_approx(s[nb][i] - lse2[r]) : 0.f;
      float g = scale;
      if constexpr (POS) {
        const int c = pcol[r] + kParts.col[nb] + (i & 1);
        if (has_mul) g = pbuf[c + (16 - lane / 4 - 8 * r) * L::kPLd];
      }
      const float da = kept ? pr * (dp[nb][i] - rowd[r]) : 0.f;
      each(nb, i, da, kept ? s[nb][i] : 0.f);
      dp[nb][i] = da * g;
      s[nb][i] = KEEP_DA ? da : pr;
    }
  }
}

// Grid (fixed boxes, H, B); PACKED: a packed call (B = 1), blocks over every sample's fixed boxes
// (relpos_packed.cuh: packed_block_sample; tiles and key blocks have the same extents, so the
// forward's schedule serves), each run as a call of its sample's grid, as the forward's are (the
// key-major kernels at D = 128 with the sample's extents and strides in shared memory, after the
// layout's bytes: packed_grid_in_smem)
template <typename T, int D, bool POS, int NDIM, bool KEYS, int SC, int HALF = 0, bool PACKED = false>
__global__ void __launch_bounds__(kThreads, 1) fast_backward_kernel(RelposParams p, RelposTensors<T> t) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  __trap();  // as the forward: sm_80 instructions, never launched below it
#else
  using L = BwdLayout<T, D, POS, NDIM, KEYS, SC>;
  using F = warp::Mma<T>;  // m16n8k16 (bf16, f16) or TF32 m16n8k8 (float)
  using LR = RelRows<L>;   // (the offset tile's rows)
  constexpr int LD = L::kLd, KK = F::kK, DC = L::kDC > 0 ? L::kDC : D, RC = L::kRelChunks;
  // the gradients' columns [HC, HC + DH) (L::kHalves 2: this launch's half)
  constexpr int DH = L::kDH, HC = HALF * DH;
  static_assert(HALF < L::kHalves, "a half of the columns");
  constexpr KeyBlockParts<NDIM> kParts{};
  constexpr float kLog2e = 1.4426950408889634f;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* smem = reinterpret_cast<T*>(smem_raw);

  const int w = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int N = static_cast<int>(p.N);
  // extents, token strides, offset-row strides (kGridInSmem: a sample's extents and strides in
  // shared memory after the layout's bytes)
  constexpr bool kGridInSmem = PACKED && packed_grid_in_smem(D, KEYS, sizeof(T), POS);
  auto g = [&] {
    if constexpr (kGridInSmem)
      return FastGrid<NDIM, true>(p, reinterpret_cast<int*>(smem_raw + L::kBytes));
    else
      return FastGrid<NDIM>(p);
  }();
  int box = blockIdx.x;
  int64_t tok0 = 0;            // the call's first token (PACKED: its sample's)
  [[maybe_unused]] int s = 0;  // (PACKED) its sample
  if constexpr (PACKED) {
    if (!cuda_packed::packed_block_sample(p, t.packed_tiles, blockIdx.x, &s, &box)) return;
    g.set_sample(p, t.packed_offsets, t.packed_shapes, s);
    tok0 = t.packed_offsets[s];
    if constexpr (kGridInSmem) __syncthreads();  // thread 0's sample grid visible
  }
  const auto& n = g.n;
  const int (&rs)[NDIM] = g.rs;
  // the fixed box's origin (boxes row-major over the grid; tiles and key blocks have the
  // same extents)
  int fo[NDIM];
  g.box_origin(box, fo);
  const int64_t bh = blockIdx.z * p.H + blockIdx.y;
  const int64_t row0 = PACKED ? bh * p.tok_stride + tok0 : bh * N;  // the call's first row of (batch, head)
  const int64_t head = row0 * D;
  const T* q = t.q + head;
  const T* k = t.k + head;
  const T* v = t.v + head;
  const T* qp = POS && t.qpos ? t.qpos + head : nullptr;  // (null: tables only, as the forward)
  const T* dout = t.gout + head;
  const float* lse_g = t.lse + row0;
  const float* rowd_g = t.rowd + row0;

  // which keys a query keeps along axis a (KeyRanges: windows and span boxes)
  const KeyRanges<NDIM, PACKED> kr(p, t.sigma, g, blockIdx.y);
  const auto key_range = [&](int a, int c) { return kr(p, g, a, c); };

  // the streamed boxes: origins first[a] + i ext per axis, cnt[a] of them, visited
  // row-major from rank r0 on
  int first[NDIM], cnt[NDIM], total = 1, r0 = 0;
  if constexpr (!KEYS) {  // key blocks covering the tile's ranges, with causal a prefix
#pragma unroll
    for (int a = 0; a < NDIM; ++a) {
      const int K = extent<NDIM>(Box::kKey, a), last = min(fo[a] + extent<NDIM>(Box::kTile, a), n[a]) - 1;
      first[a] = key_range(a, fo[a]).x / K * K;
      cnt[a] = (key_range(a, last).y / K * K - first[a]) / K + 1;
      total *= cnt[a];
    }
    if (p.causal) {
      int rank = 0;
      bool tight = true;
#pragma unroll
      for (int a = 0; a < NDIM; ++a) {
        const int K = extent<NDIM>(Box::kKey, a), last = min(fo[a] + extent<NDIM>(Box::kTile, a), n[a]) - 1;
        const int klast = first[a] + (cnt[a] - 1) * K;
        const int b = tight ? min(last / K * K, klast) : klast;
        rank = rank * cnt[a] + (b - first[a]) / K;
        tight = tight && b == last;
      }
      total = rank + 1;
    }
  } else {  // query tiles whose queries' ranges meet the key block, with causal a suffix
#pragma unroll
    for (int a = 0; a < NDIM; ++a) {
      const int Q = extent<NDIM>(Box::kTile, a), kend = min(fo[a] + extent<NDIM>(Box::kKey, a), n[a]) - 1;
      int lo = 0, hi = n[a];  // the first query c with hi(c) >= fo[a]
      while (lo < hi) {
        const int mid = (lo + hi) / 2;
        if (key_range(a, mid).y >= fo[a])
          hi = mid;
        else
          lo = mid + 1;
      }
      const int qlo = lo;
      lo = 0, hi = n[a];  // the first query c with lo(c) > kend
      while (lo < hi) {
        const int mid = (lo + hi) / 2;
        if (key_range(a, mid).x > kend)
          hi = mid;
        else
          lo = mid + 1;
      }
      if (lo <= qlo) {
        total = 0;
        first[a] = 0, cnt[a] = 1;
      } else {
        first[a] = qlo / Q * Q;
        cnt[a] = ((lo - 1) / Q * Q - first[a]) / Q + 1;
        total *= cnt[a];
      }
    }
    if (p.causal && total > 0) {
      // the first tile (row-major) whose last query comes at or after the block's first
      // key in token order (lexicographic on coordinates); later tiles all do
      const auto reaches = [&](int rank) {
        int c[NDIM];
#pragma unroll
        for (int a = NDIM - 1; a >= 0; --a) {
          c[a] = min(first[a] + rank % cnt[a] * extent<NDIM>(Box::kTile, a) + extent<NDIM>(Box::kTile, a),
                     n[a]) -
                 1;
          rank /= cnt[a];
        }
        int cmp = 0;
#pragma unroll
        for (int a = 0; a < NDIM; ++a)
          if (cmp == 0) cmp = c[a] > fo[a] ? 1 : c[a] < fo[a] ? -1 : 0;
        return cmp >= 0;
      };
      int lo = 0, hi = total;
      while (lo < hi) {
        const int mid = (lo + hi) / 2;
        if (reaches(mid))
          hi = mid;
        else
          lo = mid + 1;
      }
      r0 = lo;
    }
  }
  const auto origin_of = [&](int rank, int* o) {
#pragma unroll
    for (int a = NDIM - 1; a >= 0; --a) {
      o[a] = first[a] + rank % cnt[a] * extent<NDIM>(Box::kKey, a);
      rank /= cnt[a];
    }
  };

  // the token of row r of the query tile at qo, of key r of the key block at kb (-1 outside
  // the grid)
  const auto query_token = [&](const int* qo, int r) { return g.query_token(qo, r); };
  const auto key_token = [&](const int* kb, int r) {
    int x[NDIM];
    for_axes<NDIM>([&](auto ax) {
      constexpr int a = decltype(ax)::value;
      x[a] = coord_of<NDIM, Box::kKey, a>(r);
    });
    return g.key_token(kb, x);
  };
  // the warp's rows' key ranges (rows past the grid's end as its last cell's)
  int2* ranges = reinterpret_cast<int2*>(smem_raw + L::kRangesAt) + w * 16 * NDIM;
  const auto fill_ranges = [&](const int* qo) {
    if (lane < 16) {
      for_axes<NDIM>([&](auto ax) {
        constexpr int a = decltype(ax)::value;
        ranges[lane * NDIM + a] = key_range(a, g.template query_coord<a>(qo, 16 * w + lane));
      });
    }
  };

  // POS: the head's rel rows and offset tables, the warp's buffers and maps
  const int U = static_cast<int>(p.U);
  const T* rel = POS && t.rel ? t.rel + static_cast<int64_t>(blockIdx.y) * U * D : nullptr;
  // (the head's tables; a packed call's sample_tables, the sample's: own, from its first token's slot;
  // wide, from row s U, indexed as the head's)
  constexpr bool kOwn = PACKED && packed_span_fits<T, D>();
  constexpr bool kWide = PACKED && packed_wide_fits<T, D>(true, NDIM);
  const bool own = kOwn && p.has_sigma;
  const auto tables_at = [&]() -> int64_t {
    if constexpr (kOwn) {
      if (own) return (static_cast<int64_t>(blockIdx.y) * p.N + tok0) << table_shift(p);
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
    if constexpr (!KEYS && !L::kAlias) {  // the warp's dS' box: entries no row ever writes stay 0
      T* box = smem + L::kX + w * 16 * L::kSLd;
      for (int i = lane; i < 16 * L::kSLd * static_cast<int>(sizeof(T)) / 4; i += 32)
        reinterpret_cast<uint32_t*>(box)[i] = 0u;
    }
    __syncwarp();
  }
  // the offset tile between the query tile at qo and the key block at kb into rel stage
  // rst: its rel rows' columns [c DC, (c + 1) DC) (chunk c: all of them where RC = 1) and,
  // with `tables`, each warp's add / mul entries (PACKED: the max-grid rows of rel and, without a
  // span, of the tables, from their centre; with a span the sample's own tables' rows)
  const auto load_offsets = [&](int rst, const int* qo, const int* kb, int c = 0, bool tables = true) {
    const auto first_row = [&] { return PACKED ? g.first_offset_packed(qo, kb) : g.first_offset(qo, kb); };
    const auto table_rows = [&](int& u, int& rows) {  // (own: the sample's tables' rows)
      if constexpr (kOwn)
        if (own) u = g.first_offset_own(qo, kb, &rows);
    };
    load_offset_tile<T, DC, NDIM, LR, D>(smem + L::r_at(rst), rel != nullptr ? rel + c * DC : nullptr,
                                         first_row(), U, rs, tables ? add : nullptr, tables ? mul : nullptr,
                                         table_rows, fsmem + L::table_at(rst, w, 0),
                                         fsmem + L::table_at(rst, w, 1), woff, lane);
  };
  const auto key_rows = [&](const int* kb) { return [&g, kb](const int* x) { return g.key_token(kb, x); }; };
  // q_pos's rows of the query tile: its slot, or (kQposRegs) each warp's 16 in its positional
  // buffer, read into registers before its products overwrite them
  const auto load_qpos = [&](T* slot, auto tok) {
    if constexpr (L::kQposRegs)
      load_rows_async<T, D, LD, kBlockM, D, L::kPbuf * 4 / static_cast<int>(sizeof(T))>(
          reinterpret_cast<T*>(fsmem), qp, tok);
    else
      load_rows_async<T, D, LD, kBlockM>(slot, qp, tok);
  };
  const auto pbuf_of = [&](int v) { return reinterpret_cast<T*>(fsmem + v * L::kPbuf); };  // (as T)
  uint32_t qpr[POS && L::kQposRegs ? D / KK : 1][4] = {};  // (kQposRegs: the warp's q_pos fragments)
  const auto read_qpos = [&] {
    if constexpr (POS && L::kQposRegs) {
      if (qp != nullptr) {
#pragma unroll
        for (int kk = 0; kk < D / KK; ++kk)
          F::load_a(qpr[kk], reinterpret_cast<const T*>(pbuf) + KK * kk, LD, lane);
      }
      __syncwarp();  // (the warp's products overwrite its buffer next)
    }
  };
  // query-major: the warp's dS' box (kAlias: in its positional buffer); key-major, kAlias: warp
  // v's 16 rows of P of the exchange in warp v's positional buffer (pbuf_of(v)), dS' kDS elements
  // after them
  const auto dq_box = [&]() -> T* {
    return L::kAlias ? reinterpret_cast<T*>(pbuf) : smem + L::kX + w * 16 * L::kSLd;
  };
  constexpr int kDS = L::kSplit ? 0 : L::kAlias ? 16 * L::kXLd : 64 * L::kXLd;
  // (KEYS) the lse in base 2 and rowd of the query tile's rows tok(r) into stage st (-inf and 0
  // outside the grid; kRowsInPbuf: row i's in warp i / 16's positional buffer, after q_pos's rows)
  const auto load_lse_rowd = [&](int st, auto tok) {
    if (KEYS && threadIdx.x < kBlockM) {
      const int i = threadIdx.x;
      float* lse_at = L::kRowsInPbuf ? fsmem + i / 16 * L::kPbuf + L::kPbufRows + i % 16
                                     : reinterpret_cast<float*>(smem_raw + L::kRowsAt) + st * 2 * 64 + i;
      const int r = tok(threadIdx.x);
      warp::cp_async_4(lse_at, r >= 0 ? lse_g + r : lse_g, r >= 0);
      warp::cp_async_4(lse_at + L::kRowd, r >= 0 ? rowd_g + r : rowd_g, r >= 0);
    }
  };
  // the streamed box at origin so into stage st: K and V rows, or Q, q_pos and dO rows
  // with (KEYS) the rows' lse in base 2 and rowd (-inf and 0 outside the grid)
  const auto load_stream = [&](int st, const int* so) {
    if constexpr (!KEYS) {
      load_box_async<T, D, LD, NDIM, Box::kKey, true>(smem + L::staged_at(st, 0), k,
                                                      smem + L::staged_at(st, 1), v, key_rows(so));
    } else {
      const auto tok = [&](unsigned r) { return query_token(so, static_cast<int>(r)); };
      load_rows_async<T, D, LD, kBlockM>(smem + L::staged_at(st, 0), q, tok);
      if (POS && qp != nullptr) load_qpos(smem + L::staged_at(st, 1), tok);
      load_rows_async<T, D, LD, kBlockM>(smem + L::staged_at(st, L::kDO), dout, tok);
      load_lse_rowd(st, tok);
    }
  };
  // ops: chunk c (columns [c DC, (c + 1) DC)) of the pair's operands and rel rows; `all`: of every
  // one (with c = 0 the tables and, KEYS, the rows' lse and rowd too), else of those the gradients'
  // products take after dS' (query-major K and rel, key-major Q and dO)
  constexpr int OLD = L::kOpLd;
  const auto load_ops = [&](int c, const int* qo, const int* kb, bool all) {
    if constexpr (L::kOps) {
      const int col = c * DC;
      const auto tok = [&](unsigned r) { return query_token(qo, static_cast<int>(r)); };
      if (all || KEYS) {
        load_rows_async<T, DC, OLD, kBlockM, D>(smem + L::op_at(0), q + col, tok);
        load_rows_async<T, DC, OLD, kBlockM, D>(smem + L::op_at(2), dout + col, tok);
      }
      if (all && qp != nullptr) load_rows_async<T, DC, OLD, kBlockM, D>(smem + L::op_at(1), qp + col, tok);
      if (all)
        load_box_async<T, DC, OLD, NDIM, Box::kKey, true, D>(smem + L::op_at(3), k + col, smem + L::op_at(4),
                                                             v + col, key_rows(kb));
      else if (!KEYS)
        load_box_async<T, DC, OLD, NDIM, Box::kKey, false, D>(smem + L::op_at(3), k + col, nullptr, nullptr,
                                                              key_rows(kb));
      if (all || !KEYS) load_offsets(0, qo, kb, c, all && c == 0);
      if (all && c == 0) load_lse_rowd(0, tok);
    }
  };

  // the fixed box and the first streamed one (ops: the first pair's first chunk)
  if constexpr (!KEYS) {
    const auto tok = [&](unsigned r) { return query_token(fo, static_cast<int>(r)); };
    if constexpr (!L::kOps) {
      load_rows_async<T, D, LD, kBlockM>(smem + L::fixed_at(0), q, tok);
      if (POS && qp != nullptr) load_qpos(smem + L::fixed_at(1), tok);
      load_rows_async<T, D, LD, kBlockM>(smem + L::fixed_at(L::kDO), dout, tok);
    }
    fill_ranges(fo);
  } else if constexpr (!L::kOps) {
    load_box_async<T, D, LD, NDIM, Box::kKey, true>(smem + L::fixed_at(0), k, smem + L::fixed_at(1), v,
                                                    key_rows(fo));
  }
  int so[NDIM];  // the streamed box's origin
  origin_of(r0, so);
  if (total > r0) {
    if constexpr (L::kOps) {
      load_ops(0, KEYS ? so : fo, KEYS ? fo : so, true);
    } else {
      load_stream(0, so);
      if constexpr (POS) load_offsets(0, KEYS ? so : fo, KEYS ? fo : so);
    }
  }
  warp::cp_async_commit();

  // this thread's rows (accumulator rows lane / 4 and + 8 of the warp's 16): tokens, lse in
  // base 2, rowd (query-major: fixed; key-major: per query tile), and where the skewed
  // reads start (as the forward's pcol)
  int row_tok[2], pcol[2];
  float lse2[2] = {}, rowd[2] = {};
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int il = lane / 4 + 8 * r;
    pcol[r] = skew_start<NDIM, L>(lane, il);
    row_tok[r] = -1;
    if constexpr (!KEYS) {
      row_tok[r] = query_token(fo, 16 * w + il);
      lse2[r] = row_tok[r] >= 0 ? lse_g[row_tok[r]] * kLog2e : -INFINITY;
      rowd[r] = row_tok[r] >= 0 ? rowd_g[row_tok[r]] : 0.f;
    }
  }
  // the accumulators: query-major dQ and dQpos of the warp's queries, key-major dK and
  // dV of its keys (16 x DH each: n-blocks of 8 columns)
  float acc0[DH / 8][4] = {}, acc1[DH / 8][4] = {};
  if constexpr (POS && L::kQposRegs && !KEYS) {
    warp::cp_async_wait<0>();
    __syncthreads();  // every thread's copies of q_pos's rows visible
    read_qpos();
  }

  for (int j = r0; j < total; ++j) {
    const int stage = L::kStages == 2 ? (j - r0) & 1 : 0, rst = L::kRelStages == 2 ? stage : 0;
    warp::cp_async_wait<0>();
    __syncthreads();  // box j visible to every warp, every warp done with box j - 1's stage
    // (the next box's origin computed where it is used: not held across the pair's work)
    if (L::kStages == 2 && j + 1 < total) {
      int nx[NDIM];
      origin_of(j + 1, nx);
      load_stream(stage ^ 1, nx);
      if constexpr (POS && L::kRelStages == 2) load_offsets(stage ^ 1, KEYS ? nx : fo, KEYS ? fo : nx);
      warp::cp_async_commit();
    }
    const int* qo = KEYS ? so : fo;  // this pair's query tile and key block
    const int* kb = KEYS ? fo : so;
    const T* Qs = KEYS ? smem + L::staged_at(stage, 0) : smem + L::fixed_at(0);
    const T* Qps = KEYS ? smem + L::staged_at(stage, 1) : smem + L::fixed_at(1);  // (POS only)
    const T* dOs = KEYS ? smem + L::staged_at(stage, L::kDO) : smem + L::fixed_at(L::kDO);
    const T* Ks = KEYS ? smem + L::fixed_at(0) : smem + L::staged_at(stage, 0);
    const T* Vs = KEYS ? smem + L::fixed_at(1) : smem + L::staged_at(stage, 1);
    if constexpr (KEYS) {
      __syncwarp();  // the warp done reading its previous ranges
      fill_ranges(qo);
      // (the warp's rows: in its positional buffer, or at 16 w of the stage's 64)
      const float* rows =
          L::kRowsInPbuf ? pbuf + L::kPbufRows
                         : reinterpret_cast<const float*>(smem_raw + L::kRowsAt) + stage * 2 * 64 + 16 * w;
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int i = lane / 4 + 8 * r;
        row_tok[r] = query_token(qo, 16 * w + i);
        lse2[r] = row_tok[r] >= 0 ? rows[i] * kLog2e : -INFINITY;
        rowd[r] = rows[L::kRowd + i];
      }
      __syncwarp();
      read_qpos();  // (kQposRegs: this query tile's, copied in with its rows)
    }
    bool active = true, full = true;
#pragma unroll
    for (int a = 0; a < NDIM; ++a) {
      const int2 fr = ranges[a], lr = ranges[15 * NDIM + a];
      const int kend = kb[a] + extent<NDIM>(Box::kKey, a) - 1;
      active = active && kb[a] <= lr.y && kend >= fr.x;
      full = full && kb[a] >= lr.x && kend <= fr.y;
    }

    float s[kBlockN / 8][4] = {};   // S, then P
    float dp[kBlockN / 8][4] = {};  // dP, then dS'
    if constexpr (L::kOps) {
      // S, dP and the positional products summed over the chunks of D's columns
      for_chunks<RC>(
          [&](auto chunk) {
            constexpr int c = decltype(chunk)::value;
            if (!active) return;
            warp_qk_and_dov<T, DC, OLD, L::kOpUnroll>(s, dp, smem + L::op_at(0), smem + L::op_at(2),
                                                      smem + L::op_at(3), smem + L::op_at(4), w, lane);
            if constexpr (POS) {
              uint32_t qpf[DC / KK][4];
#pragma unroll
              for (int kk = 0; kk < DC / KK; ++kk)
                F::load_a(qpf[kk], smem + L::op_at(1) + 16 * w * OLD + KK * kk, OLD, lane);
              warp_positional_products<T, DC, LR, false, c, RC>(
                  qpf, smem + L::r_at(0), rel != nullptr, wrow, fsmem + L::table_at(0, w, 0),
                  fsmem + L::table_at(0, w, 1), pbuf, lane, scale, has_add, has_mul);
            }
          },
          [&](int next) { load_ops(next, qo, kb, true); });
      if (active) __syncwarp();
    } else {
      // POS: the warp's positional products (the forward's), over RC chunks of the offset
      // tile's columns
      if constexpr (POS) {
        for_chunks<RC>(
            [&](auto chunk) {
              constexpr int c = decltype(chunk)::value;
              if (!active) return;
              // (tables only: unused, read from the unfilled stage; behind a branch on rel these
              // loads made ptxas spill at D = 128)
              uint32_t qpf[DC / KK][4];
#pragma unroll
              for (int kk = 0; kk < DC / KK; ++kk) {
                if constexpr (L::kQposRegs) {
#pragma unroll
                  for (int e = 0; e < 4; ++e) qpf[kk][e] = qpr[c * (DC / KK) + kk][e];
                } else {
                  F::load_a(qpf[kk], Qps + 16 * w * LD + c * DC + KK * kk, LD, lane);
                }
              }
              warp_positional_products<T, DC, LR, false, c, RC>(
                  qpf, smem + L::r_at(rst), rel != nullptr, wrow, fsmem + L::table_at(rst, w, 0),
                  fsmem + L::table_at(rst, w, 1), pbuf, lane, scale, has_add, has_mul);
            },
            [&](int next) { load_offsets(0, qo, kb, next, false); });
        if (active) __syncwarp();
        if constexpr (L::kRelStages == 1 && L::kStages == 2 && KEYS) {
          __syncthreads();  // every warp done with the offset tile: refill it with the next pair's
          if (j + 1 < total) {
            int nx[NDIM];
            origin_of(j + 1, nx);
            load_offsets(0, nx, fo);
            warp::cp_async_commit();
          }
        }
      }

      if (active) warp_qk_and_dov<T, D, L::kLd, L::kQkUnroll>(s, dp, Qs, dOs, Ks, Vs, w, lane);
    }
    if (active) {
      warp_finish_logits<POS, NDIM, L>(s, lane, pbuf, pcol, ranges, qo, kb, g, row_tok, scale, has_mul,
                                       p.causal, full);
      softmax_backward<NDIM, L, POS>(s, dp, pbuf, pcol, lane, lse2, rowd, scale, has_mul,
                                     [](int, int, float, float) {});
    }

    // the columns of chunk c (of DC) in this launch's half [HC, HC + DH): n-blocks [n0, n1) of the
    // chunk, n-block n0 being the accumulators' chunk_nb + n0
    constexpr auto chunk_n0 = [](int c) { return (c * DC > HC ? 0 : HC - c * DC) / 8; };
    constexpr auto chunk_n1 = [](int c) { return ((c + 1) * DC < HC + DH ? DC : HC + DH - c * DC) / 8; };
    constexpr auto chunk_nb = [](int c) { return (c * DC - HC) / 8; };
    constexpr auto in_half = [](int c) { return c * DC < HC + DH && c * DC + DC > HC; };
    if constexpr (!KEYS) {
      // dQ += dS' K over n-blocks [N0, N1) of K's columns at Kp (row stride KLD), into acc0's from A0:
      // dS' as the A operand straight from the accumulators, K by ldmatrix.trans
      const auto dq_from_k = [&](auto n0_, auto n1_, auto a0_, const T* Kp, auto kld_) {
        constexpr int N0 = decltype(n0_)::value, N1 = decltype(n1_)::value, A0 = decltype(a0_)::value;
        constexpr int KLD = decltype(kld_)::value;
#pragma unroll
        for (int kk = 0; kk < kBlockN / KK; ++kk) {
          uint32_t a[4];
          F::p_frag(a, dp, kk);
#pragma unroll
          for (int nd = N0; nd < N1; nd += 2) {
            uint32_t b[4];
            F::load_b_kmajor2(b, Kp + KK * kk * KLD + 8 * nd, KLD, lane);
            F::mma(acc0[A0 + nd], a, {b[0], b[1]});
            if (nd + 1 < N1)
              F::mma(acc0[A0 + nd + 1], a, {b[2], b[3]});  // (chunks of 8 columns: one n-block)
          }
        }
      };
      using I0 = std::integral_constant<int, 0>;
      if (active) {
        if constexpr (!L::kOps)
          dq_from_k(I0{}, std::integral_constant<int, DH / 8>{}, I0{}, Ks + HC,
                    std::integral_constant<int, LD>{});
        if (POS && rel != nullptr) {
          // dQpos += box(dS') rel_box: dS' into the warp's offset box (pair (i, j) at the
          // forward's skewed column; a permutation of the row's columns), then the product
          T* box = dq_box();
          if constexpr (L::kAlias) {
            __syncwarp();  // (the box in the warp's positional buffer: zeroed once its lanes are done with
                           // it)
            for (int i = lane; i < 16 * L::kSLd * static_cast<int>(sizeof(T)) / 16; i += 32)
              reinterpret_cast<uint4*>(box)[i] = make_uint4(0u, 0u, 0u, 0u);
            __syncwarp();
          }
#pragma unroll
          for (int nb = 0; nb < kBlockN / 8; ++nb)
#pragma unroll
            for (int i = 0; i < 4; ++i)
              box[pcol[i >> 1] - (lane / 4 + 8 * (i >> 1)) * (L::kPLd - L::kSLd) + kParts.col[nb] + (i & 1)] =
                  posattn::cuda::from_acc<T>(dp[nb][i]);
          __syncwarp();
        }
      }
      if (L::kOps || (POS && rel != nullptr)) {
        // the product per chunk of the offset tile's columns (ops: with dQ's of K's), the last chunk
        // (still there from the positional products) first; each earlier one loaded once every warp
        // is done with the one after it (RC = 1: the whole rows, no barrier); of each chunk its
        // columns in [HC, HC + DH) (L::kHalves 2: the chunks of the other half neither loaded nor used)
        const T* box = dq_box();
        const T* Rj = smem + L::r_at(rst);
        for_chunks<RC, true>(
            [&](auto chunk) {
              constexpr int c = decltype(chunk)::value;
              constexpr int n0 = chunk_n0(c), n1 = chunk_n1(c);
              if (!active || n1 <= n0) return;
              if constexpr (L::kOps)
                dq_from_k(std::integral_constant<int, n0>{}, std::integral_constant<int, n1>{},
                          std::integral_constant<int, chunk_nb(c)>{}, smem + L::op_at(3),
                          std::integral_constant<int, OLD>{});
              if constexpr (POS) {
                if (rel != nullptr) {
#pragma unroll 1
                  for (int kk = 0; kk < L::kWarpCols / KK; ++kk) {
                    uint32_t a[4];
                    F::load_a(a, box + KK * kk, L::kSLd, lane);
                    const T* rows[F::kRowsPerLane];  // this lane's rel rows of the kK columns
#pragma unroll
                    for (int i = 0; i < F::kRowsPerLane; ++i)
                      rows[i] = Rj + wrow[KK * kk + F::bk_rows(lane, i)] * L::kRLd + F::bk_col(lane);
#pragma unroll
                    for (int nd = n0; nd < n1; nd += 2) {
                      uint32_t b[4];
                      F::load_b_krows(b, rows, 8 * nd);
                      F::mma(acc1[chunk_nb(c) + nd], a, {b[0], b[1]});
                      if (nd + 1 < n1) F::mma(acc1[chunk_nb(c) + nd + 1], a, {b[2], b[3]});
                    }
                  }
                }
              }
            },
            [&](int next) {
              if (!in_half(next)) return;
              if constexpr (L::kOps)
                load_ops(next, qo, kb, false);
              else
                load_offsets(0, qo, kb, next, false);
            });
      }
    } else {
      // P and dS' of the warp's 16 queries into the exchange (zeros where inactive): rows of
      // query i at row i of the exchange, or (kAlias) at row i % 16 of pbuf_of(i / 16); dS' kDS
      // elements after P
      if constexpr (L::kAlias) __syncwarp();  // (the warp's lanes done with its positional buffer)
      T* X = L::kAlias ? pbuf_of(w) : smem + L::kX;
      const int xr = L::kAlias ? 0 : 16 * w;
      // x's rows (P or dS') of the warp's 16 queries into the exchange, kDS elements on
      const auto put = [&](const float (&x)[kBlockN / 8][4], int ds) {
#pragma unroll
        for (int nb = 0; nb < kBlockN / 8; ++nb) {
#pragma unroll
          for (int r = 0; r < 2; ++r) {
            const int at = (xr + lane / 4 + 8 * r) * L::kXLd + 8 * nb + 2 * (lane % 4);
            F::store2(X + ds + at, x[nb][2 * r], x[nb][2 * r + 1]);
          }
        }
      };
      // the exchange's rows of queries KK kk ... KK kk + KK - 1 at the warp's 16 keys (columns)
      const auto x_at = [&](int kk) -> const T* {
        return L::kAlias ? pbuf_of(KK * kk / 16) + KK * kk % 16 * L::kXLd + 16 * w
                         : smem + L::kX + KK * kk * L::kXLd + 16 * w;
      };
      // the warp's 16 keys: dV += P^T dO, dK += dS'^T Q over the tile's 64 queries, n-blocks [N0,
      // N1) of dO's and Q's columns at dOp and Qp (row stride BLD), into the accumulators' from A0
      const auto pd_times = [&](auto n0_, auto n1_, auto a0_, const T* dOp, const T* Qp, auto bld_) {
        constexpr int N0 = decltype(n0_)::value, N1 = decltype(n1_)::value, A0 = decltype(a0_)::value;
        constexpr int BLD = decltype(bld_)::value;
#pragma unroll
        for (int kk = 0; kk < kBlockM / KK; ++kk) {
          const T* Xk = x_at(kk);
          uint32_t pa[4], da[4];
          F::load_a_trans(pa, Xk, L::kXLd, lane);
          F::load_a_trans(da, Xk + kDS, L::kXLd, lane);
#pragma unroll
          for (int nd = N0; nd < N1; nd += 2) {
            const int bt = KK * kk * BLD + 8 * nd;
            uint32_t b[4];
            F::load_b_kmajor2(b, dOp + bt, BLD, lane);
            F::mma(acc1[A0 + nd], pa, {b[0], b[1]});
            if (nd + 1 < N1) F::mma(acc1[A0 + nd + 1], pa, {b[2], b[3]});  // (as dq_from_k's)
            F::load_b_kmajor2(b, Qp + bt, BLD, lane);
            F::mma(acc0[A0 + nd], da, {b[0], b[1]});
            if (nd + 1 < N1) F::mma(acc0[A0 + nd + 1], da, {b[2], b[3]});
          }
        }
      };
      if constexpr (L::kOps) {
        put(s, 0);
        put(dp, kDS);
        // per chunk of dO's and Q's columns in the half, the last (still there) first
        for_chunks<RC, true>(
            [&](auto chunk) {
              constexpr int c = decltype(chunk)::value;
              constexpr int n0 = chunk_n0(c), n1 = chunk_n1(c);
              if constexpr (c == RC - 1) __syncthreads();  // every warp's P and dS' rows written
              if constexpr (n1 > n0)
                pd_times(std::integral_constant<int, n0>{}, std::integral_constant<int, n1>{},
                         std::integral_constant<int, chunk_nb(c)>{}, smem + L::op_at(2), smem + L::op_at(0),
                         std::integral_constant<int, OLD>{});
            },
            [&](int next) {
              if (in_half(next)) load_ops(next, qo, kb, false);
            });
      } else if constexpr (!L::kSplit) {
        put(s, 0);
        put(dp, kDS);
        __syncthreads();  // every warp's P and dS' rows written
        using I0 = std::integral_constant<int, 0>;
        pd_times(I0{}, std::integral_constant<int, DH / 8>{}, I0{}, dOs + HC, Qs + HC,
                 std::integral_constant<int, LD>{});
      } else {
        // in turn through one buffer: dV += P^T dO, then (every warp done reading P) dK += dS'^T Q
        const auto x_times = [&](const T* B, float (&acc)[DH / 8][4]) {
#pragma unroll
          for (int kk = 0; kk < kBlockM / KK; ++kk) {
            uint32_t a[4];
            F::load_a_trans(a, x_at(kk), L::kXLd, lane);
#pragma unroll
            for (int nd = 0; nd < DH / 8; nd += 2) {
              uint32_t b[4];
              F::load_b_kmajor2(b, B + KK * kk * LD + HC + 8 * nd, LD, lane);
              F::mma(acc[nd], a, {b[0], b[1]});
              F::mma(acc[nd + 1], a, {b[2], b[3]});
            }
          }
        };
        put(s, 0);
        __syncthreads();  // every warp's P rows written
        x_times(dOs, acc1);
        __syncthreads();  // every warp done reading P
        put(dp, 0);
        __syncthreads();  // every warp's dS' rows written
        x_times(Qs, acc0);
      }
    }
    if constexpr (L::kStages == 1 || (POS && L::kRelStages == 1 && !KEYS)) {
      // one stage: every warp done with the streamed box (the offset tile, dQpos's too): refill
      // (ops: the next pair's first chunk)
      __syncthreads();
      if (j + 1 < total) {
        int nx[NDIM];
        origin_of(j + 1, nx);
        if constexpr (L::kOps) {
          load_ops(0, KEYS ? nx : fo, KEYS ? fo : nx, true);
        } else {
          if constexpr (L::kStages == 1) load_stream(0, nx);
          if constexpr (POS && L::kRelStages == 1 && (L::kStages == 1 || !KEYS))
            load_offsets(0, KEYS ? nx : fo, KEYS ? fo : nx);
        }
        warp::cp_async_commit();
      }
    }
    origin_of(j + 1, so);
  }

  warp::cp_async_wait<0>();  // (no copy left in flight at exit, also where nothing was visited)
  // the warp's rows of its gradients: query-major dQ (acc0) and dQpos (acc1) of its
  // queries, key-major dK (acc0) and dV (acc1) of its keys
  T* g0 = (KEYS ? t.dk : t.dq) + head;
  T* g1 = KEYS ? t.dv + head : (POS && t.dqpos ? t.dqpos + head : nullptr);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int i = 16 * w + lane / 4 + 8 * r;
    const int row = KEYS ? key_token(fo, i) : query_token(fo, i);
    if (row < 0) continue;
#pragma unroll
    for (int nd = 0; nd < DH / 8; ++nd) {
      const int64_t at = static_cast<int64_t>(row) * D + HC + 8 * nd + 2 * (lane % 4);
      F::store2(g0 + at, acc0[nd][2 * r], acc0[nd][2 * r + 1]);
      if (g1 != nullptr) F::store2(g1 + at, acc1[nd][2 * r], acc1[nd][2 * r + 1]);
    }
  }
#endif
}

// Launches both backward kernels over every (batch, head) and box, each in its layout of the
// class of a device with `optin` bytes of opt-in shared memory per block (smem_class_of; their
// canonical instances). The caller has checked sm_80+ and that both layouts fit
// (fast_backward_layout); this checks the rest: the layouts within `optin`, check_fast_call's
// (relpos_fast_common.cuh), gout 16-byte aligned, dq, dk, dv (dq_pos) aligned to two elements,
// and gout, rowd, lse, dq, dk, dv given. A packed call (p.packed_samples > 0; B = 1, t.packed_tiles
// a workspace of 2 S + 1 ints): the schedule of the forward's tiles (relpos_packed.cuh, its values
// checked again, the gradients of the tokens no box holds written 0), then both kernels over
// every sample's boxes (as many blocks as the forward's bound; those past the last box return).
template <typename T, int D, bool POS, int NDIM>
cudaError_t launch_fast_backward(const RelposParams& p, const RelposTensors<T>& t, size_t optin,
                                 cudaStream_t stream) {
  const auto misaligned = [](const void* ptr, uintptr_t a) {
    return reinterpret_cast<uintptr_t>(ptr) % a != 0;
  };
  int64_t boxes = 0;
  const cudaError_t bad = check_fast_call<D, POS, NDIM>(p, t, &boxes);
  if (bad != cudaSuccess) return bad;
  constexpr uintptr_t kPair = 2 * sizeof(T);  // (the paired stores)
  if (misaligned(t.gout, 16) || misaligned(t.dq, kPair) || misaligned(t.dk, kPair) ||
      misaligned(t.dv, kPair) || misaligned(t.dqpos, kPair))
    return cudaErrorInvalidValue;
  const int sc = smem_class_of(optin);
  if (sc < 0) return cudaErrorInvalidValue;
  if (p.N == 0 || p.B == 0 || p.H == 0) return cudaSuccess;
  if (t.gout == nullptr || t.rowd == nullptr || t.lse == nullptr || t.dq == nullptr || t.dk == nullptr ||
      t.dv == nullptr)
    return cudaErrorInvalidValue;
  const bool packed = p.packed_samples > 0;
  if (packed ? !kPackedInstances : !kSingleGridInstances) return cudaErrorNotSupported;
  if (packed) {
    if (p.B != 1 || (p.has_sigma && !packed_span_fits<T, D>() &&
                     !(packed_wide_fits<T, D>(true, NDIM) && wide_tables_fit(p))))
      return cudaErrorInvalidValue;
    const int3 tile_box = make_int3(extent<NDIM>(Box::kTile, 0), NDIM > 1 ? extent<NDIM>(Box::kTile, 1) : 1,
                                    NDIM > 2 ? extent<NDIM>(Box::kTile, 2) : 1);
    const cudaError_t e = cuda_packed::launch_packed_schedule<T, true>(p, t, NDIM, tile_box, stream);
    if (e != cudaSuccess) return e;
    boxes = cuda_packed::packed_tiles_bound(p, NDIM, tile_box);
    if (boxes >= (int64_t{1} << 31)) return cudaErrorInvalidValue;
  }
  return by_smem_class(sc, [&](auto c) -> cudaError_t {
    constexpr int QC = bwd_canonical_class<T, D, POS, NDIM, false, decltype(c)::value>();
    constexpr int KC = bwd_canonical_class<T, D, POS, NDIM, true, decltype(c)::value>();
    using QL = BwdLayout<T, D, POS, NDIM, false, QC>;
    using KL = BwdLayout<T, D, POS, NDIM, true, KC>;
    if constexpr (!QL::kFits || !KL::kFits) {
      return cudaErrorInvalidValue;  // (the plan never gives it such a call)
    } else {
      // (a packed call at D = 128: the sample's grid after the layouts' bytes, within every class's budget)
      const size_t qgrid = packed && packed_grid_in_smem(D, false, sizeof(T), POS) ? kGridSmemBytes : 0;
      const size_t kgrid = packed && packed_grid_in_smem(D, true, sizeof(T), POS) ? kGridSmemBytes : 0;
      static_assert(QL::kBytes + (packed_grid_in_smem(D, false, sizeof(T), POS) ? kGridSmemBytes : 0) <=
                            smem_budget(decltype(c)::value) &&
                        KL::kBytes + (packed_grid_in_smem(D, true, sizeof(T), POS) ? kGridSmemBytes : 0) <=
                            smem_budget(decltype(c)::value),
                    "room for a packed sample's grid");
      if (QL::kBytes + qgrid > optin || KL::kBytes + kgrid > optin) return cudaErrorInvalidValue;
      const dim3 grid(static_cast<unsigned>(boxes), static_cast<unsigned>(p.H), static_cast<unsigned>(p.B));
      cudaError_t e = cudaSuccess;
      const auto launch = [&](auto kernel, size_t bytes) {
        if (e != cudaSuccess) return;
        if (bytes > 48 * 1024)
          e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
        if (e != cudaSuccess) return;
        kernel<<<grid, kThreads, bytes, stream>>>(p, t);
        e = cudaGetLastError();
      };
      const auto launch_both = [&](auto packed_tag) {
        constexpr bool PK = decltype(packed_tag)::value;
        // (+ the sample's grid: packed_grid_in_smem)
        constexpr size_t kQGrid = PK && packed_grid_in_smem(D, false, sizeof(T), POS) ? kGridSmemBytes : 0;
        constexpr size_t kKGrid = PK && packed_grid_in_smem(D, true, sizeof(T), POS) ? kGridSmemBytes : 0;
        launch(fast_backward_kernel<T, D, POS, NDIM, false, QC, 0, PK>, QL::kBytes + kQGrid);
        launch(fast_backward_kernel<T, D, POS, NDIM, true, KC, 0, PK>, KL::kBytes + kKGrid);
        // (the second halves of the columns: D = 128 with a term per offset, float32 or ops)
        if constexpr (QL::kHalves == 2)
          launch(fast_backward_kernel<T, D, POS, NDIM, false, QC, 1, PK>, QL::kBytes + kQGrid);
        if constexpr (KL::kHalves == 2)
          launch(fast_backward_kernel<T, D, POS, NDIM, true, KC, 1, PK>, KL::kBytes + kKGrid);
      };
      if (packed) {
        if constexpr (kPackedInstances) {
          launch_both(std::true_type{});
          return e;
        }
        return cudaErrorNotSupported;
      }
      if constexpr (kSingleGridInstances) {
        launch_both(std::false_type{});
        return e;
      } else {
        return cudaErrorNotSupported;
      }
    }
  });
}

template <typename T, int D, bool POS>
cudaError_t launch_fast_backward_by_rank(const RelposParams& p, const RelposTensors<T>& t, size_t optin,
                                         cudaStream_t stream) {
  if (p.g.ndim == 3) return launch_fast_backward<T, D, POS, 3>(p, t, optin, stream);
  if (p.g.ndim == 2) return launch_fast_backward<T, D, POS, 2>(p, t, optin, stream);
  return launch_fast_backward<T, D, POS, 1>(p, t, optin, stream);
}

// The backward of a call the plan gave the fast path: the positional instance where the call
// has a term per offset (has_offset_terms; q_pos and rel null where it has none: d q_pos not
// written), else the control's.
template <typename T, int D>
cudaError_t launch_fast_backward_call(const RelposParams& p, const RelposTensors<T>& t, size_t optin,
                                      cudaStream_t stream) {
  return has_offset_terms(p) ? launch_fast_backward_by_rank<T, D, true>(p, t, optin, stream)
                             : launch_fast_backward_by_rank<T, D, false>(p, t, optin, stream);
}

// The layouts of the backward's two kernels (POS: the positional ones, else the control's) in
// class SC on a grid of NDIM axes (the plan's check and report): bytes 0 where one does not fit.
struct BwdLayoutInfo {
  // per kernel (0: query-major, d q and d q_pos; 1: key-major, d k and d v): the offset tile's
  // columns at a time, the streamed box's stages and the offset tile's, the bytes
  int dc[2] = {}, stages[2] = {}, rel_stages[2] = {};
  bool alias[2] = {}, qpos_regs[2] = {}, split[2] = {};  // (BwdShape)
  int halves[2] = {1, 1};
  bool ops[2] = {};  // (BwdShape::ops: the operands in chunks too)
  size_t kernel_bytes[2] = {};
  size_t bytes = 0;  // the larger, 0 where either does not fit
};
template <typename T, int D, bool POS, int NDIM, int SC>
constexpr BwdLayoutInfo fast_backward_layout_() {
  using Q = BwdLayout<T, D, POS, NDIM, false, SC>;
  using K = BwdLayout<T, D, POS, NDIM, true, SC>;
  BwdLayoutInfo i{};
  if (Q::kFits && K::kFits)
    i = BwdLayoutInfo{{Q::kDC, K::kDC},
                      {Q::kStages, K::kStages},
                      {Q::kRelStages, K::kRelStages},
                      {Q::kAlias, K::kAlias},
                      {Q::kQposRegs, K::kQposRegs},
                      {Q::kSplit, K::kSplit},
                      {Q::kHalves, K::kHalves},
                      {Q::kOps, K::kOps},
                      {Q::kBytes, K::kBytes},
                      Q::kBytes > K::kBytes ? Q::kBytes : K::kBytes};
  return i;
}
template <typename T, int D, int SC>
constexpr BwdLayoutInfo fast_backward_layout_sc(int ndim, bool pos) {
  if (pos)
    return ndim == 3   ? fast_backward_layout_<T, D, true, 3, SC>()
           : ndim == 2 ? fast_backward_layout_<T, D, true, 2, SC>()
                       : fast_backward_layout_<T, D, true, 1, SC>();
  return ndim == 3   ? fast_backward_layout_<T, D, false, 3, SC>()
         : ndim == 2 ? fast_backward_layout_<T, D, false, 2, SC>()
                     : fast_backward_layout_<T, D, false, 1, SC>();
}
// The same for a call on a grid of `ndim` axes in class sc; pos: it has a term per offset.
template <typename T, int D>
constexpr BwdLayoutInfo fast_backward_layout(int ndim, bool pos, int sc) {
  return sc == 0   ? fast_backward_layout_sc<T, D, 0>(ndim, pos)
         : sc == 1 ? fast_backward_layout_sc<T, D, 1>(ndim, pos)
                   : fast_backward_layout_sc<T, D, 2>(ndim, pos);
}

}  // namespace posattn::relpos::cuda_fast
