// Checks every primitive of csrc/cuda/warp_primitives.cuh on a device (the
// simulated GPU in CI, ../shared/gpusim; runs as is on a real GPU): mma.sync for
// bf16, f16 and TF32, ldmatrix x1 / x2 / x4 with and without .trans in the
// layouts the header documents, cp.async with zero-fill and commit / wait groups,
// and the register packing, and A fragments read from global memory. Inputs are small multiples of 1/8, exact
// in every input type, so products and sums are exact and results are compared bit for bit with a host
// reference. Two warps per block, each with its own data.
//
//   warp_primitives        prints "PASS name" / "FAIL name: detail" per check and
//                          "N passed, M failed"; exit status 1 on a failure
//
// Run by tests/cuda_sim/test_warp_primitives.py (built as the harness is).
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "cuda/warp_primitives.cuh"
#include "sim_host.h"

namespace {

namespace warp = posattn::warp;
using sim_host::Device;
using sim_host::from_float;
using sim_host::to_float;

int passed = 0, failed = 0;

void report(const std::string& name, bool ok, const std::string& detail = "") {
  printf("%s %s%s%s\n", ok ? "PASS" : "FAIL", name.c_str(), ok ? "" : ": ", ok ? "" : detail.c_str());
  (ok ? passed : failed) += 1;
}

uint32_t lcg_state = 12345u;
// a multiple of 1/8 in [-2, 2): exact in bf16, f16 and TF32
float small_value() {
  lcg_state = lcg_state * 1664525u + 1013904223u;
  return static_cast<float>(static_cast<int>((lcg_state >> 9) % 33) - 16) / 8.f;
}

constexpr int kWarps = 2;

// ---- mma.sync m16n8k16 fed by ldmatrix ----------------------------------------------

// C (16 x 16) = C0 + A (16 x 32) B (32 x 16) per warp, two k-steps of 16 and two
// n-blocks of 8. A is a row-major tile (ld kLdA); B comes either as K (16 n-rows of
// 32 k, ld kLdK: B = K^T) or as V (32 k-rows of 16 n, ld kLdV), by the ldmatrix form
// MODE picks:
//   0 K x4    1 K x2    2 K x1    3 V x4.trans    4 V x2.trans    5 V x1.trans
constexpr int kM = 16, kN = 16, kK = 32;
constexpr int kLdA = kK + 8, kLdK = kK + 8, kLdV = kN + 8;  // rows 16-byte aligned, padded
constexpr int kModes = 6;
const char* const kModeNames[kModes] = {"K-x4", "K-x2", "K-x1", "V-x4-trans", "V-x2-trans", "V-x1-trans"};

template <typename T, int MODE>
__global__ void mma_ldmatrix_kernel(const T* a, const T* b, const float* c0, float* c) {
  __shared__ __align__(16) T As[kWarps][kM * kLdA];
  __shared__ __align__(16) T Bs[kWarps][kK * kLdV > kN * kLdK ? kK * kLdV : kN * kLdK];
  const int w = threadIdx.x / 32, lane = threadIdx.x % 32;
  constexpr bool kFromV = MODE >= 3;
  const int b_rows = kFromV ? kK : kN, b_cols = kFromV ? kN : kK, ldb = kFromV ? kLdV : kLdK;
  a += w * kM * kK;
  b += w * kK * kN;
  for (int i = lane; i < kM * kK; i += 32) As[w][(i / kK) * kLdA + i % kK] = a[i];
  for (int i = lane; i < b_rows * b_cols; i += 32) Bs[w][(i / b_cols) * ldb + i % b_cols] = b[i];
  __syncwarp();
  const T* A = As[w];
  const T* B = Bs[w];

  float d[2][4];  // n-block, accumulator register
  for (int nb = 0; nb < 2; ++nb)
    for (int i = 0; i < 4; ++i)
      d[nb][i] = c0[w * kM * kN + warp::acc_row(lane, i) * kN + nb * 8 + warp::acc_col(lane, i)];

  for (int k0 = 0; k0 < kK; k0 += 16) {
    uint32_t af[4];
    warp::ldmatrix<4>(af, A + (lane % 16) * kLdA + k0 + 8 * (lane / 16));
    uint32_t bf[2][2];  // n-block, register
    if constexpr (MODE == 0) {
      uint32_t r[4];
      warp::ldmatrix<4>(r, B + (lane % 8 + 8 * (lane / 16)) * kLdK + k0 + 8 * ((lane / 8) % 2));
      bf[0][0] = r[0], bf[0][1] = r[1], bf[1][0] = r[2], bf[1][1] = r[3];
    } else if constexpr (MODE == 1) {
      for (int nb = 0; nb < 2; ++nb)
        warp::ldmatrix<2>(bf[nb], B + (8 * nb + lane % 8) * kLdK + k0 + 8 * ((lane / 8) % 2));
    } else if constexpr (MODE == 2) {
      for (int nb = 0; nb < 2; ++nb)
        for (int j = 0; j < 2; ++j) {
          uint32_t r[1];
          warp::ldmatrix<1>(r, B + (8 * nb + lane % 8) * kLdK + k0 + 8 * j);
          bf[nb][j] = r[0];
        }
    } else if constexpr (MODE == 3) {
      uint32_t r[4];
      warp::ldmatrix<4, true>(r, B + (k0 + lane % 16) * kLdV + 8 * (lane / 16));
      bf[0][0] = r[0], bf[0][1] = r[1], bf[1][0] = r[2], bf[1][1] = r[3];
    } else if constexpr (MODE == 4) {
      for (int nb = 0; nb < 2; ++nb) warp::ldmatrix<2, true>(bf[nb], B + (k0 + lane % 16) * kLdV + 8 * nb);
    } else {
      for (int nb = 0; nb < 2; ++nb)
        for (int j = 0; j < 2; ++j) {
          uint32_t r[1];
          warp::ldmatrix<1, true>(r, B + (k0 + 8 * j + lane % 8) * kLdV + 8 * nb);
          bf[nb][j] = r[0];
        }
    }
    for (int nb = 0; nb < 2; ++nb) warp::mma_m16n8k16<T>(d[nb], af, bf[nb]);
  }
  for (int nb = 0; nb < 2; ++nb)
    for (int i = 0; i < 4; ++i)
      c[w * kM * kN + warp::acc_row(lane, i) * kN + nb * 8 + warp::acc_col(lane, i)] = d[nb][i];
}

template <typename T, int MODE>
void check_mma_ldmatrix(const char* type_name) {
  constexpr bool kFromV = MODE >= 3;
  std::vector<T> a(kWarps * kM * kK), b(kWarps * kK * kN);
  std::vector<float> c0(kWarps * kM * kN), want(kWarps * kM * kN);
  for (auto& x : a) x = from_float<T>(small_value());
  for (auto& x : b) x = from_float<T>(small_value());
  for (auto& x : c0) x = small_value();
  for (int w = 0; w < kWarps; ++w)
    for (int m = 0; m < kM; ++m)
      for (int n = 0; n < kN; ++n) {
        double s = c0[w * kM * kN + m * kN + n];
        for (int k = 0; k < kK; ++k) {
          const T bkn = kFromV ? b[w * kK * kN + k * kN + n] : b[w * kK * kN + n * kK + k];
          s += static_cast<double>(to_float(a[w * kM * kK + m * kK + k])) * to_float(bkn);
        }
        want[w * kM * kN + m * kN + n] = static_cast<float>(s);
      }
  Device<T> da(a), db(b);
  Device<float> dc0(c0), dc{std::vector<float>(c0.size(), NAN)};
  mma_ldmatrix_kernel<T, MODE><<<1, 32 * kWarps>>>(da.p, db.p, dc0.p, dc.p);
  CHECK_CUDA(cudaGetLastError());
  CHECK_CUDA(cudaDeviceSynchronize());
  const std::vector<float> got = dc.get();
  int bad = 0, first = -1;
  for (size_t i = 0; i < got.size(); ++i)
    if (std::memcmp(&got[i], &want[i], sizeof(float)) != 0 && bad++ == 0) first = static_cast<int>(i);
  char detail[160] = "";
  if (bad)
    snprintf(detail, sizeof detail, "%d of %zu entries differ; first at (warp %d, %d, %d): %g, want %g", bad,
             got.size(), first / (kM * kN), first % (kM * kN) / kN, first % kN, got[first], want[first]);
  report(std::string("mma_m16n8k16 ") + type_name + " ldmatrix " + kModeNames[MODE], bad == 0, detail);
}

template <typename T>
void check_mma_ldmatrix_all(const char* type_name) {
  check_mma_ldmatrix<T, 0>(type_name);
  check_mma_ldmatrix<T, 1>(type_name);
  check_mma_ldmatrix<T, 2>(type_name);
  check_mma_ldmatrix<T, 3>(type_name);
  check_mma_ldmatrix<T, 4>(type_name);
  check_mma_ldmatrix<T, 5>(type_name);
}

// ---- mma.sync m16n8k8 TF32 ----------------------------------------------------------

// C (16 x 8) = C0 + A (16 x 16) B (16 x 8) per warp in two k-steps of 8; fragments
// read from global memory at the layout's coordinates and rounded by to_tf32.
constexpr int kTK = 16;

__global__ void mma_tf32_kernel(const float* a, const float* b, const float* c0, float* c) {
  const int w = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  a += w * 16 * kTK;
  b += w * kTK * 8;
  float d[4];
  for (int i = 0; i < 4; ++i) d[i] = c0[w * 128 + warp::acc_row(lane, i) * 8 + warp::acc_col(lane, i)];
  for (int k0 = 0; k0 < kTK; k0 += 8) {
    const uint32_t af[4] = {warp::to_tf32(a[g * kTK + k0 + t]), warp::to_tf32(a[(g + 8) * kTK + k0 + t]),
                            warp::to_tf32(a[g * kTK + k0 + t + 4]),
                            warp::to_tf32(a[(g + 8) * kTK + k0 + t + 4])};
    const uint32_t bf[2] = {warp::to_tf32(b[(k0 + t) * 8 + g]), warp::to_tf32(b[(k0 + t + 4) * 8 + g])};
    warp::mma_m16n8k8_tf32(d, af, bf);
  }
  for (int i = 0; i < 4; ++i) c[w * 128 + warp::acc_row(lane, i) * 8 + warp::acc_col(lane, i)] = d[i];
}

void check_mma_tf32() {
  std::vector<float> a(kWarps * 16 * kTK), b(kWarps * kTK * 8), c0(kWarps * 128), want(kWarps * 128);
  for (auto& x : a) x = small_value();
  for (auto& x : b) x = small_value();
  for (auto& x : c0) x = small_value();
  for (int w = 0; w < kWarps; ++w)
    for (int m = 0; m < 16; ++m)
      for (int n = 0; n < 8; ++n) {
        double s = c0[w * 128 + m * 8 + n];
        for (int k = 0; k < kTK; ++k)
          s += static_cast<double>(a[w * 16 * kTK + m * kTK + k]) * b[w * kTK * 8 + k * 8 + n];
        want[w * 128 + m * 8 + n] = static_cast<float>(s);
      }
  Device<float> da(a), db(b), dc0(c0), dc{std::vector<float>(c0.size(), NAN)};
  mma_tf32_kernel<<<1, 32 * kWarps>>>(da.p, db.p, dc0.p, dc.p);
  CHECK_CUDA(cudaGetLastError());
  CHECK_CUDA(cudaDeviceSynchronize());
  const std::vector<float> got = dc.get();
  int bad = 0;
  for (size_t i = 0; i < got.size(); ++i) bad += std::memcmp(&got[i], &want[i], sizeof(float)) != 0;
  report("mma_m16n8k8_tf32", bad == 0,
         std::to_string(bad) + " of " + std::to_string(got.size()) + " entries differ");
}

// ---- to_tf32, pack2 -----------------------------------------------------------------

constexpr int kPackN = 4096;

__global__ void convert_kernel(const float* x, uint32_t* tf32, uint32_t* bf16x2, uint32_t* f16x2) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < kPackN; i += gridDim.x * blockDim.x) {
    tf32[i] = warp::to_tf32(x[i]);
    const float hi = x[(i * 7 + 1) % kPackN];
    bf16x2[i] = warp::pack2<__nv_bfloat16>(x[i], hi);
    f16x2[i] = warp::pack2<__half>(x[i], hi);
  }
}

