#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "cpu/blas.h"
#include "cpu/vec.h"

using namespace posattn::cpu;

TEST_CASE("vectorised exp is accurate, exact 0 at -inf, NaN stays NaN", "[vec]") {
  std::vector<float> x, y(2001);
  for (int i = 0; i <= 2000; ++i)
    x.push_back(-90.0f + 0.085f * static_cast<float>(i));  // up to 80: the sum stays finite
  const float total = exp_shift_sum(x.data(), y.data(), static_cast<int64_t>(x.size()), 0.0f);
  double ref_total = 0.0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double ref = std::exp(static_cast<double>(x[i]));
    ref_total += ref;
    if (x[i] >= -87.3365f) {  // normal float range: about 1 ulp
      REQUIRE(std::abs(y[i] - ref) <= 4e-7 * ref);
    } else {  // below it: exactly 0 (no denormals)
      REQUIRE(y[i] == 0.0f);
    }
  }
  CHECK(total == Approx(ref_total).epsilon(1e-5));
  float special[8] = {-std::numeric_limits<float>::infinity(), 0.0f,  1.0f,   -1.0f,
                      std::numeric_limits<float>::quiet_NaN(), 88.0f, -87.0f, -100.0f};
  float out[8];
  exp_shift_sum(special, out, 8, 0.0f);
  CHECK(out[0] == 0.0f);
  CHECK(out[1] == 1.0f);
  CHECK(out[2] == Approx(std::exp(1.0)).epsilon(1e-6));
  CHECK(std::isnan(out[4]));
  CHECK(out[7] == 0.0f);
}

TEST_CASE("row_max, sum and dot match plain loops (odd lengths)", "[vec]") {
  std::mt19937 rng(7);
  std::normal_distribution<float> dist;
  for (int64_t n : {1, 7, 8, 9, 31, 100}) {
    std::vector<float> a(n), b(n);
    for (auto& v : a) v = dist(rng);
    for (auto& v : b) v = dist(rng);
    float m = -std::numeric_limits<float>::infinity(), s = 0, d = 0;
    for (int64_t i = 0; i < n; ++i) {
      m = std::max(m, a[i]);
      s += a[i];
      d += a[i] * b[i];
    }
    CHECK(row_max(a.data(), n) == m);
    CHECK(sum(a.data(), n) == Approx(s).margin(1e-5));
    CHECK(dot(a.data(), b.data(), n) == Approx(d).margin(1e-5));
  }
  CHECK(row_max(static_cast<const float*>(nullptr), 0) == -std::numeric_limits<float>::infinity());
}

TEST_CASE("row_max is NaN when any element is NaN (vector lanes and tail)", "[vec]") {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float ninf = -std::numeric_limits<float>::infinity();
  for (int64_t n : {1, 7, 8, 9, 17}) {
    for (int64_t at = 0; at < n; ++at) {
      std::vector<float> a(n, ninf);
      std::vector<double> b(n, -std::numeric_limits<double>::infinity());
      a[at] = nan;
      b[at] = std::numeric_limits<double>::quiet_NaN();
      CHECK(std::isnan(row_max(a.data(), n)));
      CHECK(std::isnan(row_max(b.data(), n)));
      a[at] = 1.0f;  // without the NaN: the plain maximum
      CHECK(row_max(a.data(), n) == 1.0f);
    }
  }
}

template <typename T>
void check_gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, T beta) {
  std::mt19937 rng(static_cast<unsigned>(m * 131 + n * 7 + k));
  std::normal_distribution<double> dist;
  const int64_t lda = (ta ? m : k) + 3, ldb = (tb ? k : n) + 2, ldc = n + 1;
  std::vector<T> a((ta ? k : m) * lda), b((tb ? n : k) * ldb), c(m * ldc), c2;
  for (auto& v : a) v = static_cast<T>(dist(rng));
  for (auto& v : b) v = static_cast<T>(dist(rng));
  for (auto& v : c) v = static_cast<T>(dist(rng));
  c2 = c;
  const std::vector<T> c0 = c;
  const T alpha = static_cast<T>(0.75);
  gemm<T>(ta, tb, m, n, k, alpha, a.data(), lda, b.data(), ldb, beta, c.data(), ldc);
  gemm_portable<T>(ta, tb, m, n, k, alpha, a.data(), lda, b.data(), ldb, beta, c2.data(), ldc);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double ref = static_cast<double>(beta) * static_cast<double>(c0[i * ldc + j]);
      for (int64_t p = 0; p < k; ++p) {
        const double av = ta ? a[p * lda + i] : a[i * lda + p];
        const double bv = tb ? b[j * ldb + p] : b[p * ldb + j];
        ref += static_cast<double>(alpha) * av * bv;
      }
      REQUIRE(static_cast<double>(c[i * ldc + j]) == Approx(ref).margin(1e-4));
      REQUIRE(static_cast<double>(c2[i * ldc + j]) == Approx(ref).margin(1e-4));
    }
}

