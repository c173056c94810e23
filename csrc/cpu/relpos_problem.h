// What the relpos_attention CPU kernels (tiled and windowed) share: the
// problem description filled once per call, the span's per-axis tables, and
// how the backward splits its work into tasks.
#pragma once

#include <torch/types.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "../core/grid_index.h"
#include "../core/relpos_params.h"
#include "../core/relpos_tensors.h"
#include "../core/relpos_tiling.h"

namespace posattn {
namespace relpos {
namespace cpu_kernels {

using tiling::Box;

// Queries per tile of the tiled kernel (see tiling::tile_target). Measured on
// 32x32 and 64x64 grids (BENCHMARKS.md): dense, 64-query tiles amortise the
// positional GEMM over the offset box (1.5x faster than 32 at 32x32); with a
// span box, tiles of 8-32 queries keep the union of their boxes small.
constexpr int64_t kDenseTile = 64;
constexpr int64_t kMinTile = 8;

template <typename T>
constexpr T neg_inf() {
  return -std::numeric_limits<T>::infinity();
}

// ---------------------------------------------------------------------------
// Problem description shared by forward and backward (dtype independent): the
// call's RelposParams plus the CPU kernels' tiles and per-head key limits.
struct Problem : RelposParams {
  int64_t tile[kMaxGridDims] = {};
  int64_t ntiles = 0;
  // With a box (span threshold and/or fixed window): which keys each query
  // keeps along each kept axis, per head (H, G), and the largest offset of a
  // kept key (H, G), which bounds the offset boxes.
  std::vector<AxisLimit> limits;
  std::vector<int64_t> half;
  const int64_t* half_of(int64_t h) const { return has_box ? half.data() + h * g.ndim : nullptr; }
  const AxisLimit* limits_of(int64_t h) const { return has_box ? limits.data() + h * g.ndim : nullptr; }
};

// Per-axis lookup tables of the Gaussian span, indexed by the offset delta
// along the axis: quad_d(delta) = 0.5 (x_d / sigma_{h,d})^2, its exp(-.), and
// the head-independent x_d^2 (for d sigma).
template <typename T>
struct SpanTables {
  std::vector<T> quad, gauss, xsq;
  int64_t center[kMaxGridDims] = {};  // where delta = 0 sits for each axis
  int64_t per_head = 0;
  const T* quad_at(int64_t h, int d) const { return quad.data() + h * per_head + center[d]; }
  const T* gauss_at(int64_t h, int d) const { return gauss.data() + h * per_head + center[d]; }
  const T* xsq_at(int d) const { return xsq.data() + center[d]; }
};

// `sigma`: the call's (contiguous) sigma, or undefined.
inline Problem make_problem(const RelposParams& params, const at::Tensor& sigma) {
  Problem p;
  static_cast<RelposParams&>(p) = params;
  const double threshold = p.threshold;
  const int G = p.g.ndim;
  // The heads share the tiles: sized for their mean reach (span or window
  // half width: a tile's keys extend that far beyond it, also for shifted
  // windows, which only move at the borders).
  int64_t mean_reach[kMaxGridDims] = {};
  if (p.has_box) {
    at::Tensor sig;
    const double* sp = nullptr;
    if (threshold > 0.0) {
      sig = sigma.to(at::kDouble).contiguous();
      sp = sig.data_ptr<double>();
    }
    p.limits.resize(p.H * G);
    p.half.resize(p.H * G);
    for (int64_t h = 0; h < p.H; ++h)
      for (int d = 0; d < G; ++d) {
        const int64_t n = p.g.n[d], a = p.g.axis[d];
        AxisLimit& lim = p.limits[h * G + d];
        lim = window_limit(p, d, sp != nullptr ? span_half_width(sp[h * p.G_in + a], threshold, n) : n - 1);
        p.half[h * G + d] = axis_max_offset(lim);
        mean_reach[d] += std::min(lim.span, std::max(lim.left, lim.right));
      }
    for (int d = 0; d < G; ++d) mean_reach[d] = p.H > 0 ? (mean_reach[d] + p.H / 2) / p.H : 0;
  }
  const int64_t target = tiling::tile_target(p.g, p.has_box ? mean_reach : nullptr, kDenseTile, kMinTile);
  tiling::choose_tile(p.g, target, p.tile);
  p.ntiles = tiling::num_tiles(p.g, p.tile);
  return p;
}

template <typename T>
SpanTables<T> make_span_tables(const Problem& p, const at::Tensor& sigma) {
  SpanTables<T> st;
  const int G = p.g.ndim;
  int64_t total = 0;
  for (int d = 0; d < G; ++d) {
    st.center[d] = total + p.g.n[d] - 1;
    total += 2 * p.g.n[d] - 1;
  }
  st.per_head = total;
  st.quad.resize(p.H * total);
  st.gauss.resize(p.H * total);
  st.xsq.resize(total);
  const at::Tensor sig = sigma.to(at::kDouble).contiguous();
  const double* sp = sig.data_ptr<double>();
  const int64_t G_in = sigma.size(1);
  for (int d = 0; d < G; ++d) {
    const int64_t n = p.g.n[d];
    for (int64_t delta = -(n - 1); delta <= n - 1; ++delta) {
      const double x = normalised_offset(delta, n);
      st.xsq[st.center[d] + delta] = static_cast<T>(x * x);
      for (int64_t h = 0; h < p.H; ++h) {
        const double z = x / sp[h * G_in + p.g.axis[d]];
        const double quad = 0.5 * z * z;
        st.quad[h * total + st.center[d] + delta] = static_cast<T>(quad);
        st.gauss[h * total + st.center[d] + delta] = static_cast<T>(std::exp(-quad));
      }
    }
  }
  return st;
}

// A backward task is (head, group of batch elements, part of the query
// tiles). It owns private d rel / d bias / d sigma accumulators (reduced over tasks
// afterwards, no atomics) and accumulates d k / d v of its (b, h) pairs into
// dk_acc / dv_acc at slot (b h, part): the outputs themselves when there is
// one part, per-part buffers summed afterwards when a (b, h) pair is split
// over several tasks (few pairs, many threads).
struct BackwardSplit {
  int64_t ngroups = 1;  // groups of batch elements per head
  int64_t nparts = 1;   // parts of the query tiles per (b, h); > 1 only if ngroups == B
  int64_t tasks(int64_t H) const { return H * ngroups * nparts; }
};

// What task `task` of a split covers: head h, batch elements [b0, b1), part
// `part` of the (b, h) pair's `units` (tiles or runs): [u0, u1).
struct TaskRange {
  int64_t h = 0, b0 = 0, b1 = 0, part = 0, u0 = 0, u1 = 0;
};

inline TaskRange task_range(const BackwardSplit& s, int64_t task, int64_t B, int64_t units) {
  TaskRange t;
  t.part = task % s.nparts;
  t.h = task / s.nparts / s.ngroups;
  const int64_t grp = task / s.nparts % s.ngroups;
  t.b0 = grp * B / s.ngroups;
  t.b1 = (grp + 1) * B / s.ngroups;
  t.u0 = t.part * units / s.nparts;
  t.u1 = (t.part + 1) * units / s.nparts;
  return t;
}

// The first row of the d k / d v accumulator of (b h, part): the buffers are part-major,
// (nparts, B, H, tok_stride, D), so that a packed call's samples (B = 1, each with its own
// number of parts) share one buffer of the largest number of parts.
inline int64_t part_slab(const Problem& p, int64_t bh, int64_t part) {
  return (part * p.B * p.H + bh) * p.tok_stride;
}

inline BackwardSplit choose_split(int64_t B, int64_t H, int64_t ntiles, int64_t nthreads) {
  BackwardSplit s;
  const int64_t target = 2 * nthreads;
  if (B * H >= target) {
    s.ngroups = std::max<int64_t>(1, std::min<int64_t>(B, (target + H - 1) / H));
  } else {
    s.ngroups = B;
    s.nparts = std::max<int64_t>(1, std::min<int64_t>(ntiles, (target + B * H - 1) / (B * H)));
  }
  return s;
}

}  // namespace cpu_kernels
}  // namespace relpos
}  // namespace posattn
