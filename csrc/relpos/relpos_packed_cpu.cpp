// Packed relpos_attention calls on the CPU: each sample becomes a call of its own grid (a
// Problem with tok_stride = T, its tensors at its first token, its rows of the max_grid
// offset tables gathered into a table of its own), the kernels run every sample's tasks in
// one pool (cpu/relpos_packed.h), and the backward's partial sums are reduced per sample and
// then added into d rel / d bias / d sigma in sample order (fixed, no atomics).
#include "relpos_packed_cpu.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <vector>

#include "../cpu/kernels.h"

namespace posattn {
namespace relpos {
namespace {

using namespace cpu_kernels;

// A packed call's samples as the kernels see them, dtype independent: their first token,
// Problem, plan and rows of the offset tables.
struct PackedLayout {
  int64_t S = 0, T = 0, used = 0;  // samples, tokens of q, tokens of the samples (the rest is tail)
  std::vector<int64_t> first;      // (S) first token
  std::vector<Problem> problems;   // (S) each sample's own grid
  std::vector<CpuPlan> plans;
  std::vector<std::vector<int64_t>> rows;  // (S) the max_grid table's row of each of its offsets
  // (S) first row of its (H, U_s) table among the gathered ones, which samples of one shape share;
  // table_rows: their rows in all; table_owner: the samples whose shape came first, one per table
  std::vector<int64_t> table_off, table_owner;
  int64_t table_rows = 0;
  std::vector<int64_t> part_off;  // (S + 1) first of its (tasks, U_s) partial rows (backward)
  std::vector<int64_t> sig_off;   // (S + 1) first of its (tasks, G_s) d sigma partials
  std::vector<BackwardSplit> splits;
  std::vector<double> cost;
  int64_t max_parts = 1;
};

// The rows of the max_grid table (extents m) that hold the offsets of a grid of extents n, in
// the order of that grid's own table (row-major over 2 n_d - 1; size-1 axes have offset 0).
std::vector<int64_t> offset_rows(const std::vector<int64_t>& n, const std::vector<int64_t>& m) {
  const int G = static_cast<int>(n.size());
  std::vector<int64_t> stride(G);
  int64_t s = 1, U = 1;
  for (int d = G - 1; d >= 0; --d) {
    stride[d] = s;
    s *= 2 * m[d] - 1;
    U *= 2 * n[d] - 1;
  }
  std::vector<int64_t> rows(U);
  std::vector<int64_t> u(G, 0);  // the offset's index per axis, delta_d + n_d - 1
  for (int64_t i = 0; i < U; ++i) {
    int64_t row = 0;
    for (int d = 0; d < G; ++d) row += (u[d] - n[d] + m[d]) * stride[d];
    rows[i] = row;
    for (int d = G - 1; d >= 0 && ++u[d] == 2 * n[d] - 1; --d) u[d] = 0;
  }
  return rows;
}

// Keys a query of the sample keeps, on average over the heads (for the order of the tasks).
double mean_keys(const Problem& p) {
  double keys = 0.0;
  for (int64_t h = 0; h < p.H; ++h) {
    double k = 1.0;
    for (int d = 0; d < p.g.ndim; ++d) {
      int64_t w = p.g.n[d];
      if (p.has_box) {
        const AxisLimit& lim = p.limits_of(h)[d];
        w = std::min({w, 2 * lim.span + 1, lim.left + lim.right + 1});
      }
      k *= static_cast<double>(w);
    }
    keys += k;
  }
  keys /= static_cast<double>(std::max<int64_t>(1, p.H));
  return p.causal ? 0.5 * keys + 0.5 : keys;
}

// (the values of packed_offsets / packed_shapes checked, and H > 0)
PackedLayout make_layout(const RelposCall& c) {
  const RelposShape& s = c.shape;
  PackedLayout L;
  L.S = s.packed_samples;
  L.T = s.N;
  const int64_t G = static_cast<int64_t>(s.grid.size());
  const int32_t* off = c.packed_offsets.data_ptr<int32_t>();
  const int32_t* shp = c.packed_shapes.data_ptr<int32_t>();
  L.used = off[L.S];
  const cpu::Kernels& kernels = cpu::kernels();
  const KernelRequest request =
      kernel_request("POSATTN_CPU_KERNEL", KernelRequest::kTiled, KernelRequest::kWindow);
  std::map<std::vector<int64_t>, int64_t> table_of_shape;
  double total = 0.0;
  for (int64_t i = 0; i < L.S; ++i) {
    RelposShape one = s;
    one.B = 1;
    one.N = off[i + 1] - off[i];
    one.grid.assign(shp + i * G, shp + (i + 1) * G);
    one.packed_samples = 0;
    RelposParams params = make_relpos_params(one, c.params.threshold, c.params.scale, c.params.causal);
    params.tok_stride = L.T;
    L.first.push_back(off[i]);
    L.problems.push_back(make_problem(params, c.sigma));
    L.plans.push_back(cpu::plan_relpos(L.problems.back(), request));
    L.rows.push_back(offset_rows(one.grid, s.grid));
    const auto [at, first] = table_of_shape.emplace(one.grid, L.table_rows);
    L.table_off.push_back(at->second);
    if (first) {
      L.table_owner.push_back(i);
      L.table_rows += s.H * static_cast<int64_t>(L.rows.back().size());
    }
    L.cost.push_back(static_cast<double>(one.N) * (mean_keys(L.problems.back()) + 16.0));
    total += L.cost.back();
  }
  // Each sample's share of about two tasks per thread (a single sample: choose_split's split).
  const double target = 2.0 * static_cast<double>(at::get_num_threads());
  L.part_off.assign(L.S + 1, 0);
  L.sig_off.assign(L.S + 1, 0);
  for (int64_t i = 0; i < L.S; ++i) {
    const Problem& p = L.problems[i];
    const int64_t units = L.plans[i].window ? kernels.window_units(p) : p.ntiles;
    BackwardSplit split;
    const double want = std::ceil(target * L.cost[i] / (total * static_cast<double>(s.H)) - 1e-9);
    split.nparts = std::max<int64_t>(1, std::min<int64_t>(units, static_cast<int64_t>(want)));
    L.splits.push_back(split);
    L.max_parts = std::max(L.max_parts, split.nparts);
    const int64_t tasks = split.tasks(s.H);
    L.part_off[i + 1] = L.part_off[i] + tasks * p.U;
    L.sig_off[i + 1] = L.sig_off[i] + tasks * p.g.ndim;
  }
  return L;
}

// Each sample shape's rows of an (H, U, width) table, one (H, U_s, width) table after another.
at::Tensor gather_tables(const PackedLayout& L, const at::Tensor& table, int64_t width) {
  const int64_t H = table.size(0), U = table.size(1);
  const int64_t tables = static_cast<int64_t>(L.table_owner.size());
  at::Tensor out = at::empty({L.table_rows, width}, table.options());
  AT_DISPATCH_FLOATING_TYPES(table.scalar_type(), "packed_gather_tables", [&] {
    const scalar_t* src = table.data_ptr<scalar_t>();
    scalar_t* dst = out.data_ptr<scalar_t>();
    at::parallel_for(0, tables * H, 1, [&](int64_t begin, int64_t end) {
      for (int64_t th = begin; th < end; ++th) {
        const int64_t i = L.table_owner[th / H], h = th % H;
        const std::vector<int64_t>& rows = L.rows[i];
        const int64_t Us = static_cast<int64_t>(rows.size());
        scalar_t* d = dst + (L.table_off[i] + h * Us) * width;
        for (int64_t u = 0; u < Us; ++u) std::copy_n(src + (h * U + rows[u]) * width, width, d + u * width);
      }
    });
  });
  return out;
}

// grad (H, U, width) += each sample's (H, U_s, width) gradient, its parts summed first, the
// samples in order (each head's rows by one thread: a fixed order, no atomics).
void scatter_tables(const PackedLayout& L, const at::Tensor& parts, at::Tensor& grad, int64_t width) {
  const int64_t H = grad.size(0), U = grad.size(1);
  std::vector<at::Tensor> per_sample(L.S);
  for (int64_t i = 0; i < L.S; ++i) {
    const int64_t Us = static_cast<int64_t>(L.rows[i].size()), np = L.splits[i].nparts;
    at::Tensor mine = parts.narrow(0, L.part_off[i], L.part_off[i + 1] - L.part_off[i]);
    // as a single call sums them (relpos_cpu.cpp): over the parts of each head
    per_sample[i] = np > 1 ? mine.view({H, np, Us, width}).sum(1).contiguous() : mine.view({H, Us, width});
  }
  AT_DISPATCH_FLOATING_TYPES(grad.scalar_type(), "packed_scatter_tables", [&] {
    scalar_t* dst = grad.data_ptr<scalar_t>();
    at::parallel_for(0, H, 1, [&](int64_t begin, int64_t end) {
      for (int64_t h = begin; h < end; ++h)
        for (int64_t i = 0; i < L.S; ++i) {
          const std::vector<int64_t>& rows = L.rows[i];
          const int64_t Us = static_cast<int64_t>(rows.size());
          const scalar_t* src = per_sample[i].data_ptr<scalar_t>() + h * Us * width;
          for (int64_t u = 0; u < Us; ++u) {
            scalar_t* d = dst + (h * U + rows[u]) * width;
            const scalar_t* g = src + u * width;
            for (int64_t j = 0; j < width; ++j) d[j] += g[j];
          }
        }
    });
  });
}

template <typename T>
std::vector<PackedSample<T>> make_samples(const PackedLayout& L, const RelposCall& c,
                                          const at::Tensor& rel_tab, const at::Tensor& bias_tab) {
  const RelposShape& s = c.shape;
  const int64_t D = s.D;
  std::vector<PackedSample<T>> out(L.S);
  const RelposTensors<T> all = relpos_inputs<T>(c);
  for (int64_t i = 0; i < L.S; ++i) {
    PackedSample<T>& ps = out[i];
    ps.p = L.problems[i];
    if (ps.p.has_sigma) ps.st = make_span_tables<T>(ps.p, c.sigma);
    ps.split = L.splits[i];
    ps.window = L.plans[i].window;
    ps.cost = L.cost[i];
    const int64_t f = L.first[i];
    RelposTensors<T>& t = ps.t;
    t.q = all.q + f * D;
    t.k = all.k + f * D;
    t.v = all.v + f * s.Dv;
    if (s.has_pos) {
      t.qpos = all.qpos + f * D;
      t.rel = rel_tab.data_ptr<T>() + L.table_off[i] * D;
    }
    if (s.has_bias) t.bias = bias_tab.data_ptr<T>() + L.table_off[i];
  }
  return out;
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> packed_forward_cpu(const RelposCall& c) {
  const RelposShape& s = c.shape;
  at::Tensor out = at::empty({1, s.H, s.N, s.Dv}, c.q.options());
  at::Tensor lse = at::empty({1, s.H, s.N}, c.q.options());
  check_packed_values_cpu(s, c.packed_offsets, c.packed_shapes);
  if (s.H == 0) return {out, lse};
  const PackedLayout L = make_layout(c);
  out.narrow(2, L.used, L.T - L.used).zero_();  // tail padding: output 0, lse -inf
  lse.narrow(2, L.used, L.T - L.used).fill_(-std::numeric_limits<double>::infinity());
  const at::Tensor rel_tab = s.has_pos ? gather_tables(L, c.rel, s.D) : at::Tensor();
  const at::Tensor bias_tab = s.has_bias ? gather_tables(L, c.bias.unsqueeze(-1), 1) : at::Tensor();
  AT_DISPATCH_FLOATING_TYPES(c.q.scalar_type(), "relpos_attention_packed_cpu", [&] {
    std::vector<PackedSample<scalar_t>> samples = make_samples<scalar_t>(L, c, rel_tab, bias_tab);
    for (int64_t i = 0; i < L.S; ++i) {
      samples[i].t.out = out.data_ptr<scalar_t>() + L.first[i] * s.Dv;
      samples[i].t.lse = lse.data_ptr<scalar_t>() + L.first[i];
    }
    cpu::typed<scalar_t>(cpu::kernels()).relpos_packed_forward(samples);
  });
  return {out, lse};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>
packed_backward_cpu(const RelposCall& c, const at::Tensor& grad_out, const at::Tensor& grad_lse,
                    const at::Tensor& out, const at::Tensor& lse) {
  const RelposShape& s = c.shape;
  // Zeros: the tail's gradients, and the sums of d k / d v.
  at::Tensor dq = at::zeros_like(c.q), dk = at::zeros_like(c.k), dv = at::zeros_like(c.v);
  at::Tensor dqpos = s.has_pos ? at::zeros_like(c.q) : at::Tensor();
  at::Tensor drel = s.has_pos ? at::zeros_like(c.rel) : at::Tensor();
  at::Tensor dbias = s.has_bias ? at::zeros_like(c.bias) : at::Tensor();
  at::Tensor dsigma = s.has_sigma ? at::zeros_like(c.sigma) : at::Tensor();
  check_packed_values_cpu(s, c.packed_offsets, c.packed_shapes);
  if (s.H == 0) return {dq, dk, dv, dqpos, drel, dsigma, dbias};
  const PackedLayout L = make_layout(c);
  const at::Tensor rel_tab = s.has_pos ? gather_tables(L, c.rel, s.D) : at::Tensor();
  const at::Tensor bias_tab = s.has_bias ? gather_tables(L, c.bias.unsqueeze(-1), 1) : at::Tensor();
  // d k / d v per part (part-major, see part_slab) where a sample's backward is split in parts.
  at::Tensor dk_acc = dk, dv_acc = dv;
  if (L.max_parts > 1) {
    dk_acc = at::zeros({L.max_parts, 1, s.H, s.N, s.D}, c.q.options());
    dv_acc = at::zeros({L.max_parts, 1, s.H, s.N, s.Dv}, c.q.options());
  }
  const at::Tensor drel_part = s.has_pos ? at::zeros({L.part_off[L.S], s.D}, c.q.options()) : at::Tensor();
  const at::Tensor dbias_part = s.has_bias ? at::zeros({L.part_off[L.S], 1}, c.q.options()) : at::Tensor();
  const at::Tensor dsig_part =
      at::zeros({std::max<int64_t>(1, L.sig_off[L.S])}, c.q.options().dtype(at::kDouble));
  AT_DISPATCH_FLOATING_TYPES(c.q.scalar_type(), "relpos_attention_packed_backward_cpu", [&] {
    using T = scalar_t;
    std::vector<PackedSample<T>> samples = make_samples<T>(L, c, rel_tab, bias_tab);
    for (int64_t i = 0; i < L.S; ++i) {
      const int64_t f = L.first[i];
      RelposTensors<T>& t = samples[i].t;
      t.out = out.data_ptr<T>() + f * s.Dv;
      t.lse = lse.data_ptr<T>() + f;
      t.gout = grad_out.data_ptr<T>() + f * s.Dv;
      t.glse = grad_lse.defined() ? grad_lse.data_ptr<T>() + f : nullptr;
      t.dq = dq.data_ptr<T>() + f * s.D;
      t.dk = dk_acc.data_ptr<T>() + f * s.D;
      t.dv = dv_acc.data_ptr<T>() + f * s.Dv;
      if (s.has_pos) {
        t.dqpos = dqpos.data_ptr<T>() + f * s.D;
        t.drel = drel_part.data_ptr<T>() + L.part_off[i] * s.D;
      }
      if (s.has_bias) t.dbias = dbias_part.data_ptr<T>() + L.part_off[i];
      t.dsig_part = dsig_part.data_ptr<double>() + L.sig_off[i];
    }
    cpu::typed<T>(cpu::kernels()).relpos_packed_backward(samples);
  });
  if (L.max_parts > 1) {
    dk.copy_(dk_acc.sum(0));
    dv.copy_(dv_acc.sum(0));
  }
  if (s.has_pos) scatter_tables(L, drel_part, drel, s.D);
  if (s.has_bias) {
    at::Tensor db = dbias.unsqueeze(-1);
    scatter_tables(L, dbias_part, db, 1);
  }
  if (s.has_sigma) {
    // Per sample as a single call computes it (relpos_cpu.cpp), added in sample order:
    // d sigma_{h,a} += -(sum dquad x_a^2) / sigma_{h,a}^3 over the sample's axes of extent > 1.
    const at::Tensor sig = c.sigma.to(at::kDouble);
    at::Tensor ds = at::zeros({s.H, static_cast<int64_t>(s.grid.size())}, sig.options());
    std::vector<bool> written(s.grid.size(),
                              false);  // the first sample copies, as a single call (-0.0 stays)
    for (int64_t i = 0; i < L.S; ++i) {
      const Problem& p = L.problems[i];
      const int64_t G = p.g.ndim, np = L.splits[i].nparts;
      const at::Tensor acc =
          dsig_part.narrow(0, L.sig_off[i], L.sig_off[i + 1] - L.sig_off[i]).view({s.H, np, G}).sum(1);
      for (int64_t d = 0; d < G; ++d) {
        const int64_t a = p.g.axis[d];
        if (p.g.n[d] <= 1) continue;
        const at::Tensor term = -acc.select(1, d) / sig.select(1, a).pow(3);
        if (written[a])
          ds.select(1, a).add_(term);
        else
          ds.select(1, a).copy_(term);
        written[a] = true;
      }
    }
    dsigma.copy_(ds);
  }
  return {dq, dk, dv, dqpos, drel, dsigma, dbias};
}

std::string packed_plan_cpu(const RelposCall& c) {
  const RelposShape& s = c.shape;
  check_packed_values_cpu(s, c.packed_offsets, c.packed_shapes);
  if (s.H == 0)
    return "device: cpu\nisa: " + cpu::kernels_capability_name() +
           "\nforward: tiled\nbackward: tiled\nreason: no heads (H = 0): nothing to "
           "compute\npacked_samples: " +
           std::to_string(s.packed_samples) + "\nwindow_samples: 0\n";
  const PackedLayout L = make_layout(c);
  int64_t windowed = 0, largest = 0;
  for (int64_t i = 0; i < L.S; ++i) {
    windowed += L.plans[i].window ? 1 : 0;
    if (L.cost[i] > L.cost[largest]) largest = i;
  }
  const std::string kernel = windowed == L.S ? "window" : windowed == 0 ? "tiled" : "tiled and window";
  return "device: cpu\nisa: " + L.plans[0].isa + "\nforward: " + kernel + "\nbackward: " + kernel +
         "\nreason: " + L.plans[largest].reason + " (the largest sample; each sample has its own plan)" +
         "\npacked_samples: " + std::to_string(L.S) + "\nwindow_samples: " + std::to_string(windowed) + "\n";
}

}  // namespace relpos
}  // namespace posattn