uint32_t bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
}
float from_bits(uint32_t u) {
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}
template <typename H>
uint32_t bits16(H h) {
  uint16_t u;
  std::memcpy(&u, &h, 2);
  return u;
}

void check_conversions() {
  // values with bits below TF32's and bf16's mantissa, ties among them, both signs
  std::vector<float> x(kPackN);
  for (int i = 0; i < kPackN; ++i) {
    lcg_state = lcg_state * 1664525u + 1013904223u;
    const uint32_t mant =
        (i % 4 == 0) ? ((lcg_state >> 9) & ~0x1fffu) | 0x1000u : (lcg_state >> 9);  // a tie every 4th
    const uint32_t exp = 120u + (lcg_state >> 28);                                  // ~2^-7 .. 2^8
    x[i] = from_bits((static_cast<uint32_t>(i & 1) << 31) | (exp << 23) | (mant & 0x7fffffu));
  }
  Device<float> dx(x);
  const std::vector<uint32_t> zeros(kPackN);
  Device<uint32_t> tf(zeros), bf(zeros), hf(zeros);
  convert_kernel<<<4, 128>>>(dx.p, tf.p, bf.p, hf.p);
  CHECK_CUDA(cudaGetLastError());
  CHECK_CUDA(cudaDeviceSynchronize());
  const std::vector<uint32_t> gt = tf.get(), gb = bf.get(), gh = hf.get();
  int bad_tf = 0, bad_bf = 0, bad_hf = 0;
  for (int i = 0; i < kPackN; ++i) {
    // round to nearest, ties away from zero, on the magnitude's bits (finite inputs)
    const uint32_t want_tf = (bits(x[i]) + 0x1000u) & ~0x1fffu;
    bad_tf += (gt[i] & ~0x1fffu) != want_tf;
    const float hi = x[(i * 7 + 1) % kPackN];
    bad_bf += gb[i] != (bits16(__float2bfloat16_rn(x[i])) | bits16(__float2bfloat16_rn(hi)) << 16);
    bad_hf += gh[i] != (bits16(__float2half_rn(x[i])) | bits16(__float2half_rn(hi)) << 16);
  }
  report("to_tf32 (cvt.rna)", bad_tf == 0, std::to_string(bad_tf) + " of 4096 differ");
  report("pack2 bf16 (lo in bits 15:0, round to nearest even)", bad_bf == 0,
         std::to_string(bad_bf) + " of 4096 differ");
  report("pack2 f16 (lo in bits 15:0, round to nearest even)", bad_hf == 0,
         std::to_string(bad_hf) + " of 4096 differ");
}

