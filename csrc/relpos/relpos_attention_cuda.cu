// CUDA kernels of relpos_attention: a general path, one thread block per
// (batch, head, query), exact for every head dim and dtype (float32, float64,
// float16, bfloat16; accumulation in float, or double for float64).
//
// It computes exactly what the CPU kernel computes (same index math from
// grid_index.h, same masking, span and lse conventions), in two passes over the
// keys (max/sum, then weights times values) so that memory stays O(block) per
// query; the backward recomputes the scores from the saved lse and accumulates
// d k, d v, d rel, d bias and d sigma with atomics into accumulation-type buffers.
//
// Not yet here: tiled tensor-core kernels and skipping key tiles outside the
// span box or window (this path visits every key and masks). Sigma values
// are not checked on CUDA (that would need a host synchronisation).
#include <ATen/AccumulateType.h>
#include <ATen/Dispatch.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>

#include "../common/grid_index.h"
#include "relpos_checks.h"
#include "relpos_tiling.h"

namespace posattn {
namespace {

constexpr int kThreads = 128;

// Everything a kernel needs to know about a call (passed by value).
struct CudaProblem {
  int64_t B = 0, H = 0, N = 0, D = 0, Dv = 0, G_in = 0;
  int ndim = 1;                       // axes of the squeezed grid
  int64_t n[kMaxGridDims] = {};       // their sizes
  int64_t axis[kMaxGridDims] = {};    // their index in the given grid (for sigma)
  int64_t rel_stride[kMaxGridDims] = {};
  int64_t win[kMaxGridDims] = {};     // window half widths of the kept axes (n - 1 without a window)
  bool has_pos = false, has_sigma = false, has_bias = false, has_box = false, causal = false, multiply = false;
  bool window_shift = false;
  double threshold = 0.0, scale = 1.0;
};

CudaProblem make_cuda_problem(const RelposShape& s, double threshold, double scale, bool causal) {
  CudaProblem p;
  p.B = s.B;
  p.H = s.H;
  p.N = s.N;
  p.D = s.D;
  p.Dv = s.Dv;
  p.G_in = static_cast<int64_t>(s.grid.size());
  const tiling::Grid g = tiling::squeeze_grid(s.grid.data(), static_cast<int>(s.grid.size()));
  p.ndim = g.ndim;
  int64_t stride = 1;
  for (int d = g.ndim - 1; d >= 0; --d) {
    p.n[d] = g.n[d];
    p.axis[d] = g.axis[d];
    p.rel_stride[d] = stride;
    stride *= 2 * g.n[d] - 1;
    p.win[d] = s.window.empty() ? g.n[d] - 1 : std::min<int64_t>(s.window[g.axis[d]], g.n[d] - 1);
  }
  p.has_pos = s.has_pos;
  p.has_sigma = s.has_sigma;
  p.has_bias = s.has_bias;
  p.has_box = threshold > 0.0 || !s.window.empty();
  p.window_shift = s.window_shift;
  p.causal = causal;
  p.multiply = s.mode == SpanMode::kMultiply;
  p.threshold = threshold;
  p.scale = scale;
  return p;
}

// Per-query state kept in shared memory by a block.
template <typename Acc>
struct QueryView {
  const Acc* q;      // (D)
  const Acc* qpos;   // (D) or unused
  int64_t coord[kMaxGridDims];
  Acc inv_sigma[kMaxGridDims];
  int64_t lo[kMaxGridDims], hi[kMaxGridDims];  // kept keys per axis (axis_key_range)
};

// The score of key j for the block's query i; false if the pair is masked.
// raw = scale * (q.k + qpos.rel) + bias (before the span), quad = the span's quadratic term.
template <typename T, typename Acc>
__device__ bool pair_score(const CudaProblem& p, const QueryView<Acc>& qv, int64_t i, int64_t j,
                           const T* __restrict__ kh, const T* __restrict__ relh, const T* __restrict__ biash,
                           Acc& s, Acc& raw, Acc& quad, int64_t& row) {
  if (p.causal && j > i) return false;
  int64_t cj[kMaxGridDims];
  unravel_index(j, p.n, p.ndim, cj);
  row = 0;
  quad = 0;
  for (int d = 0; d < p.ndim; ++d) {
    const int64_t delta = cj[d] - qv.coord[d];
    if (p.has_box && (cj[d] < qv.lo[d] || cj[d] > qv.hi[d])) return false;
    row += (delta + p.n[d] - 1) * p.rel_stride[d];
    if (p.has_sigma) {
      const Acc x = static_cast<Acc>(normalised_offset(delta, p.n[d])) * qv.inv_sigma[d];
      quad += Acc(0.5) * x * x;
    }
  }
  Acc dot = 0;
  const T* kj = kh + j * p.D;
  for (int64_t c = 0; c < p.D; ++c) dot += qv.q[c] * static_cast<Acc>(kj[c]);
  if (p.has_pos) {
    const T* r = relh + row * p.D;
    for (int64_t c = 0; c < p.D; ++c) dot += qv.qpos[c] * static_cast<Acc>(r[c]);
  }
  raw = static_cast<Acc>(p.scale) * dot;
  if (p.has_bias) raw += static_cast<Acc>(biash[row]);
  if (!p.has_sigma) {
    s = raw;
  } else if (p.multiply) {
    s = raw * exp(-quad);
  } else {
    s = raw - quad;
  }
  return true;
}

// Loads the block's query into shared memory and fills the QueryView.
template <typename T, typename Acc>
__device__ void load_query(const CudaProblem& p, int64_t bh, int64_t i, int64_t h, const T* q, const T* qpos,
                           const T* sigma, Acc* q_s, Acc* qpos_s, QueryView<Acc>& qv) {
  for (int64_t c = threadIdx.x; c < p.D; c += blockDim.x) {
    q_s[c] = static_cast<Acc>(q[(bh * p.N + i) * p.D + c]);
    if (p.has_pos) qpos_s[c] = static_cast<Acc>(qpos[(bh * p.N + i) * p.D + c]);
  }
  qv.q = q_s;
  qv.qpos = qpos_s;
  unravel_index(i, p.n, p.ndim, qv.coord);
  for (int d = 0; d < p.ndim; ++d) {
    qv.inv_sigma[d] = 0;
    AxisLimit lim;
    lim.n = p.n[d];
    lim.span = p.n[d] - 1;
    lim.win = p.win[d];
    lim.shift = p.window_shift;
    if (p.has_sigma) {
      const double sg = static_cast<double>(sigma[h * p.G_in + p.axis[d]]);
      qv.inv_sigma[d] = static_cast<Acc>(1.0 / sg);
      if (p.threshold > 0.0) lim.span = span_half_width(sg, p.threshold, p.n[d]);
    }
    axis_key_range(lim, qv.coord[d], qv.lo[d], qv.hi[d]);
  }
  __syncthreads();
}

template <typename Acc>
__device__ Acc block_reduce(Acc v, Acc* buf, bool is_max) {
  buf[threadIdx.x] = v;
  __syncthreads();
  for (int stride = blockDim.x / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) {
      const Acc o = buf[threadIdx.x + stride];
      // The max lets a NaN through (o != o), so that a NaN logit reaches the output.
      buf[threadIdx.x] = is_max ? ((o > buf[threadIdx.x] || o != o) ? o : buf[threadIdx.x]) : buf[threadIdx.x] + o;
    }
    __syncthreads();
  }
  const Acc r = buf[0];
  __syncthreads();
  return r;
}

template <typename T, typename Acc>
__global__ void relpos_forward_kernel(CudaProblem p, const T* __restrict__ q, const T* __restrict__ k,
                                      const T* __restrict__ v, const T* __restrict__ qpos,
                                      const T* __restrict__ rel, const T* __restrict__ sigma,
                                      const T* __restrict__ bias, T* __restrict__ out, T* __restrict__ lse) {
  extern __shared__ unsigned char smem_raw[];
  Acc* smem = reinterpret_cast<Acc*>(smem_raw);
  Acc* q_s = smem;                 // D
  Acc* qpos_s = q_s + p.D;         // D
  Acc* out_s = qpos_s + p.D;       // Dv
  Acc* red = out_s + p.Dv;         // blockDim
  Acc* w_s = red + blockDim.x;     // blockDim: weights of a chunk of keys
  const int64_t t = blockIdx.x;
  const int64_t i = t % p.N, bh = t / p.N, h = bh % p.H;
  QueryView<Acc> qv;
  load_query<T, Acc>(p, bh, i, h, q, qpos, sigma, q_s, qpos_s, qv);
  const T* kh = k + bh * p.N * p.D;
  const T* vh = v + bh * p.N * p.Dv;
  const int64_t U = num_offsets(p.n, p.ndim);
  const T* relh = p.has_pos ? rel + h * U * p.D : nullptr;
  const T* biash = p.has_bias ? bias + h * U : nullptr;
  const Acc neg_inf = -static_cast<Acc>(INFINITY);
  // pass 1: max and sum of exp over the kept keys
  Acc m = neg_inf, l = 0;
  for (int64_t j = threadIdx.x; j < p.N; j += blockDim.x) {
    Acc s, raw, quad;
    int64_t row;
    if (!pair_score<T, Acc>(p, qv, i, j, kh, relh, biash, s, raw, quad, row)) continue;
    if (s != s || m != m) {  // a NaN logit sticks: the row's lse and output are NaN, as in the reference
      m = s + m;
      l = m;
    } else if (s > m) {
      l = l * exp(m - s) + Acc(1);
      m = s;
    } else {
      l += exp(s - m);
    }
  }
  const Acc M = block_reduce<Acc>(m, red, true);
  const Acc L = block_reduce<Acc>(m == neg_inf ? Acc(0) : l * exp(m - M), red, false);
  const Acc lse_i = (M == neg_inf || L <= 0) ? neg_inf : M + log(L);
  for (int64_t c = threadIdx.x; c < p.Dv; c += blockDim.x) out_s[c] = 0;
  __syncthreads();
  // pass 2: out = sum_j exp(s_j - lse) v_j, a chunk of blockDim keys at a time
  if (lse_i != neg_inf) {
    for (int64_t j0 = 0; j0 < p.N; j0 += blockDim.x) {
      const int64_t j = j0 + threadIdx.x;
      Acc w = 0;
      if (j < p.N) {
        Acc s, raw, quad;
        int64_t row;
        if (pair_score<T, Acc>(p, qv, i, j, kh, relh, biash, s, raw, quad, row)) w = exp(s - lse_i);
      }
      w_s[threadIdx.x] = w;
      __syncthreads();
      const int64_t rest = p.N - j0, count = rest < static_cast<int64_t>(blockDim.x) ? rest : blockDim.x;
      for (int64_t c = threadIdx.x; c < p.Dv; c += blockDim.x) {
        Acc acc = out_s[c];
        for (int64_t e = 0; e < count; ++e) acc += w_s[e] * static_cast<Acc>(vh[(j0 + e) * p.Dv + c]);
        out_s[c] = acc;
      }
      __syncthreads();
    }
  }
  for (int64_t c = threadIdx.x; c < p.Dv; c += blockDim.x) out[(bh * p.N + i) * p.Dv + c] = static_cast<T>(out_s[c]);
  if (threadIdx.x == 0) lse[bh * p.N + i] = static_cast<T>(lse_i);
}

template <typename T, typename Acc>
__global__ void relpos_backward_kernel(CudaProblem p, const T* __restrict__ gout, const T* __restrict__ glse,
                                       const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                                       const T* __restrict__ qpos, const T* __restrict__ rel,
                                       const T* __restrict__ sigma, const T* __restrict__ bias,
                                       const T* __restrict__ out, const T* __restrict__ lse, T* __restrict__ dq,
                                       Acc* __restrict__ dk, Acc* __restrict__ dv, T* __restrict__ dqpos,
                                       Acc* __restrict__ drel, Acc* __restrict__ dbias, double* __restrict__ dsig) {
  extern __shared__ unsigned char smem_raw[];
  Acc* smem = reinterpret_cast<Acc*>(smem_raw);
  Acc* q_s = smem;                // D
  Acc* qpos_s = q_s + p.D;        // D
  Acc* go_s = qpos_s + p.D;       // Dv
  Acc* dq_s = go_s + p.Dv;        // D
  Acc* dqpos_s = dq_s + p.D;      // D
  Acc* red = dqpos_s + p.D;       // blockDim
  const int64_t t = blockIdx.x;
  const int64_t i = t % p.N, bh = t / p.N, h = bh % p.H;
  QueryView<Acc> qv;
  for (int64_t c = threadIdx.x; c < p.Dv; c += blockDim.x) go_s[c] = static_cast<Acc>(gout[(bh * p.N + i) * p.Dv + c]);
  for (int64_t c = threadIdx.x; c < p.D; c += blockDim.x) {
    dq_s[c] = 0;
    dqpos_s[c] = 0;
  }
  load_query<T, Acc>(p, bh, i, h, q, qpos, sigma, q_s, qpos_s, qv);
  const Acc neg_inf = -static_cast<Acc>(INFINITY);
  const Acc lse_i = static_cast<Acc>(lse[bh * p.N + i]);
  // D_i = dO_i . out_i (the softmax backward's row term)
  Acc part = 0;
  for (int64_t c = threadIdx.x; c < p.Dv; c += blockDim.x) part += go_s[c] * static_cast<Acc>(out[(bh * p.N + i) * p.Dv + c]);
  const Acc Di = block_reduce<Acc>(part, red, false);
  const Acc gl = glse != nullptr ? static_cast<Acc>(glse[bh * p.N + i]) : Acc(0);
  const int64_t U = num_offsets(p.n, p.ndim);
  const T* kh = k + bh * p.N * p.D;
  const T* vh = v + bh * p.N * p.Dv;
  const T* relh = p.has_pos ? rel + h * U * p.D : nullptr;
  Acc* dkh = dk + bh * p.N * p.D;
  Acc* dvh = dv + bh * p.N * p.Dv;
  Acc* drelh = p.has_pos ? drel + h * U * p.D : nullptr;
  const T* biash = p.has_bias ? bias + h * U : nullptr;
  Acc* dbiash = p.has_bias ? dbias + h * U : nullptr;
  const Acc scale = static_cast<Acc>(p.scale);
  if (lse_i != neg_inf) {
    for (int64_t j = threadIdx.x; j < p.N; j += blockDim.x) {
      Acc s, raw, quad;
      int64_t row;
      if (!pair_score<T, Acc>(p, qv, i, j, kh, relh, biash, s, raw, quad, row)) continue;
      const Acc prob = exp(s - lse_i);
      Acc dp = 0;
      for (int64_t c = 0; c < p.Dv; ++c) dp += go_s[c] * static_cast<Acc>(vh[j * p.Dv + c]);
      const Acc dS = prob * (dp - Di) + prob * gl;
      Acc dA = dS, dquad = -dS;
      if (p.has_sigma && p.multiply) {
        const Acc g = exp(-quad);
        dA = dS * g;
        dquad = -dS * s;
      }
      if (p.has_sigma) {  // d sigma_d += dquad * d quad / d sigma_d = dquad * (-x_d^2 / sigma_d^3)
        int64_t cj[kMaxGridDims];
        unravel_index(j, p.n, p.ndim, cj);
        for (int d = 0; d < p.ndim; ++d) {
          if (p.n[d] <= 1) continue;
          const Acc x = static_cast<Acc>(normalised_offset(cj[d] - qv.coord[d], p.n[d]));
          const Acc is = qv.inv_sigma[d];
          atomicAdd(dsig + h * p.G_in + p.axis[d], static_cast<double>(-dquad * x * x * is * is * is));
        }
      }
      if (p.has_bias) atomicAdd(dbiash + row, dA);
      const Acc dAs = dA * scale;
      for (int64_t c = 0; c < p.Dv; ++c) atomicAdd(dvh + j * p.Dv + c, prob * go_s[c]);
      for (int64_t c = 0; c < p.D; ++c) {
        atomicAdd(dq_s + c, dAs * static_cast<Acc>(kh[j * p.D + c]));
        atomicAdd(dkh + j * p.D + c, dAs * q_s[c]);
      }
      if (p.has_pos) {
        for (int64_t c = 0; c < p.D; ++c) {
          atomicAdd(dqpos_s + c, dAs * static_cast<Acc>(relh[row * p.D + c]));
          atomicAdd(drelh + row * p.D + c, dAs * qpos_s[c]);
        }
      }
    }
  }
  __syncthreads();
  for (int64_t c = threadIdx.x; c < p.D; c += blockDim.x) {
    dq[(bh * p.N + i) * p.D + c] = static_cast<T>(dq_s[c]);
    if (p.has_pos) dqpos[(bh * p.N + i) * p.D + c] = static_cast<T>(dqpos_s[c]);
  }
}

template <typename T>
const T* ptr_or_null(const at::Tensor& t) {
  return t.defined() && t.numel() > 0 ? t.data_ptr<T>() : nullptr;
}

at::Tensor opt_contig(const c10::optional<at::Tensor>& t) {
  return t.has_value() ? t->contiguous() : at::Tensor();
}

std::tuple<at::Tensor, at::Tensor> relpos_attention_cuda(const at::Tensor& q_in, const at::Tensor& k_in,
                                                         const at::Tensor& v_in,
                                                         const c10::optional<at::Tensor>& q_pos,
                                                         const c10::optional<at::Tensor>& rel, at::IntArrayRef grid,
                                                         const c10::optional<at::Tensor>& sigma, double threshold,
                                                         c10::string_view span_mode, double scale, bool causal,
                                                         const c10::optional<at::Tensor>& bias,
                                                         at::OptionalIntArrayRef window,
                                                         c10::string_view window_border) {
  const RelposShape shape = check_relpos_inputs(q_in, k_in, v_in, q_pos, rel, grid, sigma, threshold,
                                                std::string(span_mode), scale, bias, window, std::string(window_border));
  TORCH_CHECK_VALUE(q_in.is_cuda(), "relpos_attention (CUDA): q must be a CUDA tensor");
  const c10::cuda::CUDAGuard guard(q_in.device());
  const at::Tensor q = q_in.contiguous(), k = k_in.contiguous(), v = v_in.contiguous();
  const at::Tensor qp = opt_contig(q_pos), rl = opt_contig(rel), sg = opt_contig(sigma), bs = opt_contig(bias);
  at::Tensor out = at::empty({shape.B, shape.H, shape.N, shape.Dv}, q.options());
  at::Tensor lse = at::empty({shape.B, shape.H, shape.N}, q.options());
  if (shape.B == 0 || shape.H == 0) return {out, lse};
  const CudaProblem p = make_cuda_problem(shape, threshold, scale, causal);
  const int64_t blocks = shape.B * shape.H * shape.N;
  auto stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, q.scalar_type(), "relpos_attention_cuda", [&] {
    using acc_t = at::acc_type<scalar_t, true>;
    const size_t smem = sizeof(acc_t) * (2 * shape.D + shape.Dv + 2 * kThreads);
    relpos_forward_kernel<scalar_t, acc_t><<<blocks, kThreads, smem, stream>>>(
        p, q.data_ptr<scalar_t>(), k.data_ptr<scalar_t>(), v.data_ptr<scalar_t>(), ptr_or_null<scalar_t>(qp),
        ptr_or_null<scalar_t>(rl), ptr_or_null<scalar_t>(sg), ptr_or_null<scalar_t>(bs), out.data_ptr<scalar_t>(),
        lse.data_ptr<scalar_t>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return {out, lse};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>
relpos_attention_backward_cuda(const at::Tensor& grad_out_in, const c10::optional<at::Tensor>& grad_lse,
                               const at::Tensor& q_in, const at::Tensor& k_in, const at::Tensor& v_in,
                               const c10::optional<at::Tensor>& q_pos, const c10::optional<at::Tensor>& rel,
                               at::IntArrayRef grid, const c10::optional<at::Tensor>& sigma, double threshold,
                               c10::string_view span_mode, double scale, bool causal, const at::Tensor& out_in,
                               const at::Tensor& lse_in, const c10::optional<at::Tensor>& bias,
                               at::OptionalIntArrayRef window, c10::string_view window_border) {
  const RelposShape shape = check_relpos_inputs(q_in, k_in, v_in, q_pos, rel, grid, sigma, threshold,
                                                std::string(span_mode), scale, bias, window, std::string(window_border));
  check_relpos_backward_inputs(shape, q_in, grad_out_in, grad_lse, out_in, lse_in);
  TORCH_CHECK_VALUE(q_in.is_cuda(), "relpos_attention_backward (CUDA): q must be a CUDA tensor");
  const c10::cuda::CUDAGuard guard(q_in.device());
  const at::Tensor q = q_in.contiguous(), k = k_in.contiguous(), v = v_in.contiguous();
  const at::Tensor qp = opt_contig(q_pos), rl = opt_contig(rel), sg = opt_contig(sigma), gl = opt_contig(grad_lse),
                   bs = opt_contig(bias);
  const at::Tensor gout = grad_out_in.contiguous(), out = out_in.contiguous(), lse = lse_in.contiguous();
  at::Tensor dq = at::empty_like(q);
  at::Tensor dqpos = shape.has_pos ? at::empty_like(q) : at::empty({0}, q.options());
  const auto acc_dtype = q.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  at::Tensor dk_acc = at::zeros(k.sizes(), k.options().dtype(acc_dtype));
  at::Tensor dv_acc = at::zeros(v.sizes(), v.options().dtype(acc_dtype));
  at::Tensor drel_acc = shape.has_pos ? at::zeros(rl.sizes(), rl.options().dtype(acc_dtype)) : at::Tensor();
  at::Tensor dbias_acc = shape.has_bias ? at::zeros(bs.sizes(), bs.options().dtype(acc_dtype)) : at::Tensor();
  at::Tensor dsig_acc = shape.has_sigma ? at::zeros(sg.sizes(), sg.options().dtype(at::kDouble)) : at::Tensor();
  if (shape.B > 0 && shape.H > 0) {
    const CudaProblem p = make_cuda_problem(shape, threshold, scale, causal);
    const int64_t blocks = shape.B * shape.H * shape.N;
    auto stream = c10::cuda::getCurrentCUDAStream();
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, q.scalar_type(), "relpos_attention_backward_cuda", [&] {
      using acc_t = at::acc_type<scalar_t, true>;
      const size_t smem = sizeof(acc_t) * (4 * shape.D + shape.Dv + kThreads);
      relpos_backward_kernel<scalar_t, acc_t><<<blocks, kThreads, smem, stream>>>(
          p, gout.data_ptr<scalar_t>(), ptr_or_null<scalar_t>(gl), q.data_ptr<scalar_t>(), k.data_ptr<scalar_t>(),
          v.data_ptr<scalar_t>(), ptr_or_null<scalar_t>(qp), ptr_or_null<scalar_t>(rl), ptr_or_null<scalar_t>(sg),
          ptr_or_null<scalar_t>(bs), out.data_ptr<scalar_t>(), lse.data_ptr<scalar_t>(), dq.data_ptr<scalar_t>(), dk_acc.data_ptr<acc_t>(),
          dv_acc.data_ptr<acc_t>(), shape.has_pos ? dqpos.data_ptr<scalar_t>() : nullptr,
          shape.has_pos ? drel_acc.data_ptr<acc_t>() : nullptr,
          shape.has_bias ? dbias_acc.data_ptr<acc_t>() : nullptr, shape.has_sigma ? dsig_acc.data_ptr<double>() : nullptr);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
  } else {
    dq.zero_();
    if (shape.has_pos) dqpos.zero_();
  }
  at::Tensor dk = dk_acc.to(q.scalar_type());
  at::Tensor dv = dv_acc.to(q.scalar_type());
  at::Tensor drel = shape.has_pos ? drel_acc.to(q.scalar_type()) : at::empty({0}, q.options());
  at::Tensor dsigma = shape.has_sigma ? dsig_acc.to(q.scalar_type()) : at::empty({0}, q.options());
  at::Tensor dbias = shape.has_bias ? dbias_acc.to(q.scalar_type()) : at::empty({0}, q.options());
  return {dq, dk, dv, dqpos, drel, dsigma, dbias};
}

}  // namespace

TORCH_LIBRARY_IMPL(posattn, CUDA, m) {
  m.impl("relpos_attention", &relpos_attention_cuda);
  m.impl("relpos_attention_backward", &relpos_attention_backward_cuda);
}

}  // namespace posattn
