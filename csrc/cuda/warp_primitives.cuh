// Warp-level tensor-core primitives of sm_80+ as inline PTX: mma.sync, ldmatrix,
// cp.async, and the packing of float pairs into 16-bit registers. The fast-path
// kernels are written on these (FlashAttention-2's instruction set); every
// instruction here runs on the simulated GPU (tests/cuda_sim/warp_primitives.cu
// checks each one, lane by lane, against the layouts below).
//
// Fragment layouts: the PTX ISA's ("Matrix Fragments for mma.m16n8k16 / m16n8k8").
// A warp's lane = 4 g + t (g = lane / 4, the group; t = lane % 4). Two 16-bit
// elements share a 32-bit register, the lower column (or row) in bits 15:0.
//   m16n8k16 (bf16, f16):
//     A (16 x 16, row-major)  a[0]: (g, 2t..2t+1)    a[1]: (g+8, 2t..2t+1)
//                             a[2]: (g, 2t+8..2t+9)  a[3]: (g+8, 2t+8..2t+9)
//     B (16 x 8, k x n)       b[0]: (2t..2t+1, g)    b[1]: (2t+8..2t+9, g)
//     C, D (16 x 8, float)    c[0], c[1]: (g, 2t), (g, 2t+1)   c[2], c[3]: (g+8, 2t), (g+8, 2t+1)
//   m16n8k8 (tf32, one element per register; C, D as above):
//     A (16 x 8)  a[0]: (g, t)  a[1]: (g+8, t)  a[2]: (g, t+4)  a[3]: (g+8, t+4)
//     B (8 x 8)   b[0]: (t, g)  b[1]: (t+4, g)
//
// ldmatrix gives the 16-bit fragments straight from shared memory: lane i passes
// the address of row i % 8 of 8 x 8 matrix i / 8 (x1: lanes 0-7, x2: 0-15, x4: all),
// and register j of every lane receives matrix j in the layouts above. With a tile's
// element (row, col) at tile + row * ld + col:
//   A, a 16 x 16 row-major tile: x4, lane i at (i % 16, 8 (i / 16));
//   B = K^T with K stored n-major (a key per row, as for S = Q K^T): x2, lane i at
//     (i % 8, 8 ((i / 8) % 2)); x4 adds the next 8 keys, lane i at
//     (i % 8 + 8 (i / 16), 8 ((i / 8) % 2)): r[0], r[1] and r[2], r[3] are two B's;
//   B = V stored k-major (a key per row, as for O = P V): .trans, x2 lane i at
//     (i % 16, 0); x4 adds the next 8 columns, lane i at (i % 16, 8 (i / 16)).
// TF32 fragments (32-bit elements) are read with plain shared loads at the
// coordinates above.
//
// Every asm that reads or writes memory says so ("memory"), so that the compiler
// keeps plain loads and stores of shared memory on their side of it.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

namespace posattn::warp {

// The 32-bit shared-window address of a pointer into shared memory (what ldmatrix
// and cp.async take).
__device__ __forceinline__ uint32_t shared_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Row and column of accumulator register i (0..3) of `lane` in a 16 x 8 C / D tile.
__device__ __forceinline__ int acc_row(int lane, int i) {
  return (lane >> 2) + 8 * (i >> 1);
}
__device__ __forceinline__ int acc_col(int lane, int i) {
  return 2 * (lane & 3) + (i & 1);
}

// ---- mma.sync -----------------------------------------------------------------------

// d += a b, m16n8k16, T = __nv_bfloat16 or __half, float accumulators.
template <typename T>
__device__ __forceinline__ void mma_m16n8k16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  static_assert(std::is_same_v<T, __nv_bfloat16> || std::is_same_v<T, __half>, "bf16 or f16 inputs");
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
}