// ---- cp.async -----------------------------------------------------------------------

// Rows of 64 bytes (4 chunks of 16) into shared memory filled with 0xAB: rows below
// `valid_rows` copied, the rest zero-filled, in two commit groups (rows 0-2, 3-5),
// waited for one by one; then shared memory back to global.
constexpr int kRows = 6, kRowBytes = 64;

__global__ void cp_async_kernel(const unsigned char* src, int valid_rows, unsigned char* out) {
  __shared__ __align__(16) unsigned char s[kRows * kRowBytes];
  for (int i = threadIdx.x; i < kRows * kRowBytes; i += blockDim.x) s[i] = 0xAB;
  __syncthreads();
  const int row = threadIdx.x / 4, chunk = threadIdx.x % 4;  // 24 threads: a chunk each
  if (threadIdx.x < 12) {
    const bool valid = row < valid_rows;
    warp::cp_async_16(s + row * kRowBytes + 16 * chunk, valid ? src + row * kRowBytes + 16 * chunk : src,
                      valid);
  }
  warp::cp_async_commit();
  if (threadIdx.x >= 12 && threadIdx.x < 24) {
    const bool valid = row < valid_rows;
    warp::cp_async_16(s + row * kRowBytes + 16 * chunk, valid ? src + row * kRowBytes + 16 * chunk : src,
                      valid);
  }
  warp::cp_async_commit();
  warp::cp_async_wait<1>();
  warp::cp_async_wait<0>();
  __syncthreads();
  for (int i = threadIdx.x; i < kRows * kRowBytes; i += blockDim.x) out[i] = s[i];
}

