// Row-major GEMM for the CPU kernels: C = alpha * op(A) * op(B) + beta * C.
//
// The attention kernels call many small products (a query tile against a key
// chunk) from inside at::parallel_for, so each call must run single-threaded
// and cheaply. When the BLAS that PyTorch links (MKL on x86 wheels) exports the
// Fortran symbols sgemm_/dgemm_, we use them; they are declared weak so that a
// PyTorch build without them still loads this extension and falls back to the
// portable loops below (correct everywhere, slower).
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>

extern "C" {
void sgemm_(const char* transa, const char* transb, const int* m, const int* n, const int* k,
            const float* alpha, const float* a, const int* lda, const float* b, const int* ldb,
            const float* beta, float* c, const int* ldc) __attribute__((weak));
void dgemm_(const char* transa, const char* transb, const int* m, const int* n, const int* k,
            const double* alpha, const double* a, const int* lda, const double* b, const int* ldb,
            const double* beta, double* c, const int* ldc) __attribute__((weak));
}

namespace posattn {
namespace cpu {

// Portable row-major GEMM. Loops are ordered so that the innermost one runs
// over contiguous memory of C and B when possible (auto-vectorised at -O3).
template <typename T>
void gemm_portable(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, T alpha, const T* a,
                   int64_t lda, const T* b, int64_t ldb, T beta, T* c, int64_t ldc) {
  for (int64_t i = 0; i < m; ++i) {
    T* __restrict crow = c + i * ldc;
    if (beta == T(0)) {
      std::fill(crow, crow + n, T(0));
    } else if (beta != T(1)) {
      for (int64_t j = 0; j < n; ++j) crow[j] *= beta;
    }
    if (!trans_b) {
      for (int64_t p = 0; p < k; ++p) {
        const T aip = alpha * (trans_a ? a[p * lda + i] : a[i * lda + p]);
        const T* __restrict brow = b + p * ldb;
        for (int64_t j = 0; j < n; ++j) crow[j] += aip * brow[j];
      }
    } else {
      for (int64_t j = 0; j < n; ++j) {
        const T* __restrict brow = b + j * ldb;
        T sum = T(0);
        if (!trans_a) {
          const T* __restrict arow = a + i * lda;
          for (int64_t p = 0; p < k; ++p) sum += arow[p] * brow[p];
        } else {
          for (int64_t p = 0; p < k; ++p) sum += a[p * lda + i] * brow[p];
        }
        crow[j] += alpha * sum;
      }
    }
  }
}

inline bool fits_int(int64_t x) {
  return x <= std::numeric_limits<int>::max();
}

// True when the fast BLAS path is available for T.
template <typename T>
inline bool have_blas();
template <>
inline bool have_blas<float>() {
  return sgemm_ != nullptr;
}
template <>
inline bool have_blas<double>() {
  return dgemm_ != nullptr;
}

// Row-major C(m x n) = alpha * op(A) op(B) + beta * C, op(A) is m x k, op(B) is k x n.
// A row-major matrix is the transpose of the same memory read column-major, so
// we ask the column-major BLAS for C^T = op(B)^T op(A)^T.
template <typename T>
void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, T alpha, const T* a, int64_t lda,
          const T* b, int64_t ldb, T beta, T* c, int64_t ldc) {
  if (m <= 0 || n <= 0) return;
  if (k <= 0) {
    gemm_portable<T>(trans_a, trans_b, m, n, 0, alpha, a, lda, b, ldb, beta, c, ldc);
    return;
  }
  const bool small_enough =
      fits_int(m) && fits_int(n) && fits_int(k) && fits_int(lda) && fits_int(ldb) && fits_int(ldc);
  if (have_blas<T>() && small_enough) {
    const char ta = trans_a ? 'T' : 'N';
    const char tb = trans_b ? 'T' : 'N';
    const int im = static_cast<int>(m), in = static_cast<int>(n), ik = static_cast<int>(k);
    // Leading dimensions must be at least the row length BLAS expects, even for a
    // single row where the stride is never used.
    const int ilda = static_cast<int>(std::max<int64_t>(lda, trans_a ? m : k));
    const int ildb = static_cast<int>(std::max<int64_t>(ldb, trans_b ? k : n));
    const int ildc = static_cast<int>(std::max<int64_t>(ldc, n));
    if constexpr (sizeof(T) == sizeof(float)) {
      sgemm_(&tb, &ta, &in, &im, &ik, &alpha, b, &ildb, a, &ilda, &beta, c, &ildc);
    } else {
      dgemm_(&tb, &ta, &in, &im, &ik, &alpha, b, &ildb, a, &ilda, &beta, c, &ildc);
    }
    return;
  }
  gemm_portable<T>(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

}  // namespace cpu
}  // namespace posattn
