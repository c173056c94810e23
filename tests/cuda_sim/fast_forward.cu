// Runs the fast path's forward (csrc/cuda/relpos_fast_forward.cuh) on one call on a
// grid of 1, 2 or 3 axes and checks it against a float64 host reference: out =
// softmax(logits) v and lse, with causal masking (token order) or without; logits =
// scale q k^T (POS 0, the FA2 control, on the same boxes) or scale (q k^T + q_pos rel[u])
// + bias[u], then minus the span's quad (SPAN 1: add) or times exp(-quad) (SPAN 2:
// multiply), quad = 0.5 sum_d (delta_d / (n_d - 1) / sigma_hd)^2; keys outside a
// query's window or span box (THRESHOLD > 0 with a span) masked. Inputs are uniform in
// [-1, 1), rounded to the element type first, so the error measures the kernel's own
// arithmetic. Built per element type and head dim (-DFAST_T=bf16|half, -DFAST_D=32|64|128).
//
//   fast_forward B H GRID CAUSAL SEED [POS SPAN BIAS [WINDOW THRESHOLD]]   (GRID: 130, 9x12, 5x6x7)
//
// WINDOW: "-" (none) or per axis of GRID kernel.stride.causal, joined by x, with "/shift"
// for NATTEN's border rule (e.g. 5.1.0x4.2.1/shift); the keys a query keeps per axis are
// axis_key_range's (core/grid_index.h), tested against posattn.reference by test_cuda_sim.py.
//
// prints "out_err E", "lse_err E" (the largest error relative to the largest |out|,
// and the largest absolute lse error) and "rows_written N_OK of N_ALL"; exit status
// 0, or 3 on a CUDA error. With FAST_BACKWARD=1 in the environment it then runs the
// backward's kernels (relpos_fast_backward.cuh: d q, d k, d v, d q_pos) from that forward
// with dO uniform, and prints "dq_err E" ... "dqpos_err E" against the float64
// reference (relative to each gradient's largest value; nan for a row not written).
// FAST_SMEM_OPTIN: the opt-in shared memory per block of the device whose layouts run
// (relpos_fast_common.cuh, smem_class_of; default sm_90's 232448).
// Run by tests/cuda_sim/test_fast_forward.py.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "cuda/relpos_fast_backward.cuh"
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
  if (argc != 6 && argc != 9 && argc != 11) {
    fprintf(stderr, "usage: %s B H GRID CAUSAL SEED [POS SPAN BIAS [WINDOW THRESHOLD]]\n", argv[0]);
    return 2;
  }
  const int B = atoi(argv[1]), H = atoi(argv[2]), causal = atoi(argv[4]);
  std::vector<int64_t> shape;
  for (const char* c = argv[3]; *c;) {
    char* end;
    shape.push_back(strtoll(c, &end, 10));
    c = *end == 'x' ? end + 1 : end;
  }
  const posattn::Grid g = posattn::squeeze_grid(shape.data(), static_cast<int>(shape.size()));
  const int G = g.ndim;
  int N = 1;
  for (int a = 0; a < G; ++a) N *= static_cast<int>(g.n[a]);
  const int pos = argc >= 9 ? atoi(argv[6]) : 0, span = argc >= 9 ? atoi(argv[7]) : 0;
  const int has_bias = argc >= 9 ? atoi(argv[8]) : 0;
  const double threshold = argc == 11 ? atof(argv[10]) : 0.0;
  posattn::RelposShape shape_s;
  if (argc == 11 && argv[9][0] != '-') {  // kernel.stride.causal per axis, x-separated, then /shift
    for (const char* c = argv[9]; *c && *c != '/';) {
      char* end;
      const int64_t kernel = strtoll(c, &end, 10), stride = strtoll(end + 1, &end, 10),
                    axis_causal = strtoll(end + 1, &end, 10);
      if (kernel < 1 || stride < 1 || stride > kernel) {  // (the op's checks: relpos_checks.cpp)
        fprintf(stderr, "WINDOW needs kernel >= 1 and 1 <= stride <= kernel per axis\n");
        return 2;
      }
      shape_s.window_left.push_back(kernel / 2);
      shape_s.window_right.push_back(kernel - 1 - kernel / 2);
      shape_s.window_stride.push_back(stride);
      shape_s.window_causal.push_back(axis_causal);
      c = *end == 'x' ? end + 1 : end;
    }
    shape_s.window_shift = strstr(argv[9], "/shift") != nullptr;
    if (shape_s.window_left.size() != shape.size()) {
      fprintf(stderr, "WINDOW needs one kernel.stride.causal per axis of GRID\n");
      return 2;
    }
  }
  rng_state = strtoull(argv[5], nullptr, 10) * 2654435761ull + 1;
  const size_t n_qkv = static_cast<size_t>(B) * H * N * kD;
  const int U = static_cast<int>(posattn::num_offsets(g.n, G));
  std::vector<T> q(n_qkv), k(n_qkv), v(n_qkv), qpos(pos ? n_qkv : 0),
      rel(pos ? static_cast<size_t>(H) * U * kD : 0);
  for (auto* x : {&q, &k, &v, &qpos, &rel})
    for (auto& e : *x) e = from_float<T>(uniform());
  // the offset terms: bias (H, U), the span's quad (H, U) from sigma_hd in [0.3, 1.3)
  std::vector<double> bias(static_cast<size_t>(H) * U, 0.0), quad(static_cast<size_t>(H) * U, 0.0);
  std::vector<double> sigma_in(static_cast<size_t>(H) * shape.size(), 1.0);  // (H, axes of GRID)
  for (int h = 0; h < H; ++h) {
    double sigma[posattn::kMaxGridDims];
    for (int a = 0; a < G; ++a) {
      sigma[a] = 0.8 + 0.5 * uniform();
      sigma_in[h * shape.size() + g.axis[a]] = sigma[a];
    }
    for (int u = 0; u < U; ++u) {
      if (has_bias) bias[h * U + u] = uniform();
      int64_t delta[posattn::kMaxGridDims];
      posattn::offset_of_row(u, g.n, G, delta);
      double sq = 0;
      for (int a = 0; a < G; ++a) {
        const double x = delta[a] / static_cast<double>(g.n[a] > 1 ? g.n[a] - 1 : 1) / sigma[a];
        sq += x * x;
      }
      if (span) quad[h * U + u] = 0.5 * sq;
    }
  }
  std::vector<float> add_tab(static_cast<size_t>(H) * U), mul_tab(static_cast<size_t>(H) * U);
  for (size_t i = 0; i < add_tab.size(); ++i) {
    add_tab[i] = static_cast<float>(bias[i] - (span == 1 ? quad[i] : 0.0));
    mul_tab[i] = static_cast<float>(std::exp(-quad[i]));
  }

  shape_s.B = B, shape_s.H = H, shape_s.N = N, shape_s.D = kD, shape_s.Dv = kD;
  shape_s.grid = shape;
  shape_s.has_pos = pos != 0;
  shape_s.has_bias = pos != 0 && has_bias != 0;  // (the launchers check the tables against it)
  shape_s.has_sigma = span != 0;
  shape_s.mode = span == 2 ? posattn::SpanMode::kMultiply : posattn::SpanMode::kAdd;
  posattn::RelposParams p =
      posattn::make_relpos_params(shape_s, threshold, 1.0 / std::sqrt(static_cast<double>(kD)), causal != 0);
  // which keys query coordinate c keeps along kept axis a: [lo, hi]
  const auto key_range = [&](int64_t h, int a, int64_t c, int64_t& lo, int64_t& hi) {
    int64_t half = g.n[a] - 1;
    if (span && threshold > 0)
      half = posattn::span_half_width(sigma_in[h * shape.size() + g.axis[a]], threshold, g.n[a]);
    posattn::axis_key_range(posattn::window_limit(p, a, half), c, lo, hi);
  };

  // outputs start as NaN, so that a row the kernel does not write shows
  const std::vector<T> out_init(n_qkv, from_float<T>(NAN));
  const std::vector<float> lse_init(static_cast<size_t>(B) * H * N, NAN);
  Device<T> dq(q), dk(k), dv(v), dout(out_init);
  Device<float> dlse(lse_init);
  Device<double> dsigma(sigma_in);
  posattn::RelposTensors<T> t;
  t.q = dq.p, t.k = dk.p, t.v = dv.p, t.out = dout.p, t.lse = dlse.p;
  const size_t optin = getenv("FAST_SMEM_OPTIN") != nullptr ? strtoull(getenv("FAST_SMEM_OPTIN"), nullptr, 10)
                                                            : posattn::relpos::cuda_fast::smem_budget(0);
  if (span) t.sigma = dsigma.p;
  if (pos) {
    Device<T> dqpos(qpos), drel(rel);
    Device<float> dadd(add_tab), dmul(mul_tab);
    t.qpos = dqpos.p, t.rel = drel.p;
    if (has_bias || span == 1) t.offset_add = dadd.p;
    if (span == 2) t.offset_mul = dmul.p;
    CHECK_CUDA((posattn::relpos::cuda_fast::launch_fast_forward_by_rank<T, kD, true>(p, t, optin, nullptr)));
    CHECK_CUDA(cudaDeviceSynchronize());
  } else {
    CHECK_CUDA((posattn::relpos::cuda_fast::launch_fast_forward_by_rank<T, kD, false>(p, t, optin, nullptr)));
    CHECK_CUDA(cudaDeviceSynchronize());
  }
  const std::vector<T> out = dout.get();
  const std::vector<float> lse = dlse.get();

  // FAST_BACKWARD=1: the backward's kernels (relpos_fast_backward.cuh) from this forward's
  // out and lse, with dO uniform and D_i = dO_i . out_i as the entry point computes it
  const bool backward = getenv("FAST_BACKWARD") != nullptr && atoi(getenv("FAST_BACKWARD")) != 0;
  std::vector<T> gout(backward ? n_qkv : 0);
  for (auto& e : gout) e = from_float<T>(uniform());
  std::vector<T> g_q, g_k, g_v, g_qpos;
  if (backward) {
    std::vector<float> rowd(static_cast<size_t>(B) * H * N);
    for (size_t r = 0; r < rowd.size(); ++r) {
      double d = 0;
      for (int e = 0; e < kD; ++e)
        d += static_cast<double>(to_float(gout[r * kD + e])) * to_float(out[r * kD + e]);
      rowd[r] = static_cast<float>(d);
    }
    Device<T> dgout(gout), gq(out_init), gk(out_init), gv(out_init), gqp(out_init), dqpos(qpos), drel(rel);
    Device<float> drowd(rowd), dadd(add_tab), dmul(mul_tab);
    t.gout = dgout.p, t.rowd = drowd.p, t.dq = gq.p, t.dk = gk.p, t.dv = gv.p;
    if (pos) {
      t.qpos = dqpos.p, t.rel = drel.p, t.dqpos = gqp.p;
      t.offset_add = has_bias || span == 1 ? dadd.p : nullptr;
      t.offset_mul = span == 2 ? dmul.p : nullptr;
      CHECK_CUDA(
          (posattn::relpos::cuda_fast::launch_fast_backward_by_rank<T, kD, true>(p, t, optin, nullptr)));
    } else {
      CHECK_CUDA(
          (posattn::relpos::cuda_fast::launch_fast_backward_by_rank<T, kD, false>(p, t, optin, nullptr)));
    }
    CHECK_CUDA(cudaDeviceSynchronize());
    g_q = gq.get(), g_k = gk.get(), g_v = gv.get();
    if (pos) g_qpos = gqp.get();
  }
  // the reference gradients (float64): dS = P (dP - D) d logit / d (q k)
  std::vector<double> r_q(backward ? n_qkv : 0), r_k(r_q.size()), r_v(r_q.size()),
      r_qpos(pos ? r_q.size() : 0), dp(N);

  double out_err = 0, out_max = 0, lse_err = 0;
  int rows_ok = 0;
  std::vector<double> w(N), ref(kD);
  int64_t ci[posattn::kMaxGridDims], cj[posattn::kMaxGridDims], delta[posattn::kMaxGridDims];
  for (int64_t bh = 0; bh < static_cast<int64_t>(B) * H; ++bh) {
    for (int i = 0; i < N; ++i) {
      const int keys = causal ? i + 1 : N;
      posattn::unravel_index(i, g.n, G, ci);
      int64_t lo[posattn::kMaxGridDims], hi[posattn::kMaxGridDims];
      for (int a = 0; a < G; ++a) key_range(bh % H, a, ci[a], lo[a], hi[a]);
      double mx = -INFINITY;
      for (int j = 0; j < keys; ++j) {
        posattn::unravel_index(j, g.n, G, cj);
        bool kept = true;
        for (int a = 0; a < G; ++a) kept = kept && lo[a] <= cj[a] && cj[a] <= hi[a];
        if (!kept) {
          w[j] = -INFINITY;
          continue;
        }
        double dot = 0;
        for (int d = 0; d < kD; ++d)
          dot += static_cast<double>(to_float(q[(bh * N + i) * kD + d])) * to_float(k[(bh * N + j) * kD + d]);
        w[j] = dot * p.scale;
        if (pos) {
          for (int a = 0; a < G; ++a) delta[a] = cj[a] - ci[a];
          const int64_t u = posattn::offset_row(delta, g.n, G);
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
      if (!backward) continue;
      double rd = 0;
      for (int j = 0; j < keys; ++j) {
        dp[j] = 0;
        for (int d = 0; d < kD; ++d)
          dp[j] +=
              static_cast<double>(to_float(gout[(bh * N + i) * kD + d])) * to_float(v[(bh * N + j) * kD + d]);
        rd += w[j] / sum * dp[j];
      }
      for (int j = 0; j < keys; ++j) {
        const double pr = w[j] / sum;
        if (pr == 0) continue;
        posattn::unravel_index(j, g.n, G, cj);
        for (int a = 0; a < G; ++a) delta[a] = cj[a] - ci[a];
        const int64_t u = posattn::offset_row(delta, g.n, G);
        const double ds =
            pr * (dp[j] - rd) * p.scale * (pos && span == 2 ? std::exp(-quad[(bh % H) * U + u]) : 1.0);
        for (int d = 0; d < kD; ++d) {
          r_q[(bh * N + i) * kD + d] += ds * to_float(k[(bh * N + j) * kD + d]);
          r_k[(bh * N + j) * kD + d] += ds * to_float(q[(bh * N + i) * kD + d]);
          r_v[(bh * N + j) * kD + d] += pr * to_float(gout[(bh * N + i) * kD + d]);
          if (pos)
            r_qpos[(bh * N + i) * kD + d] +=
                ds * to_float(rel[(static_cast<size_t>(bh % H) * U + u) * kD + d]);
        }
      }
    }
  }
  // NaN errors (an unwritten row) print as nan and fail the caller's comparison
  printf("out_err %.3e\nlse_err %.3e\nrows_written %d of %lld\n", out_err / out_max, lse_err, rows_ok,
         static_cast<long long>(B) * H * N);
  // the gradients' largest errors relative to their largest reference value (NaN: a row not written)
  const auto grad_err = [&](const char* name, const std::vector<T>& got, const std::vector<double>& want) {
    double err = 0, mx = 0;
    for (size_t e = 0; e < want.size(); ++e) {
      const double x = to_float(got[e]);
      err = std::isnan(x) ? NAN : std::fmax(err, std::fabs(x - want[e]));
      mx = std::fmax(mx, std::fabs(want[e]));
      if (std::isnan(err)) break;
    }
    printf("%s_err %.3e\n", name, err / mx);
  };
  if (backward) {
    grad_err("dq", g_q, r_q);
    grad_err("dk", g_k, r_k);
    grad_err("dv", g_v, r_v);
    if (pos) grad_err("dqpos", g_qpos, r_qpos);
  }
  return 0;
}