void check_cp_async() {
  for (int valid_rows : {kRows, 4, 0}) {
    std::vector<unsigned char> src(kRows * kRowBytes), want(kRows * kRowBytes);
    for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<unsigned char>(i * 37 + 11);
    for (size_t i = 0; i < src.size(); ++i)
      want[i] = static_cast<int>(i) / kRowBytes < valid_rows ? src[i] : 0;
    Device<unsigned char> ds(src), dout{std::vector<unsigned char>(src.size(), 0x55)};
    cp_async_kernel<<<1, 32>>>(ds.p, valid_rows, dout.p);
    CHECK_CUDA(cudaGetLastError());
    CHECK_CUDA(cudaDeviceSynchronize());
    const std::vector<unsigned char> got = dout.get();
    int bad = 0;
    for (size_t i = 0; i < got.size(); ++i) bad += got[i] != want[i];
    report("cp_async_16 " + std::to_string(valid_rows) + " of 6 rows valid (zero-fill), two groups", bad == 0,
           std::to_string(bad) + " bytes differ");
  }
}

// Floats 0 ... 95 into shared memory filled with 0xAB by 4-byte copies, those at or
// past `valid` zero-filled, one group; then back to global.
constexpr int kFloats = 96;

__global__ void cp_async_4_kernel(const float* src, int valid, float* out) {
  __shared__ __align__(16) float s[kFloats];
  for (int i = threadIdx.x; i < kFloats; i += blockDim.x) reinterpret_cast<unsigned*>(s)[i] = 0xABABABABu;
  __syncthreads();
  for (int i = threadIdx.x; i < kFloats; i += blockDim.x)
    warp::cp_async_4(s + i, i < valid ? src + i : src, i < valid);
  warp::cp_async_commit();
  warp::cp_async_wait<0>();
  __syncthreads();
  for (int i = threadIdx.x; i < kFloats; i += blockDim.x) out[i] = s[i];
}