// d += a b, m16n8k8 with TF32 inputs (registers holding to_tf32 values), float accumulators.
__device__ __forceinline__ void mma_m16n8k8_tf32(float (&d)[4], const uint32_t (&a)[4],
                                                 const uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// ---- ldmatrix -----------------------------------------------------------------------

// N = 1, 2 or 4 8 x 8 matrices of 16-bit elements from shared memory; `row` is this
// lane's row address (see the header). TRANS: each matrix transposed (.trans).
template <int N, bool TRANS = false>
__device__ __forceinline__ void ldmatrix(uint32_t (&r)[N], const void* row) {
  static_assert(N == 1 || N == 2 || N == 4, "ldmatrix loads 1, 2 or 4 matrices");
  const uint32_t addr = shared_address(row);
  if constexpr (N == 1 && !TRANS)
    asm volatile("ldmatrix.sync.aligned.m8n8.x1.shared.b16 {%0}, [%1];\n"
                 : "=r"(r[0])
                 : "r"(addr)
                 : "memory");
  else if constexpr (N == 1)
    asm volatile("ldmatrix.sync.aligned.m8n8.x1.trans.shared.b16 {%0}, [%1];\n"
                 : "=r"(r[0])
                 : "r"(addr)
                 : "memory");
  else if constexpr (N == 2 && !TRANS)
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n"
                 : "=r"(r[0]), "=r"(r[1])
                 : "r"(addr)
                 : "memory");
  else if constexpr (N == 2)
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];\n"
                 : "=r"(r[0]), "=r"(r[1])
                 : "r"(addr)
                 : "memory");
  else if constexpr (!TRANS)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr)
                 : "memory");
  else
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr)
                 : "memory");
}

// ---- cp.async -----------------------------------------------------------------------

// Copies 16 bytes from global to shared memory without passing through registers
// (L1 bypassed: .cg). !valid: writes 16 zero bytes and reads nothing (rows past the
// grid); `src` must still be a valid address then (pass the tensor's base).
// Both addresses 16-byte aligned.
__device__ __forceinline__ void cp_async_16(void* dst, const void* src, bool valid) {
  const int src_bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(shared_address(dst)), "l"(src),
               "r"(src_bytes)
               : "memory");
}

// Copies 4 bytes (one float of a per-offset table) likewise, through L1 (.ca: the
// only form for copies under 16 bytes); !valid writes 4 zero bytes. Both addresses
// 4-byte aligned.
__device__ __forceinline__ void cp_async_4(void* dst, const void* src, bool valid) {
  const int src_bytes = valid ? 4 : 0;
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(shared_address(dst)), "l"(src),
               "r"(src_bytes)
               : "memory");
}

// Closes the group of the copies issued since the last commit.
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}

// Waits until at most N committed groups are still in flight (N = 0: all done). The
// copies are visible to the thread that issued them; a __syncthreads() after the wait
// makes them visible to the block.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// ---- register packing ---------------------------------------------------------------

// Two floats rounded (to nearest even) to T = __nv_bfloat16 or __half in one
// register: lo in bits 15:0, hi in 31:16 (an A or B fragment register).
template <typename T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  static_assert(std::is_same_v<T, __nv_bfloat16> || std::is_same_v<T, __half>, "bf16 or f16");
  uint32_t r;
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    r = *reinterpret_cast<const uint32_t*>(&v);
  } else {
    const __half2 v = __floats2half2_rn(lo, hi);
    r = *reinterpret_cast<const uint32_t*>(&v);
  }
  return r;
}

// 2^x by the special-function unit (ex2.approx.ftz: about 2 ulp, a subnormal result
// flushed to 0, 2^-inf = 0): the softmax's exponential, without exp2f's subnormal fix-up.
__device__ __forceinline__ float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// A float as a TF32 operand (rounded to nearest, ties away: cvt.rna.tf32.f32).
__device__ __forceinline__ uint32_t to_tf32(float x) {
  uint32_t r;
  asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(x));
  return r;
}

// ---- fragments per element type ------------------------------------------------------

