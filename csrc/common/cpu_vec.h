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
#include <xmmintrin.h>
#endif

namespace posattn {
namespace cpu {

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

typedef float v8f __attribute__((vector_size(32)));
typedef int32_t v8i __attribute__((vector_size(32)));

inline v8f load8(const float* p) {
  v8f v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
inline void store8(float* p, v8f v) { std::memcpy(p, &v, sizeof(v)); }
inline v8f splat8(float x) { return v8f{x, x, x, x, x, x, x, x}; }
inline v8f select8(v8i mask, v8f a, v8f b) {  // mask lanes are 0 or -1
  return reinterpret_cast<v8f>((mask & reinterpret_cast<v8i>(a)) |
                               (~mask & reinterpret_cast<v8i>(b)));
}
inline float hsum8(v8f v) {
  float s = 0.0f;
  for (int i = 0; i < 8; ++i) s += v[i];
  return s;
}
inline float hmax8(v8f v) {
  float m = v[0];
  for (int i = 1; i < 8; ++i) m = v[i] > m ? v[i] : m;
  return m;
}

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

inline v8f exp8(v8f x) { return exp_vec<v8f, v8i>(x); }

inline float exp1(float x) {
  float buf[8] = {x, x, x, x, x, x, x, x};
  return exp8(load8(buf))[0];
}
inline double exp1(double x) { return std::exp(x); }

// max_i x[i] (-inf for n == 0), or NaN if any x[i] is NaN: a NaN logit must
// reach the output, not be skipped as if its key were masked.
inline float row_max(const float* x, int64_t n) {
  v8f m = splat8(-std::numeric_limits<float>::infinity());
  v8i nan = v8i{0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const v8f v = load8(x + i);
    m = select8(v > m, v, m);
    nan |= (v != v);
  }
  float r = hmax8(m);
  bool any_nan = false;
  for (int l = 0; l < 8; ++l) any_nan |= nan[l] != 0;
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
  const v8f s = splat8(shift);
  v8f acc = splat8(0.0f);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const v8f e = exp8(load8(x + i) - s);
    store8(y + i, e);
    acc += e;
  }
  float total = hsum8(acc);
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
  v8f acc = splat8(0.0f);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) acc += load8(a + i) * load8(b + i);
  float total = hsum8(acc);
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
  v8f acc = splat8(0.0f);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) acc += load8(a + i);
  float total = hsum8(acc);
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
inline void softmax_backward_line(const float* p, float* dp, const float* x, float rd, float scale,
                                  int64_t n, float& sum_ds, float& sum_ds_x) {
  v8f acc = splat8(0.0f), accx = splat8(0.0f);
  const v8f r8 = splat8(rd), s8 = splat8(scale);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const v8f ds = load8(p + i) * (load8(dp + i) - r8);
    acc += ds;
    accx += ds * load8(x + i);
    store8(dp + i, ds * s8);
  }
  float total = hsum8(acc), total_x = hsum8(accx);
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

}  // namespace cpu
}  // namespace posattn