TEST_CASE("gemm (BLAS when torch exports it) agrees with the portable loops", "[blas]") {
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      check_gemm<float>(ta, tb, 5, 7, 3, 0.0f);
      check_gemm<float>(ta, tb, 33, 17, 32, 1.0f);
      check_gemm<double>(ta, tb, 4, 9, 6, 0.5);
      check_gemm<double>(ta, tb, 1, 1, 1, 1.0);
    }
}

TEST_CASE("portable gemm against a naive triple loop", "[blas]") {
  const int64_t m = 3, n = 4, k = 5;
  std::vector<double> a(m * k), b(k * n), c(m * n, 1.0);
  for (int64_t i = 0; i < m * k; ++i) a[i] = 0.5 * static_cast<double>(i) - 2.0;
  for (int64_t i = 0; i < k * n; ++i) b[i] = 1.0 / (1.0 + static_cast<double>(i));
  gemm_portable<double>(false, false, m, n, k, 2.0, a.data(), k, b.data(), n, 3.0, c.data(), n);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double ref = 3.0;
      for (int64_t p = 0; p < k; ++p) ref += 2.0 * a[i * k + p] * b[p * n + j];
      CHECK(c[i * n + j] == Approx(ref));
    }
}

TEST_CASE("softmax_backward_line matches plain loops (odd lengths)", "[vec]") {
  std::mt19937 rng(11);
  std::normal_distribution<float> dist;
  for (int64_t n : {1, 7, 8, 9, 33}) {
    std::vector<float> p(n), dp(n), x(n);
    for (auto* v : {&p, &dp, &x})
      for (auto& e : *v) e = dist(rng);
    std::vector<double> pd(p.begin(), p.end()), dpd(dp.begin(), dp.end()), xd(x.begin(), x.end());
    double s = 0, sx = 0;
    std::vector<double> expect(n);
    for (int64_t i = 0; i < n; ++i) {
      const double ds = pd[i] * (dpd[i] - 0.3);
      s += ds;
      sx += ds * xd[i];
      expect[i] = 0.5 * ds;
    }
    float sf, sxf;
    softmax_backward_line(p.data(), dp.data(), x.data(), 0.3f, 0.5f, n, sf, sxf);
    double sd, sxd;
    softmax_backward_line(pd.data(), dpd.data(), xd.data(), 0.3, 0.5, n, sd, sxd);
    CHECK(sf == Approx(s).margin(1e-4));
    CHECK(sxf == Approx(sx).margin(1e-4));
    CHECK(sd == Approx(s).margin(1e-12));
    CHECK(sxd == Approx(sx).margin(1e-12));
    for (int64_t i = 0; i < n; ++i) {
      CHECK(dp[i] == Approx(expect[i]).margin(1e-5));
      CHECK(dpd[i] == Approx(expect[i]).margin(1e-12));
    }
  }
}

TEST_CASE("FlushDenormals flushes denormal results while alive and restores the mode", "[vec]") {
  volatile float tiny = 1e-30f, small = 1e-10f;  // volatile: computed at run time
  const float before = tiny * small;             // 1e-40: a denormal
#if defined(__x86_64__) || defined(__i386__)
  CHECK(before > 0.0f);
  {
    const FlushDenormals flush;
    const float during = tiny * small;
    CHECK(during == 0.0f);
  }
#endif
  const float after = tiny * small;
  CHECK(after == before);
}

TEST_CASE("map_vec covers every length, touches nothing beyond n (float and double)", "[vec]") {
  auto check = [](auto zero) {
    using T = decltype(zero);
    constexpr int W = Vec<T>::W;
    for (int64_t n = 0; n <= 3 * W + 1; ++n) {
      std::vector<T> a(n + W, T(0)), y(n + W, T(-7));
      for (int64_t i = 0; i < n + W; ++i) a[i] = static_cast<T>(i) + T(0.5);
      const T* ap = a.data();
      T* yp = y.data();
      map_vec<T>(yp, n, [&](auto ld) { return ld(ap) * T(2) + ld(yp); });
      for (int64_t i = 0; i < n; ++i) REQUIRE(y[i] == (static_cast<T>(i) + T(0.5)) * T(2) - T(7));
      for (int64_t i = n; i < n + W; ++i) REQUIRE(y[i] == T(-7));  // past the end: untouched
    }
    // Masked-off lanes load as 0.
    std::vector<T> b(W, T(3));
    const auto v = vload_n<T>(b.data(), 1);
    CHECK(v[0] == T(3));
    for (int i = 1; i < W; ++i) CHECK(v[i] == T(0));
  };
  check(0.0f);
  check(0.0);
}