// The fast kernels' tensor-core product for element type T in shared memory, as one interface:
// Mma<T> for __nv_bfloat16 / __half (m16n8k16, fragments by ldmatrix), Mma<float> (TF32
// m16n8k8, fragments by 32-bit shared loads, each element rounded by to_tf32). kK: the k extent
// of one mma. Tiles are row-major in shared memory with row stride ld (elements); the B loads
// give two n-blocks (16 columns of the product) at once, registers 0, 1 and 2, 3.
//   load_a(a, tile, ld, lane):        A of the 16 x kK tile at `tile`
//   load_a_global(a, r0, r1, k, lane): the same from global memory, rows g and g + 8 at r0, r1
//   b_rows(lane, i), b_col(lane):     the rows (i < kRowsPerLane) and column of an n-major tile
//                                     (a row per n: K, rel) that this lane addresses
//   load_b_rows(b, rows, k):          B = X^T of the 16 rows of X whose addresses (b_col included)
//                                     this lane holds in rows[], columns k ... k + kK - 1
//   load_b_nmajor2(b, tile, ld, lane): the same for 16 consecutive rows at `tile`
//   load_b_kmajor2(b, tile, ld, lane): B = X for kK rows (k) x 16 columns (n) at `tile` (V)
//   p_frag(a, s, kk):                 A of P's columns kK kk ... from S's accumulators s[n-block][4]
//   load_a_trans(a, tile, ld, lane):  A = X^T for kK rows (k) x 16 columns (m) at `tile` (P^T)
//   bk_rows(lane, i), bk_col(lane):   the rows (k) and column of a k-major B whose rows lie
//                                     anywhere (rel rows by address) that this lane addresses
//   load_b_krows(b, rows, n):         B = X of kK such rows, columns n ... n + 15
// p_frag, load_a_trans and load_b_kmajor2 agree on the order of k (for TF32 a permutation
// within each 8: slot t is row 2t, slot t + 4 row 2t + 1), so that P's A fragments are S's
// accumulator registers as they are, with no shuffle; load_a, load_b_rows and load_b_krows
// take k in its natural order (slot t is column or row t).
template <typename T>
struct Mma {
  static_assert(std::is_same_v<T, __nv_bfloat16> || std::is_same_v<T, __half>, "bf16, f16 or float");
  static constexpr int kK = 16, kRowsPerLane = 1;
  static __device__ __forceinline__ void mma(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
    mma_m16n8k16<T>(d, a, b);
  }
  static __device__ __forceinline__ void load_a(uint32_t (&a)[4], const T* tile, int ld, int lane) {
    ldmatrix<4>(a, tile + (lane % 16) * ld + 8 * (lane / 16));
  }
  // the same from global memory: r0, r1 point at this lane's rows g and g + 8 (null: a row of
  // zeros), k at the tile's first column (Q's and q_pos's fragments read straight from the tensors)
  static __device__ __forceinline__ void load_a_global(uint32_t (&a)[4], const T* r0, const T* r1, int k,
                                                       int lane) {
    const int c = k + 2 * (lane % 4);
    const auto pair = [](const T* r) { return __ldg(reinterpret_cast<const unsigned int*>(r)); };
    a[0] = r0 != nullptr ? pair(r0 + c) : 0u, a[1] = r1 != nullptr ? pair(r1 + c) : 0u;
    a[2] = r0 != nullptr ? pair(r0 + c + 8) : 0u, a[3] = r1 != nullptr ? pair(r1 + c + 8) : 0u;
  }
  static __device__ __forceinline__ int b_rows(int lane, int) { return lane % 8 + 8 * (lane / 16); }
  static __device__ __forceinline__ int b_col(int lane) { return 8 * ((lane / 8) % 2); }
  static __device__ __forceinline__ void load_b_rows(uint32_t (&b)[4], const T* const (&rows)[1], int k) {
    ldmatrix<4>(b, rows[0] + k);
  }
  static __device__ __forceinline__ void load_b_nmajor2(uint32_t (&b)[4], const T* tile, int ld, int lane) {
    ldmatrix<4>(b, tile + b_rows(lane, 0) * ld + b_col(lane));
  }
  static __device__ __forceinline__ void load_b_kmajor2(uint32_t (&b)[4], const T* tile, int ld, int lane) {
    ldmatrix<4, true>(b, tile + (lane % 16) * ld + 8 * (lane / 16));
  }
  static __device__ __forceinline__ void load_a_trans(uint32_t (&a)[4], const T* tile, int ld, int lane) {
    ldmatrix<4, true>(a, tile + (lane % 8 + 8 * (lane / 16)) * ld + 8 * ((lane / 8) % 2));
  }
  static __device__ __forceinline__ int bk_rows(int lane, int) { return lane % 16; }
  static __device__ __forceinline__ int bk_col(int lane) { return 8 * (lane / 16); }
  static __device__ __forceinline__ void load_b_krows(uint32_t (&b)[4], const T* const (&rows)[1], int n) {
    ldmatrix<4, true>(b, rows[0] + n);
  }
  template <int NB>
  static __device__ __forceinline__ void p_frag(uint32_t (&a)[4], const float (&s)[NB][4], int kk) {
    a[0] = pack2<T>(s[2 * kk][0], s[2 * kk][1]);
    a[1] = pack2<T>(s[2 * kk][2], s[2 * kk][3]);
    a[2] = pack2<T>(s[2 * kk + 1][0], s[2 * kk + 1][1]);
    a[3] = pack2<T>(s[2 * kk + 1][2], s[2 * kk + 1][3]);
  }
  // out[0], out[1] = lo, hi rounded to T (a 4-byte store)
  static __device__ __forceinline__ void store2(T* out, float lo, float hi) {
    *reinterpret_cast<uint32_t*>(out) = pack2<T>(lo, hi);
  }
};

