// The fast path's forward, FlashAttention-2's structure on the warp-level primitives
// (warp_primitives.cuh). This step is the skeleton without the positional term: out
// = softmax(scale q k^T) v and its lse over the N tokens of each (batch, head), with
// causal masking. It is the FA2 control the positional kernels are measured against;
// the positional term, bias, span and windows come next (issue 43), and only then
// does the plan (relpos_plan.cuh) route calls here.
//
// A block owns kBlockM = 64 queries of one (batch, head), 16 per warp; key blocks of
// kBlockN = 64 stream through two shared-memory stages, block j + 1 copied by
// cp.async while block j is computed. Per key block and warp: S = Q K^T (16 x 64) in
// mma.sync accumulators, the online softmax on those registers (a row's max and sum
// across its 4 lanes by shuffles), P rounded to T in registers and fed as the A
// operand of O += P V (FA2's register reuse: S's accumulator layout is P's A layout).
// One barrier per key block. Positions within a (batch, head) in 32 bits (N < 2^31),
// offsets into the tensors in 64.
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

template <typename T, int D>
struct FwdLayout {
  static_assert(D % 16 == 0 && D <= 128, "D a multiple of 16, at most 128");
  // row stride in elements: 16 bytes of padding put the 8 rows an ldmatrix reads on
  // distinct banks
  static constexpr int kLd = D + 8;
  static constexpr int kTile = kBlockN * kLd;  // a K or V tile (Q's, kBlockM rows, is as big)
  // K and V in two stages each: K0 V0 K1 V1; Q is read once, from where K1 goes later
  static __device__ __forceinline__ int k_at(int stage) { return 2 * stage * kTile; }
  static __device__ __forceinline__ int v_at(int stage) { return (2 * stage + 1) * kTile; }
  static constexpr int kQ = 2 * kTile;
  static constexpr size_t kBytes = static_cast<size_t>(4 * kTile) * sizeof(T);
};

// Rows [row0, row0 + ROWS) of a row-major (n, D) matrix into shared memory (row
// stride LD) by 16-byte cp.async copies of the whole block; rows at or past n are
// zero-filled. The caller commits the group.
template <typename T, int D, int LD, int ROWS>
__device__ __forceinline__ void load_rows_async(T* s, const T* __restrict__ g, int row0, int n) {
  constexpr int kPer = 16 / static_cast<int>(sizeof(T)),
                kChunks = D / kPer;  // elements per copy, copies per row
  static_assert(ROWS * kChunks % kThreads == 0, "every thread copies as many chunks");
#pragma unroll
  for (int it = 0; it < ROWS * kChunks / kThreads; ++it) {
    const int i = it * kThreads + threadIdx.x, r = i / kChunks, c = i % kChunks;
    const bool valid = row0 + r < n;
    warp::cp_async_16(s + r * LD + c * kPer, valid ? g + static_cast<int64_t>(row0 + r) * D + c * kPer : g,
                      valid);
  }
}

// Grid (query tiles, H, B).
template <typename T, int D>
__global__ void __launch_bounds__(kThreads) fast_forward_kernel(RelposParams p, RelposTensors<T> t) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  __trap();  // mma.sync with bf16, ldmatrix and cp.async need sm_80; the host never launches this below it
#else
  using L = FwdLayout<T, D>;
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

  load_rows_async<T, D, LD, kBlockM>(smem + L::kQ, q, m0, N);
  load_rows_async<T, D, LD, kBlockN>(smem + L::k_at(0), k, 0, N);
  load_rows_async<T, D, LD, kBlockN>(smem + L::v_at(0), v, 0, N);
  warp::cp_async_commit();

  // this thread's rows of the warp's 16 (accumulator registers 0, 1 and 2, 3)
  const int row0 = m0 + 16 * w + lane / 4, row1 = row0 + 8;
  const float scale_log2 = static_cast<float>(p.scale) * kLog2e;
  float o[D / 8][4] = {};                   // O (16 x D): n-blocks of 8 columns
  float m_run[2] = {-INFINITY, -INFINITY};  // running max of the rows, base 2
  float l_run[2] = {0.f, 0.f};              // this thread's part of the rows' sums
  uint32_t qf[D / 16][4];                   // Q's A fragments, loaded once

  for (int j = 0; j < blocks; ++j) {
    const int stage = j & 1;
    warp::cp_async_wait<0>();
    // key block j visible to every warp, and every warp done with block j - 1's stage
    __syncthreads();
    if (j == 0) {
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk)
        warp::ldmatrix<4>(qf[kk], smem + L::kQ + (16 * w + lane % 16) * LD + 16 * kk + 8 * (lane / 16));
      __syncthreads();  // every warp holds Q: its buffer is K1's
    }
    if (j + 1 < blocks) {  // the next key block into the other stage, while this one is computed
      load_rows_async<T, D, LD, kBlockN>(smem + L::k_at(stage ^ 1), k, (j + 1) * kBlockN, N);
      load_rows_async<T, D, LD, kBlockN>(smem + L::v_at(stage ^ 1), v, (j + 1) * kBlockN, N);
      warp::cp_async_commit();
    }
    const T* Kj = smem + L::k_at(stage);
    const T* Vj = smem + L::v_at(stage);

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
          s[nb][i] = kept ? s[nb][i] * scale_log2 : -INFINITY;
          mx[i >> 1] = fmaxf(mx[i >> 1], s[nb][i]);
        }
      }
    } else {
#pragma unroll
      for (int nb = 0; nb < kBlockN / 8; ++nb) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          s[nb][i] *= scale_log2;
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
// sm_80+ and FwdLayout<T, D>::kBytes of shared memory within the device's opt-in limit;
// this checks the rest: D = Dv, N < 2^31, H and B at most 65535 (the grid's y and z),
// q, k, v 16-byte aligned and out 4-byte aligned (cp.async and the paired stores), out
// and lse given. cudaErrorInvalidValue where one fails.
template <typename T, int D>
cudaError_t launch_fast_forward(const RelposParams& p, const RelposTensors<T>& t, cudaStream_t stream) {
  const auto misaligned = [](const void* ptr, uintptr_t a) {
    return reinterpret_cast<uintptr_t>(ptr) % a != 0;
  };
  if (p.D != D || p.Dv != D || p.N >= (int64_t{1} << 31) || p.H > 65535 || p.B > 65535)
    return cudaErrorInvalidValue;
  if (misaligned(t.q, 16) || misaligned(t.k, 16) || misaligned(t.v, 16) || misaligned(t.out, 4))
    return cudaErrorInvalidValue;
  if (p.N == 0 || p.B == 0 || p.H == 0) return cudaSuccess;
  if (t.out == nullptr || t.lse == nullptr) return cudaErrorInvalidValue;
  constexpr size_t kBytes = FwdLayout<T, D>::kBytes;
  auto kernel = fast_forward_kernel<T, D>;
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
