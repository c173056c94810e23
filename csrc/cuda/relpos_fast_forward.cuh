// The fast path's forward, FlashAttention-2's structure on the warp-level primitives
// (warp_primitives.cuh): out = softmax(logits) v and its lse over the N tokens of each
// (batch, head), with causal masking. POS = false: logits = scale q k^T, the FA2
// control the positional kernels are measured against. POS = true (1-D grids so far):
// logits = scale (q k^T + q_pos rel[u]) + add[u], times mul[u], with u the pair's
// offset row and add / mul the per-offset tables (bias, the span) of RelposTensors.
// Windows, span boxes and n-D grids come next (issue 43), and only then does the plan
// (relpos_plan.cuh) route calls here.
//
// A block owns kBlockM = 64 queries of one (batch, head), 16 per warp; key blocks of
// kBlockN = 64 stream through two shared-memory stages, block j + 1 copied by
// cp.async while block j is computed. Per key block and warp: S = Q K^T (16 x 64) in
// mma.sync accumulators, the online softmax on those registers (a row's max and sum
// across its 4 lanes by shuffles), P rounded to T in registers and fed as the A
// operand of O += P V (FA2's register reuse: S's accumulator layout is P's A layout).
// The positional term per warp on the tensor cores: q_pos (16 x D) times the rel rows
// of the warp's offset box (the 79 offsets between its 16 queries and the key block:
// 80 rows of the block's 128-row offset tile, which streams through the pipeline with
// K and V), into a per-warp shared buffer, then a skewed read into S: pair (i, j) sits
// at column j - i + 15. One barrier per key block. Positions within a (batch, head)
// in 32 bits, offsets into the tensors in 64.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "../core/relpos_params.h"
#include "../core/relpos_tensors.h"
#include "warp_primitives.cuh"

