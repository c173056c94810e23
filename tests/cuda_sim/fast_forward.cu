// Runs the fast path's forward (csrc/cuda/relpos_fast_forward.cuh) on one call on a
// 1-D grid and checks it against a float64 host reference: out = softmax(logits) v and
// lse, with causal masking or without; logits = scale q k^T (POS 0, the FA2 control)
// or scale (q k^T + q_pos rel[u]) + bias[u], then minus the span's quad (SPAN 1: add)
// or times exp(-quad) (SPAN 2: multiply), quad = 0.5 (delta / (N - 1) / sigma_h)^2.
// Inputs are uniform in [-1, 1), rounded to the element type first, so the error
// measures the kernel's own arithmetic. Built per element type and head dim
// (-DFAST_T=bf16|half, -DFAST_D=32|64|128).
//
//   fast_forward B H N CAUSAL SEED [POS SPAN BIAS]
//
// prints "out_err E", "lse_err E" (the largest error relative to the largest |out|,
// and the largest absolute lse error) and "rows_written N_OK of N_ALL"; exit status
// 0, or 3 on a CUDA error. Run by tests/cuda_sim/test_fast_forward.py.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "cuda/relpos_fast_forward.cuh"
#include "sim_host.h"

#if !defined(FAST_T) || !defined(FAST_D)
#error "build with -DFAST_T=bf16|half -DFAST_D=32|64|128"
#endif
#define bf16 __nv_bfloat16
#define half __half
using T = FAST_T;
constexpr int kD = FAST_D;

namespace {

using sim_host::Device;
using sim_host::from_float;
using sim_host::to_float;

uint64_t rng_state;
float uniform() {  // [-1, 1)
  rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
  return static_cast<float>(static_cast<int64_t>(rng_state >> 40) - (1 << 23)) / (1 << 23);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 6 && argc != 9) {
    fprintf(stderr, "usage: %s B H N CAUSAL SEED [POS SPAN BIAS]\n", argv[0]);
    return 2;
  }
  const int B = atoi(argv[1]), H = atoi(argv[2]), N = atoi(argv[3]), causal = atoi(argv[4]);
  const int pos = argc == 9 ? atoi(argv[6]) : 0, span = argc == 9 ? atoi(argv[7]) : 0;
  const int has_bias = argc == 9 ? atoi(argv[8]) : 0;
  rng_state = strtoull(argv[5], nullptr, 10) * 2654435761ull + 1;
  const size_t n_qkv = static_cast<size_t>(B) * H * N * kD;
  const int U = 2 * N - 1;
  std::vector<T> q(n_qkv), k(n_qkv), v(n_qkv), qpos(pos ? n_qkv : 0),
      rel(pos ? static_cast<size_t>(H) * U * kD : 0);
  for (auto* x : {&q, &k, &v, &qpos, &rel})
    for (auto& e : *x) e = from_float<T>(uniform());
  // the offset terms: bias (H, U), the span's quad (H, U) from sigma_h in [0.3, 1.3)
  std::vector<double> bias(static_cast<size_t>(H) * U, 0.0), quad(static_cast<size_t>(H) * U, 0.0);
  for (int h = 0; h < H; ++h) {
    const double sigma = 0.8 + 0.5 * uniform();
    for (int u = 0; u < U; ++u) {
      if (has_bias) bias[h * U + u] = uniform();
      const double x = (u - (N - 1)) / static_cast<double>(N > 1 ? N - 1 : 1) / sigma;
      if (span) quad[h * U + u] = 0.5 * x * x;
    }
  }
  std::vector<float> add_tab(static_cast<size_t>(H) * U), mul_tab(static_cast<size_t>(H) * U);
  for (size_t i = 0; i < add_tab.size(); ++i) {
    add_tab[i] = static_cast<float>(bias[i] - (span == 1 ? quad[i] : 0.0));
    mul_tab[i] = static_cast<float>(std::exp(-quad[i]));
  }

