// Index math for tokens laid out row-major on an n-D grid, and for the table of
// relative offsets between them. Shared by the CPU and CUDA kernels and by the
// Catch2 unit tests, so it is plain arithmetic with no ATen dependency.
#pragma once

#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define POSATTN_HD __host__ __device__ __forceinline__
#else
#define POSATTN_HD inline
#endif

namespace posattn {

// Maximum number of grid axes an operator accepts (after size-1 axes are dropped
// the kernels see at most this many).
constexpr int kMaxGridDims = 8;

// A grid without its size-1 axes (they change neither token order, nor offset
// rows, nor the span): the kernels only ever see axes with n_d >= 2, or a
// single axis of size 1 when every axis has size 1.
struct Grid {
  int ndim = 0;
  int64_t n[kMaxGridDims] = {};
  int axis[kMaxGridDims] = {};  // index of each kept axis in the caller's grid
};

POSATTN_HD Grid squeeze_grid(const int64_t* shape, int ndim) {
  Grid g;
  for (int d = 0; d < ndim; ++d) {
    if (shape[d] > 1) {
      g.n[g.ndim] = shape[d];
      g.axis[g.ndim] = d;
      ++g.ndim;
    }
  }
  if (g.ndim == 0) {
    g.ndim = 1;
    g.n[0] = 1;
    g.axis[0] = 0;
  }
  return g;
}

// Row-major coordinates of token `index` on a grid of `ndim` axes.
POSATTN_HD void unravel_index(int64_t index, const int64_t* shape, int ndim, int64_t* coord) {
  for (int d = ndim - 1; d >= 0; --d) {
    coord[d] = index % shape[d];
    index /= shape[d];
  }
}

// Row-major token index of `coord` on a grid of `ndim` axes.
POSATTN_HD int64_t ravel_index(const int64_t* coord, const int64_t* shape, int ndim) {
  int64_t index = 0;
  for (int d = 0; d < ndim; ++d) index = index * shape[d] + coord[d];
  return index;
}

// Number of distinct relative offsets on the grid: U = prod_d (2 n_d - 1).
POSATTN_HD int64_t num_offsets(const int64_t* shape, int ndim) {
  int64_t u = 1;
  for (int d = 0; d < ndim; ++d) u *= 2 * shape[d] - 1;
  return u;
}

// Row of offset `delta` (delta_d in [-(n_d-1), n_d-1]) in the (U, D) table of
// relative embeddings: the row-major index of delta + (n - 1) over the shape
// (2 n_1 - 1, ..., 2 n_G - 1).
POSATTN_HD int64_t offset_row(const int64_t* delta, const int64_t* shape, int ndim) {
  int64_t row = 0;
  for (int d = 0; d < ndim; ++d) row = row * (2 * shape[d] - 1) + (delta[d] + shape[d] - 1);
  return row;
}

// Inverse of offset_row: the offset whose table row is `row`.
POSATTN_HD void offset_of_row(int64_t row, const int64_t* shape, int ndim, int64_t* delta) {
  for (int d = ndim - 1; d >= 0; --d) {
    const int64_t w = 2 * shape[d] - 1;
    delta[d] = row % w - (shape[d] - 1);
    row /= w;
  }
}

// Offset normalised to [-1, 1] along an axis of n cells: delta / max(n - 1, 1).
POSATTN_HD double normalised_offset(int64_t delta, int64_t n) {
  return static_cast<double>(delta) / static_cast<double>(n > 1 ? n - 1 : 1);
}

// sqrt(-2 ln t): the Gaussian radius (in units of sigma) at which exp(-x^2/2) = t.
POSATTN_HD double threshold_radius(double threshold) {
  return std::sqrt(-2.0 * std::log(threshold));
}

// Half width (in cells) of the span box along an axis of n cells:
//   min(ceil(sigma * sqrt(-2 ln t) * (n - 1)), n - 1)
// A key is kept iff |delta_d| <= half_d on every axis.
POSATTN_HD int64_t span_half_width(double sigma, double threshold, int64_t n) {
  if (n <= 1) return 0;
  const double extent = sigma * threshold_radius(threshold) * static_cast<double>(n - 1);
  if (!(extent < static_cast<double>(n - 1))) return n - 1;  // also catches +inf / NaN
  const int64_t half = static_cast<int64_t>(std::ceil(extent));
  return half < n - 1 ? half : n - 1;
}

// Which keys a query at coordinate i keeps along one axis of n cells: those at
// most `span` cells away (the span box; n - 1 without one) and inside its
// window (the whole axis without one). The window holds `left` cells before
// its centre and `right` after (a kernel of k = left + right + 1 cells: left =
// k / 2, right = k - 1 - k / 2, NATTEN's split of an even kernel). Its centre
// is the query's stride leader: queries come in groups of `stride` cells
// ([g s, g s + s - 1]) sharing the window of the group's middle cell, g s + s / 2
// (the right one of the two middles of an even stride), capped at n - 1;
// stride 1 centres every window on its query. At the borders the window is
// clipped (posattn's default), or with `shift` (NATTEN's rule) moved to stay
// inside the axis, so that every query keeps min(k, n) keys. A `causal` axis
// keeps the keys j <= i whose distance to the group's last cell (g s + s - 1,
// capped at n - 1) is below k (NATTEN's causal neighbourhood). Requires
// 0 <= span <= n - 1, right = left or left - 1 (>= 0) and 1 <= stride <= k (other
// splits would let a strided group's window miss its own queries). The kept keys are
// [lo, hi]; neither bound ever decreases as i grows, and the query always keeps
// itself.
struct AxisLimit {
  int64_t n = 1, span = 0, left = 0, right = 0, stride = 1;
  bool shift = false, causal = false;
};

// An axis' limits: n cells, span box half width, window cells before / after
// the centre, query group stride, border rule, causal.
POSATTN_HD AxisLimit make_axis_limit(int64_t n, int64_t span, int64_t left, int64_t right, int64_t stride = 1,
                                     bool shift = false, bool causal = false) {
  AxisLimit a;
  a.n = n;
  a.span = span;
  a.left = left;
  a.right = right;
  a.stride = stride;
  a.shift = shift;
  a.causal = causal;
  return a;
}

POSATTN_HD void axis_key_range(const AxisLimit& a, int64_t i, int64_t& lo, int64_t& hi) {
  const int64_t k = a.left + a.right + 1;
  const int64_t group = i - i % a.stride;
  if (a.causal) {
    int64_t last = group + a.stride - 1;
    if (last > a.n - 1) last = a.n - 1;
    lo = last - k + 1;
    hi = i;
  } else {
    int64_t c = group + a.stride / 2;
    if (c > a.n - 1) c = a.n - 1;
    if (a.shift && k >= a.n) {  // a window as large as the axis covers it
      lo = 0;
      hi = a.n - 1;
    } else {
      if (a.shift && c < a.left) c = a.left;
      if (a.shift && c > a.n - 1 - a.right) c = a.n - 1 - a.right;
      lo = c - a.left;
      hi = c + a.right;
    }
  }
  if (lo < i - a.span) lo = i - a.span;
  if (hi > i + a.span) hi = i + a.span;
  if (lo < 0) lo = 0;
  if (hi > a.n - 1) hi = a.n - 1;
}

// The largest |j - i| of a key j kept by a query i on the axis.
POSATTN_HD int64_t axis_max_offset(const AxisLimit& a) {
  const int64_t k = a.left + a.right + 1;
  int64_t m;
  if (a.causal || a.shift) {
    m = k - 1;  // the query lies in its window of k cells
  } else {      // the window's centre lies up to stride - 1 - stride / 2 before the query, stride / 2 after
    const int64_t before = a.left + (a.stride - 1 - a.stride / 2), after = a.right + a.stride / 2;
    m = before > after ? before : after;
  }
  if (m > a.span) m = a.span;
  return m < a.n - 1 ? m : a.n - 1;
}

}  // namespace posattn
