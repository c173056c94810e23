// CPU entry points of posattn::relpos_attention: checks, outputs, and the
// kernels of this CPU's capability (cpu/kernels.h): the windowed kernels
// (relpos_window_cpu.inc) for small span boxes, the tiled kernels
// (relpos_tiled_cpu.inc) otherwise.
#include <ATen/Parallel.h>
#include <torch/library.h>
#include <torch/types.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "../common/tensor_args.h"
#include "../cpu/kernels.h"
#include "relpos_checks.h"
#include "relpos_cpu_problem.h"

namespace posattn {
namespace {

using namespace relpos_cpu;

// ---------------------------------------------------------------------------
// Operator entry points.
void check_cpu(const at::Tensor& q) {
  TORCH_CHECK_VALUE(q.device().is_cpu(), "relpos_attention: the CPU kernel got q on ", q.device());
  TORCH_CHECK_TYPE(q.scalar_type() == at::kFloat || q.scalar_type() == at::kDouble,
                   "relpos_attention (CPU): dtype must be float32 or float64, got ", q.scalar_type());
}

std::tuple<at::Tensor, at::Tensor> relpos_attention_cpu(
    const at::Tensor& q_in, const at::Tensor& k_in, const at::Tensor& v_in,
    const c10::optional<at::Tensor>& q_pos, const c10::optional<at::Tensor>& rel, at::IntArrayRef grid,
    const c10::optional<at::Tensor>& sigma, double threshold, c10::string_view span_mode, double scale,
    bool causal, const c10::optional<at::Tensor>& bias, at::OptionalIntArrayRef window,
    c10::string_view window_border, at::OptionalIntArrayRef window_right,
    at::OptionalIntArrayRef window_stride, at::OptionalIntArrayRef window_causal) {
  const RelposShape shape = check_relpos_inputs(
      q_in, k_in, v_in, q_pos, rel, grid, sigma, threshold, std::string(span_mode), scale, bias, window,
      std::string(window_border), window_right, window_stride, window_causal);
  check_cpu(q_in);
  if (shape.has_sigma) check_sigma_values_cpu(*sigma);
  const at::Tensor q = q_in.contiguous(), k = k_in.contiguous(), v = v_in.contiguous();
  const at::Tensor qp = opt_contig(q_pos), rl = opt_contig(rel), bs = opt_contig(bias);
  at::Tensor out = at::empty({shape.B, shape.H, shape.N, shape.Dv}, q.options());
  at::Tensor lse = at::empty({shape.B, shape.H, shape.N}, q.options());
  if (shape.B == 0 || shape.H == 0) return {out, lse};
  const Problem p = make_problem(shape, sigma, threshold, scale, causal);
  const cpu::Kernels& kernels = cpu::kernels();  // of this CPU's capability
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "relpos_attention_cpu", [&] {
    SpanTables<scalar_t> st;
    if (p.has_sigma) st = make_span_tables<scalar_t>(p, *sigma);
    const ForwardPtrs<scalar_t> a{q.data_ptr<scalar_t>(),    k.data_ptr<scalar_t>(),
                                  v.data_ptr<scalar_t>(),    ptr_or_null<scalar_t>(qp),
                                  ptr_or_null<scalar_t>(rl), ptr_or_null<scalar_t>(bs),
                                  out.data_ptr<scalar_t>(),  lse.data_ptr<scalar_t>()};
    cpu::typed<scalar_t>(kernels).relpos_forward(p, p.has_sigma ? &st : nullptr, a, kernels.use_window(p));
  });
  return {out, lse};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>
relpos_attention_backward_cpu(const at::Tensor& grad_out_in, const c10::optional<at::Tensor>& grad_lse,
                              const at::Tensor& q_in, const at::Tensor& k_in, const at::Tensor& v_in,
                              const c10::optional<at::Tensor>& q_pos, const c10::optional<at::Tensor>& rel,
                              at::IntArrayRef grid, const c10::optional<at::Tensor>& sigma, double threshold,
                              c10::string_view span_mode, double scale, bool causal, const at::Tensor& out_in,
                              const at::Tensor& lse_in, const c10::optional<at::Tensor>& bias,
                              at::OptionalIntArrayRef window, c10::string_view window_border,
                              at::OptionalIntArrayRef window_right, at::OptionalIntArrayRef window_stride,
                              at::OptionalIntArrayRef window_causal) {
  const RelposShape shape = check_relpos_inputs(
      q_in, k_in, v_in, q_pos, rel, grid, sigma, threshold, std::string(span_mode), scale, bias, window,
      std::string(window_border), window_right, window_stride, window_causal);
  check_relpos_backward_inputs(shape, q_in, grad_out_in, grad_lse, out_in, lse_in);
  check_cpu(q_in);
  if (shape.has_sigma) check_sigma_values_cpu(*sigma);
  const at::Tensor q = q_in.contiguous(), k = k_in.contiguous(), v = v_in.contiguous();
  const at::Tensor qp = opt_contig(q_pos), rl = opt_contig(rel), gl = opt_contig(grad_lse),
                   bs = opt_contig(bias);
  const at::Tensor gout = grad_out_in.contiguous(), out = out_in.contiguous(), lse = lse_in.contiguous();
  at::Tensor dq = at::empty_like(q);
  at::Tensor dk = at::zeros_like(k);
  at::Tensor dv = at::zeros_like(v);
  at::Tensor dqpos = shape.has_pos ? at::empty_like(q) : at::empty({0}, q.options());
  at::Tensor drel = shape.has_pos ? at::zeros_like(rl) : at::empty({0}, q.options());
  at::Tensor dsigma = shape.has_sigma ? at::zeros_like(*sigma) : at::empty({0}, q.options());
  at::Tensor dbias = shape.has_bias ? at::zeros_like(bs) : at::empty({0}, q.options());
  if (shape.B == 0 || shape.H == 0) return {dq, dk, dv, dqpos, drel, dsigma, dbias};
  const Problem p = make_problem(shape, sigma, threshold, scale, causal);
  // Enough tasks to keep every thread busy (see BackwardSplit).
  const cpu::Kernels& kernels = cpu::kernels();  // of this CPU's capability
  const bool window_kernel = kernels.use_window(p);
  const BackwardSplit split = choose_split(
      shape.B, shape.H, window_kernel ? kernels.window_units(p) : p.ntiles, at::get_num_threads());
  const int64_t ntasks = split.tasks(shape.H);
  const int64_t G = p.g.ndim;
  // One task per head (the usual split): its d rel / d bias go straight into
  // drel / dbias. Otherwise per-task partials, summed below (deterministic, no
  // atomics); at 64x64 with a small box the allocation, page faults and sum of
  // those (ntasks, U, D) buffers took a quarter of the backward.
  const bool direct = ntasks == shape.H;
  at::Tensor drel_part = !shape.has_pos ? at::Tensor()
                         : direct       ? drel
                                        : at::zeros({ntasks, p.U, shape.D}, q.options());
  at::Tensor dbias_part = !shape.has_bias ? at::Tensor()
                          : direct        ? dbias
                                          : at::zeros({ntasks, p.U}, q.options());
  at::Tensor dsig_part = at::zeros({ntasks, G}, q.options().dtype(at::kDouble));
  at::Tensor dk_acc = dk, dv_acc = dv;
  if (split.nparts > 1) {
    dk_acc = at::zeros({shape.B, shape.H, split.nparts, shape.N, shape.D}, q.options());
    dv_acc = at::zeros({shape.B, shape.H, split.nparts, shape.N, shape.Dv}, q.options());
  }
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "relpos_attention_backward_cpu", [&] {
    SpanTables<scalar_t> st;
    if (p.has_sigma) st = make_span_tables<scalar_t>(p, *sigma);
    BackwardPtrs<scalar_t> a{};
    a.q = q.data_ptr<scalar_t>();
    a.k = k.data_ptr<scalar_t>();
    a.v = v.data_ptr<scalar_t>();
    a.qpos = ptr_or_null<scalar_t>(qp);
    a.rel = ptr_or_null<scalar_t>(rl);
    a.bias = ptr_or_null<scalar_t>(bs);
    a.out = out.data_ptr<scalar_t>();
    a.lse = lse.data_ptr<scalar_t>();
    a.gout = gout.data_ptr<scalar_t>();
    a.glse = ptr_or_null<scalar_t>(gl);
    a.dq = dq.data_ptr<scalar_t>();
    a.dk_acc = dk_acc.data_ptr<scalar_t>();
    a.dv_acc = dv_acc.data_ptr<scalar_t>();
    a.dqpos = shape.has_pos ? dqpos.data_ptr<scalar_t>() : nullptr;
    a.drel_part = ptr_or_null<scalar_t>(drel_part);
    a.dbias_part = ptr_or_null<scalar_t>(dbias_part);
    a.dsig_part = dsig_part.data_ptr<double>();
    cpu::typed<scalar_t>(kernels).relpos_backward(p, p.has_sigma ? &st : nullptr, a, split, window_kernel);
  });
  if (split.nparts > 1) {
    dk.copy_(dk_acc.sum(2));
    dv.copy_(dv_acc.sum(2));
  }
  if (shape.has_pos && !direct) drel.copy_(drel_part.view({shape.H, ntasks / shape.H, p.U, shape.D}).sum(1));
  if (shape.has_bias && !direct) dbias.copy_(dbias_part.view({shape.H, ntasks / shape.H, p.U}).sum(1));
  if (shape.has_sigma) {
    // d sigma_{h,d} = sum_pairs dquad * d quad / d sigma = -(sum dquad x_d^2) / sigma^3.
    const at::Tensor acc = dsig_part.view({shape.H, ntasks / shape.H, G}).sum(1);
    const at::Tensor sig = sigma->to(at::kDouble);
    at::Tensor ds = at::zeros({shape.H, static_cast<int64_t>(grid.size())}, acc.options());
    for (int64_t d = 0; d < G; ++d) {
      const int64_t a = p.g.axis[d];
      if (p.g.n[d] > 1) ds.select(1, a).copy_(-acc.select(1, d) / sig.select(1, a).pow(3));
    }
    dsigma.copy_(ds);
  }
  return {dq, dk, dv, dqpos, drel, dsigma, dbias};
}

}  // namespace

TORCH_LIBRARY_IMPL(posattn, CPU, m) {
  m.impl("relpos_attention", &relpos_attention_cpu);
  m.impl("relpos_attention_backward", &relpos_attention_backward_cpu);
}

}  // namespace posattn