namespace posattn::relpos::cuda_fast {

constexpr int kWarps = 4, kThreads = 32 * kWarps;
constexpr int kBlockM = 16 * kWarps;  // queries per block
constexpr int kBlockN = 64;           // keys per key block
// so that only a tile's last key block holds keys past N or after a row's causal limit
static_assert(kBlockN == kBlockM, "a query tile's causal diagonal in one key block");

template <typename T, int D, bool POS>
struct FwdLayout {
  static_assert(D % 16 == 0 && D <= 128, "D a multiple of 16, at most 128");
  // row stride in elements: 16 bytes of padding put the 8 rows an ldmatrix reads on
  // distinct banks
  static constexpr int kLd = D + 8;
  static constexpr int kTile = kBlockN * kLd;  // a K or V tile (Q's, kBlockM rows, is as big)
  // the offsets between a query tile and a key block (kBlockM + kBlockN - 1, one row
  // of padding), and a warp's part of them
  static constexpr int kOffsets = kBlockM + kBlockN, kWarpOffsets = 16 + kBlockN;
  static constexpr int kRTile = kOffsets * kLd;
  // in elements of T: K0 V0 K1 V1, then (POS) the offset tile's two stages; Q and
  // q_pos are read once, from where K1 and V1 go later
  static __device__ __forceinline__ int k_at(int stage) { return 2 * stage * kTile; }
  static __device__ __forceinline__ int v_at(int stage) { return (2 * stage + 1) * kTile; }
  static __device__ __forceinline__ int r_at(int stage) { return 4 * kTile + stage * kRTile; }
  static constexpr int kQ = 2 * kTile, kQpos = 3 * kTile;
  static constexpr size_t kTBytes = static_cast<size_t>(4 * kTile + (POS ? 2 * kRTile : 0)) * sizeof(T);
  // then floats (POS): each warp's positional products (16 rows of its offsets, padded),
  // and the offset tile's add and mul entries in two stages
  static constexpr int kPLd = kWarpOffsets + 8;  // (+8: the float2 stores free of bank conflicts)
  static constexpr int kPbuf = 16 * kPLd;
  static constexpr size_t kBytes =
      kTBytes + (POS ? static_cast<size_t>(kWarps * kPbuf + 4 * kOffsets) * sizeof(float) : 0);
};

// Rows [row0, row0 + ROWS) of a row-major (n, D) matrix into shared memory (row
// stride LD) by 16-byte cp.async copies of the whole block; rows at or past n are
// zero-filled. The caller commits the group.
template <typename T, int D, int LD, int ROWS>
__device__ __forceinline__ void load_rows_async(T* s, const T* __restrict__ g, int row0, int n) {
  constexpr int kPer = 16 / static_cast<int>(sizeof(T)),
                kChunks = D / kPer;  // elements per copy, copies per row
  static_assert(ROWS * kChunks % kThreads == 0, "every thread copies as many chunks");
#pragma unroll 1  // (unrolled, the copies' addresses would hold registers the math needs)
  for (int it = 0; it < ROWS * kChunks / kThreads; ++it) {
    const int i = it * kThreads + threadIdx.x, r = i / kChunks, c = i % kChunks;
    const bool valid = row0 + r < n;
    warp::cp_async_16(s + r * LD + c * kPer, valid ? g + static_cast<int64_t>(row0 + r) * D + c * kPer : g,
                      valid);
  }
}

// The offset tile of key block j0 against query tile m0 (1-D): rel rows u0 ... u0 + kOffsets - 1
// with u0 = j0 - m0 - (kBlockM - 1) + N - 1, zero-filled outside [0, U), by cp.async; and
// per row, with the call's add and mul entries a and m (0 and 1 where it has none):
// add_s = a m and mul_s = scale m, so that a logit is one fused multiply-add from its
// q k: (scale (q k + q_pos rel) + a) m = q k mul_s + (q_pos rel mul_s + add_s).
// Plain stores for the two tables (the barrier before their use publishes them).
template <typename T, int D, int LD>
__device__ __forceinline__ void load_offset_tile(T* rs, float* add_s, float* mul_s, const T* __restrict__ rel,
                                                 const float* __restrict__ add, const float* __restrict__ mul,
                                                 float scale, int u0, int U) {
  constexpr int kPer = 16 / static_cast<int>(sizeof(T)), kChunks = D / kPer, kRows = kBlockM + kBlockN;
  static_assert(kRows * kChunks % kThreads == 0, "every thread copies as many chunks");
#pragma unroll 1  // (unrolled, the copies' addresses would hold registers the math needs)
  for (int it = 0; it < kRows * kChunks / kThreads; ++it) {
    const int i = it * kThreads + threadIdx.x, r = i / kChunks, c = i % kChunks, u = u0 + r;
    const bool valid = u >= 0 && u < U;
    warp::cp_async_16(rs + r * LD + c * kPer, valid ? rel + static_cast<int64_t>(u) * D + c * kPer : rel,
                      valid);
  }
  for (int r = threadIdx.x; r < kRows; r += kThreads) {
    const int u = u0 + r;
    const bool valid = u >= 0 && u < U;
    const float m = valid && mul != nullptr ? mul[u] : 1.f;
    add_s[r] = valid && add != nullptr ? add[u] * m : 0.f;
    mul_s[r] = scale * m;
  }
}

// Grid (query tiles, H, B).
template <typename T, int D, bool POS>
__global__ void __launch_bounds__(kThreads) fast_forward_kernel(RelposParams p, RelposTensors<T> t) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  __trap();  // mma.sync with bf16, ldmatrix and cp.async need sm_80; the host never launches this below it
#else
  using L = FwdLayout<T, D, POS>;
  constexpr int LD = L::kLd;
  constexpr float kLog2e = 1.4426950408889634f, kLn2 = 0.6931471805599453f;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* smem = reinterpret_cast<T*>(smem_raw);

  const int w = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int N = static_cast<int>(p.N);
  const int m0 = blockIdx.x * kBlockM;
  const int64_t bh = blockIdx.z * p.H + blockIdx.y;
  const int64_t head = bh * N * D;  // the (batch, head)'s offset in q, k, v, out
  const T* q = t.q + head;
  const T* k = t.k + head;
  const T* v = t.v + head;
  // key blocks: all, or with causal masking up to the one holding the tile's last query
  int blocks = (N + kBlockN - 1) / kBlockN;
  if (p.causal) blocks = min(blocks, (min(m0 + kBlockM, N) - 1) / kBlockN + 1);