template <>
struct Mma<float> {
  static constexpr int kK = 8, kRowsPerLane = 2;
  static __device__ __forceinline__ void mma(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
    mma_m16n8k8_tf32(d, a, b);
  }
  // (with ld = 4 mod 8 words, the 32 lanes' loads of a register hit 32 distinct banks)
  static __device__ __forceinline__ void load_a(uint32_t (&a)[4], const float* tile, int ld, int lane) {
    const float* r = tile + (lane / 4) * ld + lane % 4;
    a[0] = to_tf32(r[0]), a[1] = to_tf32(r[8 * ld]), a[2] = to_tf32(r[4]), a[3] = to_tf32(r[8 * ld + 4]);
  }
  static __device__ __forceinline__ void load_a_global(uint32_t (&a)[4], const float* r0, const float* r1,
                                                       int k, int lane) {
    const int c = k + lane % 4;
    a[0] = to_tf32(r0 != nullptr ? __ldg(r0 + c) : 0.f), a[1] = to_tf32(r1 != nullptr ? __ldg(r1 + c) : 0.f);
    a[2] = to_tf32(r0 != nullptr ? __ldg(r0 + c + 4) : 0.f),
    a[3] = to_tf32(r1 != nullptr ? __ldg(r1 + c + 4) : 0.f);
  }
  static __device__ __forceinline__ int b_rows(int lane, int i) { return lane / 4 + 8 * i; }
  static __device__ __forceinline__ int b_col(int lane) { return lane % 4; }
  static __device__ __forceinline__ void load_b_rows(uint32_t (&b)[4], const float* const (&rows)[2], int k) {
    b[0] = to_tf32(rows[0][k]), b[1] = to_tf32(rows[0][k + 4]);
    b[2] = to_tf32(rows[1][k]), b[3] = to_tf32(rows[1][k + 4]);
  }
  static __device__ __forceinline__ void load_b_nmajor2(uint32_t (&b)[4], const float* tile, int ld,
                                                        int lane) {
    const float* const rows[2] = {tile + b_rows(lane, 0) * ld + b_col(lane),
                                  tile + b_rows(lane, 1) * ld + b_col(lane)};
    load_b_rows(b, rows, 0);
  }
  // (slot t: row 2t, slot t + 4: row 2t + 1; with ld = 4 mod 8, 32 distinct banks per register)
  static __device__ __forceinline__ void load_b_kmajor2(uint32_t (&b)[4], const float* tile, int ld,
                                                        int lane) {
    const float* r = tile + 2 * (lane % 4) * ld + lane / 4;
    b[0] = to_tf32(r[0]), b[1] = to_tf32(r[ld]), b[2] = to_tf32(r[8]), b[3] = to_tf32(r[ld + 8]);
  }
  // (slot t: row 2t, as load_b_kmajor2's)
  static __device__ __forceinline__ void load_a_trans(uint32_t (&a)[4], const float* tile, int ld, int lane) {
    const float* r = tile + 2 * (lane % 4) * ld + lane / 4;
    a[0] = to_tf32(r[0]), a[1] = to_tf32(r[8]), a[2] = to_tf32(r[ld]), a[3] = to_tf32(r[ld + 8]);
  }
  static __device__ __forceinline__ int bk_rows(int lane, int i) { return lane % 4 + 4 * i; }
  static __device__ __forceinline__ int bk_col(int lane) { return lane / 4; }
  static __device__ __forceinline__ void load_b_krows(uint32_t (&b)[4], const float* const (&rows)[2],
                                                      int n) {
    b[0] = to_tf32(rows[0][n]), b[1] = to_tf32(rows[1][n]);
    b[2] = to_tf32(rows[0][n + 8]), b[3] = to_tf32(rows[1][n + 8]);
  }
  template <int NB>
  static __device__ __forceinline__ void p_frag(uint32_t (&a)[4], const float (&s)[NB][4], int kk) {
    a[0] = to_tf32(s[kk][0]), a[1] = to_tf32(s[kk][2]), a[2] = to_tf32(s[kk][1]), a[3] = to_tf32(s[kk][3]);
  }
  static __device__ __forceinline__ void store2(float* out, float lo, float hi) {
    *reinterpret_cast<float2*>(out) = make_float2(lo, hi);
  }
};

}  // namespace posattn::warp
