// Row primitives of the CPU attention kernels, written with GCC/Clang vector
// extensions so that they vectorise whatever the -march (the float
// reductions below do not auto-vectorise without -ffast-math, and -ffast-math
// would break the -inf masking the kernels rely on).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

// The CPU kernels are compiled once per capability (cpu/kernels_*.cpp), each
// defining POSATTN_CPU_CAPABILITY and the vector width: this file's inline
// functions then live in a namespace of that build, so that the builds' copies
// stay apart at link time. Elsewhere (the C++ tests) the compiler's flags decide.
#define POSATTN_CPU_VEC_H_INCLUDED  // kernels.inc checks that no earlier header included it
#ifndef POSATTN_CPU_CAPABILITY
#define POSATTN_CPU_CAPABILITY build
#endif
#ifndef POSATTN_CPU_VEC_BYTES
#if defined(__AVX512F__)
#define POSATTN_CPU_VEC_BYTES 64
#else
#define POSATTN_CPU_VEC_BYTES 32
#endif
#endif

namespace posattn {
namespace cpu {
inline namespace POSATTN_CPU_CAPABILITY {

// While alive, the calling thread flushes denormal results and inputs to zero
// (x86: MXCSR's FTZ and DAZ bits); the thread's mode is restored after. Under
// a narrow span the softmax weights of far keys are ~1e-38, and every product
// with a denormal costs ~100 cycles: 32x32, sigma 0.02 ran 4.5x slower.
// Values below 1.2e-38 (float) / 2.2e-308 (double) become 0, far below the
// kernels' rounding error. A no-op elsewhere.
class FlushDenormals {
 public:
#if defined(__x86_64__) || defined(__i386__)
  FlushDenormals() : saved_(_mm_getcsr()) { _mm_setcsr(saved_ | 0x8040u); }
  ~FlushDenormals() { _mm_setcsr(saved_); }

 private:
  unsigned int saved_;
#else
  FlushDenormals() {}
#endif
  FlushDenormals(const FlushDenormals&) = delete;
  FlushDenormals& operator=(const FlushDenormals&) = delete;
};

// The widest vectors the build targets: 64 bytes with AVX-512, else 32 (AVX2
// registers; pairs of SSE ones on older x86, NEON pairs elsewhere). On the
// AVX-512 Xeon of BENCHMARKS.md, 64-byte rows ran the softmax passes about
// twice as fast as 32-byte ones.
constexpr int kVecBytes = POSATTN_CPU_VEC_BYTES;

// W lanes of T, and the integer vector of the same width that comparisons give.
template <typename T, typename Lane>
struct VecOf {
  typedef T V __attribute__((vector_size(kVecBytes)));
  typedef Lane I __attribute__((vector_size(kVecBytes)));
  typedef Lane lane_t;
  static constexpr int W = kVecBytes / static_cast<int>(sizeof(T));
  static I iota() {
    I v = {};
    for (int i = 0; i < W; ++i) v[i] = i;
    return v;
  }
};

// exp on a vector of floats VF (any width; VI: the int32 vector of the same
// width), Cephes polynomial on [-ln2/2, ln2/2], about 1 ulp. Inputs below the
// float range (and -inf) give exactly 0; NaN stays NaN; inputs above 88.37 are
// clamped (the kernels only pass x - max <= 0).
template <typename VF, typename VI>
inline VF exp_vec(VF x) {
  const VF zero = {};
  const VF lo = zero - 87.3365447505531f, hi = zero + 88.3762626647949f;
  const VF magic = zero + 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  const VI below = x < lo;
  VF xc = (VF)((below & (VI)lo) | (~below & (VI)x));
  const VI above = xc > hi;
  xc = (VF)((above & (VI)hi) | (~above & (VI)xc));
  const VF t = xc * 1.44269504088896341f + magic;
  const VF n = t - magic;
  const VI ni = (VI)t - (VI)magic;
  VF r = xc - n * 0.693359375f;
  r = r + n * 2.12194440e-4f;
  VF p = zero + 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const VF y = p * r * r + r + 1.0f;
  const VF pow2 = (VF)((ni + 127) << 23);
  const VF e = y * pow2;
  return (VF)(~below & (VI)e);
}

template <typename T>
struct Vec;
template <>
struct Vec<float> : VecOf<float, int32_t> {
  static V exp(V x) { return exp_vec<V, I>(x); }
};
template <>
struct Vec<double> : VecOf<double, int64_t> {
  static V exp(V x) {
    for (int i = 0; i < W; ++i) x[i] = std::exp(x[i]);
    return x;
  }
};

template <typename T>
inline typename Vec<T>::V vload(const T* p) {
  typename Vec<T>::V v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
template <typename T>
inline void vstore(T* p, typename Vec<T>::V v) {
  std::memcpy(p, &v, sizeof(v));
}
// The first n (< W) lanes at p, the others 0 (nothing beyond p + n is read),
// and the store of the first n lanes: the tails of rows whose length is not a
// multiple of W (a 28-key line of a 28x28 grid), without a scalar loop.
template <typename T>
inline typename Vec<T>::V vload_n(const T* p, int64_t n) {
  typename Vec<T>::V v;
#if POSATTN_CPU_VEC_BYTES == 64
  const __mmask16 m = static_cast<__mmask16>((1u << n) - 1u);
  if constexpr (sizeof(T) == 4) {
    const __m512 x = _mm512_maskz_loadu_ps(m, p);
    std::memcpy(&v, &x, sizeof(v));
  } else {
    const __m512d x = _mm512_maskz_loadu_pd(static_cast<__mmask8>(m), p);
    std::memcpy(&v, &x, sizeof(v));
  }
#else
  T buf[Vec<T>::W] = {};
  std::memcpy(buf, p, n * sizeof(T));
  std::memcpy(&v, buf, sizeof(v));
#endif
  return v;
}
template <typename T>
inline void vstore_n(T* p, typename Vec<T>::V v, int64_t n) {
#if POSATTN_CPU_VEC_BYTES == 64
  const __mmask16 m = static_cast<__mmask16>((1u << n) - 1u);
  if constexpr (sizeof(T) == 4) {
    __m512 x;
    std::memcpy(&x, &v, sizeof(v));
    _mm512_mask_storeu_ps(p, m, x);
  } else {
    __m512d x;
    std::memcpy(&x, &v, sizeof(v));
    _mm512_mask_storeu_pd(p, static_cast<__mmask8>(m), x);
  }
#else
  T buf[Vec<T>::W];
  std::memcpy(buf, &v, sizeof(v));
  std::memcpy(p, buf, n * sizeof(T));
#endif
}

// y[i] = f(ld) for i < n, in vectors with a masked tail: f computes one
// vector of lanes, loading each operand row a through ld(a) (lanes i .. of a).
template <typename T, typename F>
inline void map_vec(T* y, int64_t n, F f) {
  constexpr int W = Vec<T>::W;
  int64_t i = 0;
  for (; i + W <= n; i += W) vstore<T>(y + i, f([&](const T* a) { return vload<T>(a + i); }));
  if (i < n) {
    const int64_t m = n - i;
    vstore_n<T>(y + i, f([&](const T* a) { return vload_n<T>(a + i, m); }), m);
  }
}

// map_vec that also adds each result into acc: y[i] = f(ld), acc[i] += y[i].
template <typename T, typename F>
inline void map_vec_accumulate(T* y, T* acc, int64_t n, F f) {
  constexpr int W = Vec<T>::W;
  int64_t i = 0;
  for (; i + W <= n; i += W) {
    const typename Vec<T>::V r = f([&](const T* a) { return vload<T>(a + i); });
    vstore<T>(y + i, r);
    vstore<T>(acc + i, vload<T>(acc + i) + r);
  }
  if (i < n) {
    const int64_t m = n - i;
    const typename Vec<T>::V r = f([&](const T* a) { return vload_n<T>(a + i, m); });
    vstore_n<T>(y + i, r, m);
    vstore_n<T>(acc + i, vload_n<T>(acc + i, m) + r, m);
  }
}

template <typename T>
inline typename Vec<T>::V vsplat(T x) {
  typename Vec<T>::V v = {};
  return v + x;
}
template <typename T>
inline typename Vec<T>::V vselect(typename Vec<T>::I mask, typename Vec<T>::V a, typename Vec<T>::V b) {
  using I = typename Vec<T>::I;
  using V = typename Vec<T>::V;
  return (V)((mask & (I)a) | (~mask & (I)b));
}
template <typename T>
inline T vhsum(typename Vec<T>::V v) {
  T s = T(0);
  for (int i = 0; i < Vec<T>::W; ++i) s += v[i];
  return s;
}
// Lanes i .. i + W - 1 that lie in [lo, hi).
template <typename T>
inline typename Vec<T>::I lanes_in(int64_t i, int64_t lo, int64_t hi) {
  using I = typename Vec<T>::I;
  using lane_t = typename Vec<T>::lane_t;
  const I idx = Vec<T>::iota() + static_cast<lane_t>(i);
  return (idx >= static_cast<lane_t>(lo)) & (idx < static_cast<lane_t>(hi));
}

inline float exp1(float x) {
  return Vec<float>::exp(vsplat<float>(x))[0];
}
inline double exp1(double x) {
  return std::exp(x);
}

// Row primitives, float in vectors of Vec<float>::W lanes; double scalar (the
// gradcheck dtype, where std::exp keeps full accuracy).
using VF = Vec<float>::V;
using VI = Vec<float>::I;
constexpr int kWF = Vec<float>::W;

// max_i x[i] (-inf for n == 0), or NaN if any x[i] is NaN: a NaN logit must
// reach the output, not be skipped as if its key were masked.
inline float row_max(const float* x, int64_t n) {
  VF m = vsplat<float>(-std::numeric_limits<float>::infinity());
  VI nan = {};
  int64_t i = 0;
  for (; i + kWF <= n; i += kWF) {
    const VF v = vload<float>(x + i);
    m = vselect<float>(v > m, v, m);
    nan |= (v != v);
  }
  float r = m[0];
  bool any_nan = false;
  for (int l = 0; l < kWF; ++l) {
    r = m[l] > r ? m[l] : r;
    any_nan |= nan[l] != 0;
  }
  for (; i < n; ++i) {
    r = x[i] > r ? x[i] : r;
    any_nan |= x[i] != x[i];
  }
  return any_nan ? std::numeric_limits<float>::quiet_NaN() : r;
}
inline double row_max(const double* x, int64_t n) {
  double r = -std::numeric_limits<double>::infinity();
  for (int64_t i = 0; i < n; ++i) {
    if (x[i] != x[i]) return x[i];
    r = x[i] > r ? x[i] : r;
  }
  return r;
}

// y[i] = exp(x[i] - shift); returns sum_i y[i]. x and y may alias.
inline float exp_shift_sum(const float* x, float* y, int64_t n, float shift) {
  const VF s = vsplat<float>(shift);
  VF acc = {};
  int64_t i = 0;
  for (; i + kWF <= n; i += kWF) {
    const VF e = Vec<float>::exp(vload<float>(x + i) - s);
    vstore<float>(y + i, e);
    acc += e;
  }
  float total = vhsum<float>(acc);
  for (; i < n; ++i) {
    y[i] = exp1(x[i] - shift);
    total += y[i];
  }
  return total;
}
inline double exp_shift_sum(const double* x, double* y, int64_t n, double shift) {
  double total = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    y[i] = std::exp(x[i] - shift);
    total += y[i];
  }
  return total;
}

// sum_i a[i] * b[i].
inline float dot(const float* a, const float* b, int64_t n) {
  VF acc = {};
  int64_t i = 0;
  for (; i + kWF <= n; i += kWF) acc += vload<float>(a + i) * vload<float>(b + i);
  float total = vhsum<float>(acc);
  for (; i < n; ++i) total += a[i] * b[i];
  return total;
}
inline double dot(const double* a, const double* b, int64_t n) {
  double total = 0.0;
  for (int64_t i = 0; i < n; ++i) total += a[i] * b[i];
  return total;
}

// sum_i a[i].
inline float sum(const float* a, int64_t n) {
  VF acc = {};
  int64_t i = 0;
  for (; i + kWF <= n; i += kWF) acc += vload<float>(a + i);
  float total = vhsum<float>(acc);
  for (; i < n; ++i) total += a[i];
  return total;
}
inline double sum(const double* a, int64_t n) {
  double total = 0.0;
  for (int64_t i = 0; i < n; ++i) total += a[i];
  return total;
}

// One pass of the softmax backward over a line with an additive span:
//   ds = p (dp - rd);  dp <- scale ds;  returns sum ds and sum ds x.
inline void softmax_backward_line(const float* p, float* dp, const float* x, float rd, float scale, int64_t n,
                                  float& sum_ds, float& sum_ds_x) {
  VF acc = {}, accx = {};
  const VF rv = vsplat<float>(rd), sv = vsplat<float>(scale);
  int64_t i = 0;
  for (; i + kWF <= n; i += kWF) {
    const VF ds = vload<float>(p + i) * (vload<float>(dp + i) - rv);
    acc += ds;
    accx += ds * vload<float>(x + i);
    vstore<float>(dp + i, ds * sv);
  }
  float total = vhsum<float>(acc), total_x = vhsum<float>(accx);
  for (; i < n; ++i) {
    const float ds = p[i] * (dp[i] - rd);
    total += ds;
    total_x += ds * x[i];
    dp[i] = ds * scale;
  }
  sum_ds = total;
  sum_ds_x = total_x;
}
inline void softmax_backward_line(const double* p, double* dp, const double* x, double rd, double scale,
                                  int64_t n, double& sum_ds, double& sum_ds_x) {
  double total = 0.0, total_x = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    const double ds = p[i] * (dp[i] - rd);
    total += ds;
    total_x += ds * x[i];
    dp[i] = ds * scale;
  }
  sum_ds = total;
  sum_ds_x = total_x;
}

}  // namespace POSATTN_CPU_CAPABILITY
}  // namespace cpu
}  // namespace posattn