  // POS: the head's rel rows and offset tables, the warp's positional buffer, the tables' stages
  const int U = static_cast<int>(p.U);
  const T* rel = POS ? t.rel + static_cast<int64_t>(blockIdx.y) * U * D : nullptr;
  const float* add = POS && t.offset_add ? t.offset_add + static_cast<int64_t>(blockIdx.y) * U : nullptr;
  const float* mul = POS && t.offset_mul ? t.offset_mul + static_cast<int64_t>(blockIdx.y) * U : nullptr;
  float* fsmem = reinterpret_cast<float*>(smem_raw + L::kTBytes);
  float* pbuf = fsmem + w * L::kPbuf;
  float* add_s = fsmem + kWarps * L::kPbuf;  // stage s at add_s + s kOffsets, mul_s likewise
  float* mul_s = add_s + 2 * L::kOffsets;
  const int u_first = -m0 - (kBlockM - 1) + N - 1;  // the offset tile's first row, key block 0
  const float scale = static_cast<float>(p.scale);
  const bool has_mul = mul != nullptr;

  load_rows_async<T, D, LD, kBlockM>(smem + L::kQ, q, m0, N);
  if constexpr (POS) load_rows_async<T, D, LD, kBlockM>(smem + L::kQpos, t.qpos + head, m0, N);
  load_rows_async<T, D, LD, kBlockN>(smem + L::k_at(0), k, 0, N);
  load_rows_async<T, D, LD, kBlockN>(smem + L::v_at(0), v, 0, N);
  if constexpr (POS)
    load_offset_tile<T, D, LD>(smem + L::r_at(0), add_s, mul_s, rel, add, mul, scale, u_first, U);
  warp::cp_async_commit();

  // this thread's rows of the warp's 16 (accumulator registers 0, 1 and 2, 3)
  const int row0 = m0 + 16 * w + lane / 4, row1 = row0 + 8;
  // POS: the warp's offsets are rows box0 ... box0 + kWarpOffsets - 1 of a key block's offset
  // tile (between its queries 16 w ... 16 w + 15 and the keys: column c = key - query + 15)
  const int box0 = kBlockM - 16 - 16 * w;
  const float scale_log2 = static_cast<float>(p.scale) * kLog2e;
  float o[D / 8][4] = {};                   // O (16 x D): n-blocks of 8 columns
  float m_run[2] = {-INFINITY, -INFINITY};  // running max of the rows, base 2
  float l_run[2] = {0.f, 0.f};              // this thread's part of the rows' sums
  uint32_t qf[D / 16][4];                   // Q's A fragments, loaded once
  uint32_t qpf[POS ? D / 16 : 1][4];        // q_pos's (POS)

