// The CPU entry points of relpos_attention, its backward and its plan: the
// checked call, its plan (cpu::plan_relpos: the windowed kernels for small boxes
// of keys, the tiled ones otherwise, compiled for this CPU's capability), the
// outputs, the RelposTensors the kernels take (cpu/relpos_tiled.inc,
// cpu/relpos_window.inc), and the reduction of the backward's per-task partials.
#include <ATen/Parallel.h>
#include <torch/library.h>
#include <torch/types.h>

#include <string>

#include "../cpu/kernels.h"
#include "relpos_args.h"
#include "relpos_packed_cpu.h"

namespace posattn {
namespace relpos {
namespace {

using namespace cpu_kernels;

void check_cpu(const at::Tensor& q) {
  TORCH_CHECK_VALUE(q.device().is_cpu(), "relpos_attention: the CPU kernel got q on ", q.device());
  TORCH_CHECK_TYPE(q.scalar_type() == at::kFloat || q.scalar_type() == at::kDouble,
                   "relpos_attention (CPU): dtype must be float32 or float64, got ", q.scalar_type());
}

// The call's Problem and the plan of POSATTN_CPU_KERNEL for it.
CpuPlan plan_call(const Problem& p) {
  return cpu::plan_relpos(
      p, kernel_request("POSATTN_CPU_KERNEL", KernelRequest::kTiled, KernelRequest::kWindow));
}

std::tuple<at::Tensor, at::Tensor> relpos_attention_cpu(POSATTN_RELPOS_HEAD_PARAMS,
                                                        POSATTN_RELPOS_TAIL_PARAMS) {
  const RelposCall c = checked_call(POSATTN_RELPOS_ARGS);
  check_cpu(q);
  const RelposShape& s = c.shape;
  if (s.has_sigma) check_sigma_values_cpu(c.sigma);
  if (s.packed()) return packed_forward_cpu(c);
  at::Tensor out = at::empty({s.B, s.H, s.N, s.Dv}, c.q.options());
  at::Tensor lse = at::empty({s.B, s.H, s.N}, c.q.options());
  if (s.B == 0 || s.H == 0) return {out, lse};
  const Problem p = make_problem(c.params, c.sigma);
  const CpuPlan plan = plan_call(p);
  AT_DISPATCH_FLOATING_TYPES(c.q.scalar_type(), "relpos_attention_cpu", [&] {
    SpanTables<scalar_t> st;
    if (p.has_sigma) st = make_span_tables<scalar_t>(p, c.sigma);
    RelposTensors<scalar_t> t = relpos_inputs<scalar_t>(c);
    t.out = ptr_or_null<scalar_t>(out);
    t.lse = ptr_or_null<scalar_t>(lse);
    cpu::typed<scalar_t>(cpu::kernels()).relpos_forward(p, p.has_sigma ? &st : nullptr, t, plan.window);
  });
  return {out, lse};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>
relpos_attention_backward_cpu(const at::Tensor& grad_out, const c10::optional<at::Tensor>& grad_lse,
                              POSATTN_RELPOS_HEAD_PARAMS, const at::Tensor& out, const at::Tensor& lse,
                              POSATTN_RELPOS_TAIL_PARAMS) {
  const RelposCall c = checked_call(POSATTN_RELPOS_ARGS);
  const RelposShape& s = c.shape;
  check_relpos_backward_inputs(s, q, grad_out, grad_lse, out, lse);
  check_cpu(q);
  if (s.has_sigma) check_sigma_values_cpu(c.sigma);
  const at::Tensor gl = opt_contig(grad_lse);
  const at::Tensor gout = grad_out.contiguous(), out_c = out.contiguous(), lse_c = lse.contiguous();
  if (s.packed()) {
    const auto [dq, dk, dv, dqpos, drel, dsigma, dbias] = packed_backward_cpu(c, gout, gl, out_c, lse_c);
    return {
        dq, dk, dv, or_empty(dqpos, c.q), or_empty(drel, c.q), or_empty(dsigma, c.q), or_empty(dbias, c.q)};
  }
  at::Tensor dq = at::empty_like(c.q), dk = at::zeros_like(c.k), dv = at::zeros_like(c.v);
  at::Tensor dqpos = empty_if(s.has_pos, c.q);
  at::Tensor drel = s.has_pos ? at::zeros_like(c.rel) : at::Tensor();
  at::Tensor dbias = s.has_bias ? at::zeros_like(c.bias) : at::Tensor();
  at::Tensor dsigma = s.has_sigma ? at::zeros_like(c.sigma) : at::Tensor();
  if (s.B > 0 && s.H > 0) {
    const Problem p = make_problem(c.params, c.sigma);
    const CpuPlan plan = plan_call(p);
    const cpu::Kernels& kernels = cpu::kernels();
    // Enough tasks to keep every thread busy (see BackwardSplit).
    const BackwardSplit split =
        choose_split(s.B, s.H, plan.window ? kernels.window_units(p) : p.ntiles, at::get_num_threads());
    const int64_t ntasks = split.tasks(s.H);
    const int64_t G = p.g.ndim;
    // One task per head (the usual split): its d rel / d bias go straight into
    // drel / dbias. Otherwise per-task partials, summed below (deterministic, no
    // atomics); at 64x64 with a small box the allocation, page faults and sum of
    // those (ntasks, U, D) buffers took a quarter of the backward.
    const bool direct = ntasks == s.H;
    const at::Tensor drel_part = !s.has_pos ? at::Tensor()
                                 : direct   ? drel
                                            : at::zeros({ntasks, p.U, s.D}, c.q.options());
    const at::Tensor dbias_part = !s.has_bias ? at::Tensor()
                                  : direct    ? dbias
                                              : at::zeros({ntasks, p.U}, c.q.options());
    const at::Tensor dsig_part = at::zeros({ntasks, G}, c.q.options().dtype(at::kDouble));
    at::Tensor dk_acc = dk, dv_acc = dv;
    if (split.nparts > 1) {
      dk_acc = at::zeros({split.nparts, s.B, s.H, s.N, s.D}, c.q.options());
      dv_acc = at::zeros({split.nparts, s.B, s.H, s.N, s.Dv}, c.q.options());
    }
    AT_DISPATCH_FLOATING_TYPES(c.q.scalar_type(), "relpos_attention_backward_cpu", [&] {
      SpanTables<scalar_t> st;
      if (p.has_sigma) st = make_span_tables<scalar_t>(p, c.sigma);
      RelposTensors<scalar_t> t = relpos_inputs<scalar_t>(c);
      t.out = ptr_or_null<scalar_t>(out_c);
      t.lse = ptr_or_null<scalar_t>(lse_c);
      t.gout = ptr_or_null<const scalar_t>(gout);
      t.glse = ptr_or_null<const scalar_t>(gl);
      t.dq = ptr_or_null<scalar_t>(dq);
      t.dk = ptr_or_null<scalar_t>(dk_acc);
      t.dv = ptr_or_null<scalar_t>(dv_acc);
      t.dqpos = ptr_or_null<scalar_t>(dqpos);
      t.drel = ptr_or_null<scalar_t>(drel_part);
      t.dbias = ptr_or_null<scalar_t>(dbias_part);
      t.dsig_part = ptr_or_null<double>(dsig_part);
      cpu::typed<scalar_t>(kernels).relpos_backward(p, p.has_sigma ? &st : nullptr, t, split, plan.window);
    });
    if (split.nparts > 1) {
      dk.copy_(dk_acc.sum(0));
      dv.copy_(dv_acc.sum(0));
    }
    if (s.has_pos && !direct) drel.copy_(drel_part.view({s.H, ntasks / s.H, p.U, s.D}).sum(1));
    if (s.has_bias && !direct) dbias.copy_(dbias_part.view({s.H, ntasks / s.H, p.U}).sum(1));
    if (s.has_sigma) {
      // d sigma_{h,d} = sum_pairs dquad * d quad / d sigma = -(sum dquad x_d^2) / sigma^3.
      const at::Tensor acc = dsig_part.view({s.H, ntasks / s.H, G}).sum(1);
      const at::Tensor sig = c.sigma.to(at::kDouble);
      at::Tensor ds = at::zeros({s.H, static_cast<int64_t>(grid.size())}, acc.options());
      for (int64_t d = 0; d < G; ++d) {
        const int64_t a = p.g.axis[d];
        if (p.g.n[d] > 1) ds.select(1, a).copy_(-acc.select(1, d) / sig.select(1, a).pow(3));
      }
      dsigma.copy_(ds);
    }
  }
  return {dq, dk, dv, or_empty(dqpos, c.q), or_empty(drel, c.q), or_empty(dsigma, c.q), or_empty(dbias, c.q)};
}

std::string relpos_plan_cpu(POSATTN_RELPOS_HEAD_PARAMS, POSATTN_RELPOS_TAIL_PARAMS,
                            bool /*backward: the same kernels as the forward*/) {
  const RelposCall c = checked_call(POSATTN_RELPOS_ARGS);
  TORCH_CHECK_VALUE(q.device().is_cpu(), "relpos_plan: the CPU kernel got q on ", q.device());
  if (c.shape.has_sigma) check_sigma_values_cpu(c.sigma);
  if (c.shape.packed()) return packed_plan_cpu(c);
  return describe(plan_call(make_problem(c.params, c.sigma)));
}

}  // namespace

TORCH_LIBRARY_IMPL(posattn, CPU, m) {
  m.impl("relpos_attention", &relpos_attention_cpu);
  m.impl("relpos_attention_backward", &relpos_attention_backward_cpu);
  m.impl("relpos_plan", &relpos_plan_cpu);
}

}  // namespace relpos
}  // namespace posattn