  posattn::RelposParams p;
  p.B = B, p.H = H, p.N = N, p.D = kD, p.Dv = kD, p.U = U;
  p.g.ndim = N > 1 ? 1 : 0;
  p.g.n[0] = N;
  p.causal = causal != 0;
  p.scale = 1.0 / std::sqrt(static_cast<double>(kD));

  // outputs start as NaN, so that a row the kernel does not write shows
  const std::vector<T> out_init(n_qkv, from_float<T>(NAN));
  const std::vector<float> lse_init(static_cast<size_t>(B) * H * N, NAN);
  Device<T> dq(q), dk(k), dv(v), dout(out_init);
  Device<float> dlse(lse_init);
  posattn::RelposTensors<T> t;
  t.q = dq.p, t.k = dk.p, t.v = dv.p, t.out = dout.p, t.lse = dlse.p;
  if (pos) {
    Device<T> dqpos(qpos), drel(rel);
    Device<float> dadd(add_tab), dmul(mul_tab);
    t.qpos = dqpos.p, t.rel = drel.p;
    if (has_bias || span == 1) t.offset_add = dadd.p;
    if (span == 2) t.offset_mul = dmul.p;
    CHECK_CUDA((posattn::relpos::cuda_fast::launch_fast_forward<T, kD, true>(p, t, nullptr)));
    CHECK_CUDA(cudaDeviceSynchronize());
  } else {
    CHECK_CUDA((posattn::relpos::cuda_fast::launch_fast_forward<T, kD, false>(p, t, nullptr)));
    CHECK_CUDA(cudaDeviceSynchronize());
  }
  const std::vector<T> out = dout.get();
  const std::vector<float> lse = dlse.get();

  double out_err = 0, out_max = 0, lse_err = 0;
  int rows_ok = 0;
  std::vector<double> w(N), ref(kD);
  for (int64_t bh = 0; bh < static_cast<int64_t>(B) * H; ++bh) {
    for (int i = 0; i < N; ++i) {
      const int keys = causal ? i + 1 : N;
      double mx = -INFINITY;
      for (int j = 0; j < keys; ++j) {
        double dot = 0;
        for (int d = 0; d < kD; ++d)
          dot += static_cast<double>(to_float(q[(bh * N + i) * kD + d])) * to_float(k[(bh * N + j) * kD + d]);
        w[j] = dot * p.scale;
        if (pos) {
          const int u = j - i + N - 1;
          double pdot = 0;
          for (int d = 0; d < kD; ++d)
            pdot += static_cast<double>(to_float(qpos[(bh * N + i) * kD + d])) *
                    to_float(rel[(static_cast<size_t>(bh % H) * U + u) * kD + d]);
          w[j] += pdot * p.scale + bias[(bh % H) * U + u];
          if (span == 1) w[j] -= quad[(bh % H) * U + u];
          if (span == 2) w[j] *= std::exp(-quad[(bh % H) * U + u]);
        }
        mx = std::fmax(mx, w[j]);
      }
      double sum = 0;
      for (int j = 0; j < keys; ++j) sum += (w[j] = std::exp(w[j] - mx));
      for (int d = 0; d < kD; ++d) ref[d] = 0;
      for (int j = 0; j < keys; ++j)
        for (int d = 0; d < kD; ++d) ref[d] += w[j] / sum * to_float(v[(bh * N + j) * kD + d]);
      bool row_ok = std::isfinite(lse[bh * N + i]);
      for (int d = 0; d < kD; ++d) {
        const double got = to_float(out[(bh * N + i) * kD + d]);
        row_ok = row_ok && std::isfinite(got);
        out_err = std::fmax(out_err, std::fabs(got - ref[d]));
        out_max = std::fmax(out_max, std::fabs(ref[d]));
      }
      lse_err = std::fmax(lse_err, std::fabs(lse[bh * N + i] - (mx + std::log(sum))));
      rows_ok += row_ok;
    }
  }
  // NaN errors (an unwritten row) print as nan and fail the caller's comparison
  printf("out_err %.3e\nlse_err %.3e\nrows_written %d of %lld\n", out_err / out_max, lse_err, rows_ok,
         static_cast<long long>(B) * H * N);
  return 0;
}