void check_cp_async_4() {
  for (int valid : {kFloats, 37}) {
    std::vector<float> src(kFloats), want(kFloats);
    for (int i = 0; i < kFloats; ++i) src[i] = 1.5f * static_cast<float>(i) - 20.f;
    for (int i = 0; i < kFloats; ++i) want[i] = i < valid ? src[i] : 0.f;
    Device<float> ds(src), dout{std::vector<float>(kFloats, -1.f)};
    cp_async_4_kernel<<<1, 32>>>(ds.p, valid, dout.p);
    CHECK_CUDA(cudaGetLastError());
    CHECK_CUDA(cudaDeviceSynchronize());
    const std::vector<float> got = dout.get();
    int bad = 0;
    for (int i = 0; i < kFloats; ++i) bad += memcmp(&got[i], &want[i], sizeof(float)) != 0;
    report("cp_async_4 " + std::to_string(valid) + " of 96 floats valid (zero-fill)", bad == 0,
           std::to_string(bad) + " floats differ");
  }
}

// Mma<T>::load_a_global against load_a: a 16 x kK tile of a row-major matrix (row stride 24) read
// straight from global memory, rows 3 and 11 absent (null: zeros), and the same tile (those rows
// zeroed) from shared memory; every lane's four registers compared bit for bit.
constexpr int kGLd = 24;

template <typename T>
__global__ void load_a_global_kernel(const T* g, const T* gz, uint32_t* out) {
  using F = warp::Mma<T>;
  constexpr int KK = F::kK;
  __shared__ __align__(16) T s[16 * kGLd];
  const int lane = threadIdx.x;
  for (int i = lane; i < 16 * kGLd; i += 32) s[i] = gz[i];  // (g with rows 3 and 11 zeroed)
  __syncwarp();
  const auto row = [&](int r) { return r == 3 || r == 11 ? static_cast<const T*>(nullptr) : g + r * kGLd; };
  for (int k = 0; k + KK <= 16; k += KK) {
    uint32_t a[4], b[4];
    F::load_a(a, s + k, kGLd, lane);
    F::load_a_global(b, row(lane / 4), row(lane / 4 + 8), k, lane);
    for (int i = 0; i < 4; ++i) {
      out[((k / KK) * 32 + lane) * 8 + i] = a[i];
      out[((k / KK) * 32 + lane) * 8 + 4 + i] = b[i];
    }
  }
}

template <typename T>
void check_load_a_global(const char* name) {
  const auto as_t = [](float x) {
    if constexpr (std::is_same_v<T, float>)
      return x;
    else
      return from_float<T>(x);
  };
  std::vector<T> g(16 * kGLd), gz(16 * kGLd);
  for (int i = 0; i < 16 * kGLd; ++i) {
    g[i] = as_t(small_value());
    gz[i] = i / kGLd == 3 || i / kGLd == 11 ? as_t(0.f) : g[i];
  }
  constexpr int kSteps = 16 / warp::Mma<T>::kK;
  Device<T> dg(g), dgz(gz);
  Device<uint32_t> dout{std::vector<uint32_t>(kSteps * 32 * 8, 0u)};
  load_a_global_kernel<T><<<1, 32>>>(dg.p, dgz.p, dout.p);
  CHECK_CUDA(cudaGetLastError());
  CHECK_CUDA(cudaDeviceSynchronize());
  const std::vector<uint32_t> got = dout.get();
  int bad = 0;
  for (int e = 0; e < kSteps * 32; ++e)
    for (int i = 0; i < 4; ++i) bad += got[e * 8 + i] != got[e * 8 + 4 + i];
  report(std::string("load_a_global ") + name + " (rows 3 and 11 absent)", bad == 0,
         std::to_string(bad) + " registers differ from load_a's");
}

}  // namespace

int main() {
  check_mma_ldmatrix_all<__nv_bfloat16>("bf16");
  check_mma_ldmatrix_all<__half>("f16");
  check_mma_tf32();
  check_conversions();
  check_cp_async();
  check_cp_async_4();
  check_load_a_global<__nv_bfloat16>("bf16");
  check_load_a_global<__half>("f16");
  check_load_a_global<float>("tf32");
  printf("%d passed, %d failed\n", passed, failed);
  return failed ? 1 : 0;
}