  for (int j = 0; j < blocks; ++j) {
    const int stage = j & 1;
    warp::cp_async_wait<0>();
    // key block j visible to every warp, and every warp done with block j - 1's stage
    __syncthreads();
    if (j == 0) {
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk)
        warp::ldmatrix<4>(qf[kk], smem + L::kQ + (16 * w + lane % 16) * LD + 16 * kk + 8 * (lane / 16));
      if constexpr (POS) {
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk)
          warp::ldmatrix<4>(qpf[kk], smem + L::kQpos + (16 * w + lane % 16) * LD + 16 * kk + 8 * (lane / 16));
      }
      __syncthreads();  // every warp holds Q (and q_pos): their buffers are K1's and V1's
    }
    if (j + 1 < blocks) {  // the next key block into the other stage, while this one is computed
      load_rows_async<T, D, LD, kBlockN>(smem + L::k_at(stage ^ 1), k, (j + 1) * kBlockN, N);
      load_rows_async<T, D, LD, kBlockN>(smem + L::v_at(stage ^ 1), v, (j + 1) * kBlockN, N);
      if constexpr (POS)
        load_offset_tile<T, D, LD>(smem + L::r_at(stage ^ 1), add_s + (stage ^ 1) * L::kOffsets,
                                   mul_s + (stage ^ 1) * L::kOffsets, rel, add, mul, scale,
                                   u_first + (j + 1) * kBlockN, U);
      warp::cp_async_commit();
    }
    const T* Kj = smem + L::k_at(stage);
    const T* Vj = smem + L::v_at(stage);

    // POS: the warp's positional products first (S's registers are not live yet)
    if constexpr (POS) {
      const T* Rj = smem + L::r_at(stage);
      const float* add_j = add_s + stage * L::kOffsets;
      const float* mul_j = mul_s + stage * L::kOffsets;
#pragma unroll
      for (int nb = 0; nb < L::kWarpOffsets / 8; nb += 2) {
        float acc[2][4] = {};
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) {
          uint32_t b[4];
          warp::ldmatrix<4>(
              b, Rj + (box0 + 8 * nb + lane % 8 + 8 * (lane / 16)) * LD + 16 * kk + 8 * ((lane / 8) % 2));
          warp::mma_m16n8k16<T>(acc[0], qpf[kk], {b[0], b[1]});
          warp::mma_m16n8k16<T>(acc[1], qpf[kk], {b[2], b[3]});
        }
#pragma unroll
        for (int h = 0; h < 2; ++h) {  // column col, col + 1 of rows g, g + 8: q_pos rel mul_s + add_s
          const int col = 8 * (nb + h) + 2 * (lane % 4);
          const float2 a = *reinterpret_cast<const float2*>(add_j + box0 + col);
          const float2 m = *reinterpret_cast<const float2*>(mul_j + box0 + col);
          *reinterpret_cast<float2*>(pbuf + (lane / 4) * L::kPLd + col) =
              make_float2(fmaf(acc[h][0], m.x, a.x), fmaf(acc[h][1], m.y, a.y));
          *reinterpret_cast<float2*>(pbuf + (lane / 4 + 8) * L::kPLd + col) =
              make_float2(fmaf(acc[h][2], m.x, a.x), fmaf(acc[h][3], m.y, a.y));
        }
      }
      __syncwarp();  // the warp's products visible to its lanes
    }

    // S = Q K^T: 8 n-blocks of 8 keys
    float s[kBlockN / 8][4] = {};
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
#pragma unroll
      for (int nb = 0; nb < kBlockN / 8; nb += 2) {
        uint32_t b[4];
        warp::ldmatrix<4>(b,
                          Kj + (8 * nb + lane % 8 + 8 * (lane / 16)) * LD + 16 * kk + 8 * ((lane / 8) % 2));
        warp::mma_m16n8k16<T>(s[nb], qf[kk], {b[0], b[1]});
        warp::mma_m16n8k16<T>(s[nb + 1], qf[kk], {b[2], b[3]});
      }
    }

    // POS: the logits in natural units, (scale (q k + q_pos rel) + add) mul
    float to_log2 = scale_log2;
    if constexpr (POS) {
      to_log2 = kLog2e;
      const float* mul_j = mul_s + stage * L::kOffsets;
#pragma unroll
      for (int nb = 0; nb < kBlockN / 8; ++nb) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int il = lane / 4 + 8 * (i >> 1), c = 8 * nb + 2 * (lane % 4) + (i & 1) - il + 15;
          s[nb][i] = fmaf(s[nb][i], has_mul ? mul_j[box0 + c] : scale, pbuf[il * L::kPLd + c]);
        }
      }
    }

    // scale to base 2; on a tile's last key block (the only one with keys past N or
    // after a row's causal limit) mask; the rows' max
    float mx[2] = {-INFINITY, -INFINITY};
    if (j == blocks - 1) {
      const int key0 = j * kBlockN + 2 * (lane % 4);
#pragma unroll
      for (int nb = 0; nb < kBlockN / 8; ++nb) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int key = key0 + 8 * nb + (i & 1), row = i < 2 ? row0 : row1;
          const bool kept = key < N && (!p.causal || key <= row);
          s[nb][i] = kept ? s[nb][i] * to_log2 : -INFINITY;
          mx[i >> 1] = fmaxf(mx[i >> 1], s[nb][i]);
        }
      }
    } else {
#pragma unroll
      for (int nb = 0; nb < kBlockN / 8; ++nb) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          s[nb][i] *= to_log2;
          mx[i >> 1] = fmaxf(mx[i >> 1], s[nb][i]);
        }
      }
    }
    float base[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
      const float m_new = fmaxf(m_run[r], mx[r]);
      // a row with no key kept yet: exponents against 0 (every term is 0), nothing to rescale
      base[r] = m_new == -INFINITY ? 0.f : m_new;
      const float alpha = warp::exp2_approx(m_run[r] - base[r]);
      m_run[r] = m_new;
      l_run[r] *= alpha;
#pragma unroll
      for (int nd = 0; nd < D / 8; ++nd) {
        o[nd][2 * r] *= alpha;
        o[nd][2 * r + 1] *= alpha;
      }
    }
#pragma unroll
    for (int nb = 0; nb < kBlockN / 8; ++nb) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        s[nb][i] = warp::exp2_approx(s[nb][i] - base[i >> 1]);
        l_run[i >> 1] += s[nb][i];
      }
    }

    // O += P V: P's A fragments straight from S's accumulators, V's B fragments by ldmatrix.trans
#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; ++kk) {
      const uint32_t a[4] = {warp::pack2<T>(s[2 * kk][0], s[2 * kk][1]),
                             warp::pack2<T>(s[2 * kk][2], s[2 * kk][3]),
                             warp::pack2<T>(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                             warp::pack2<T>(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
      for (int nd = 0; nd < D / 8; nd += 2) {
        uint32_t b[4];
        warp::ldmatrix<4, true>(b, Vj + (16 * kk + lane % 16) * LD + 8 * nd + 8 * (lane / 16));
        warp::mma_m16n8k16<T>(o[nd], a, {b[0], b[1]});
        warp::mma_m16n8k16<T>(o[nd + 1], a, {b[2], b[3]});
      }
    }
  }

  // the rows' sums across their 4 lanes; out = O / l, lse = ln(sum of exp)
  T* out = t.out + head;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l_run[r] += __shfl_xor_sync(0xffffffffu, l_run[r], 1);
    l_run[r] += __shfl_xor_sync(0xffffffffu, l_run[r], 2);
    const int row = r == 0 ? row0 : row1;
    if (row >= N) continue;
    const float inv = l_run[r] > 0.f ? 1.f / l_run[r] : 0.f;
#pragma unroll
    for (int nd = 0; nd < D / 8; ++nd) {
      const uint32_t pair = warp::pack2<T>(o[nd][2 * r] * inv, o[nd][2 * r + 1] * inv);
      *reinterpret_cast<uint32_t*>(out + static_cast<int64_t>(row) * D + 8 * nd + 2 * (lane % 4)) = pair;
    }
    if (lane % 4 == 0) t.lse[bh * N + row] = l_run[r] > 0.f ? (m_run[r] + log2f(l_run[r])) * kLn2 : -INFINITY;
  }
#endif
}

// Launches the forward over every (batch, head) and query tile. The caller has checked
// sm_80+ and FwdLayout<T, D, POS>::kBytes of shared memory within the device's opt-in
// limit; this checks the rest: D = Dv, N < 2^31, H and B at most 65535 (the grid's y and
// z), q, k, v (q_pos, rel) 16-byte aligned and out 4-byte aligned (cp.async and the
// paired stores), out and lse given; POS: q_pos and rel given, a grid of at most one
// axis (U = 2 N - 1), N <= 2^30 - kBlockN (offset rows in 32 bits). cudaErrorInvalidValue
// where one fails.
template <typename T, int D, bool POS>
cudaError_t launch_fast_forward(const RelposParams& p, const RelposTensors<T>& t, cudaStream_t stream) {
  const auto misaligned = [](const void* ptr, uintptr_t a) {
    return reinterpret_cast<uintptr_t>(ptr) % a != 0;
  };
  if (p.D != D || p.Dv != D || p.N >= (int64_t{1} << 31) || p.H > 65535 || p.B > 65535)
    return cudaErrorInvalidValue;
  if (misaligned(t.q, 16) || misaligned(t.k, 16) || misaligned(t.v, 16) || misaligned(t.out, 4))
    return cudaErrorInvalidValue;
  if (POS && (t.qpos == nullptr || t.rel == nullptr || misaligned(t.qpos, 16) || misaligned(t.rel, 16) ||
              p.g.ndim > 1 || p.U != 2 * p.N - 1 || p.N > (int64_t{1} << 30) - kBlockN))
    return cudaErrorInvalidValue;
  if (p.N == 0 || p.B == 0 || p.H == 0) return cudaSuccess;
  if (t.out == nullptr || t.lse == nullptr) return cudaErrorInvalidValue;
  constexpr size_t kBytes = FwdLayout<T, D, POS>::kBytes;
  auto kernel = fast_forward_kernel<T, D, POS>;
  if (kBytes > 48 * 1024) {
    const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kBytes);
    if (e != cudaSuccess) return e;
  }
  const dim3 grid(static_cast<unsigned>((p.N + kBlockM - 1) / kBlockM), static_cast<unsigned>(p.H),
                  static_cast<unsigned>(p.B));
  kernel<<<grid, kThreads, kBytes, stream>>>(p, t);
  return cudaGetLastError();
}

}  // namespace posattn::relpos::cuda_fast
