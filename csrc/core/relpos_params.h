// One description of a relpos_attention call, filled once from the checked
// arguments and shared by the CPU and CUDA kernels (flash-attention's params
// struct): plain data, copied by value into CUDA kernels.
#pragma once

#include <algorithm>
#include <cstdint>

#include "grid_index.h"
#include "relpos_shape.h"

namespace posattn {

struct RelposParams {
  int64_t B = 0, H = 0, N = 0, D = 0, Dv = 0;
  // Tokens between the (b, h) slabs of the token tensors (q, k, v, q_pos, out, lse and their
  // gradients): N, or a packed call's T when the call is one of its samples (the CPU kernels)
  int64_t tok_stride = 0;
  // A packed call's samples S (0: not packed): N is then its T, g / U / rel_stride its max_grid's,
  // and the CUDA kernels find each token's sample in RelposTensors' packed_offsets / packed_shapes
  int64_t packed_samples = 0;
  int64_t G_in = 0;                       // axes of the caller's grid (sigma's second dim)
  Grid g;                                 // the grid without its size-1 axes
  int64_t U = 1;                          // offsets: prod over g of (2 n_d - 1)
  int64_t rel_stride[kMaxGridDims] = {};  // row stride of each kept axis in rel / bias
  // window per kept axis (see AxisLimit): cells before / after the centre, capped at
  // n_d - 1 (n_d - 1 each without a window), query group stride, causal
  int64_t win_left[kMaxGridDims] = {}, win_right[kMaxGridDims] = {}, win_stride[kMaxGridDims] = {};
  bool win_causal[kMaxGridDims] = {};
  bool has_pos = false, has_sigma = false, has_bias = false;
  bool has_box = false;  // a span threshold and/or a window masks keys
  bool causal = false, window_shift = false;
  SpanMode mode = SpanMode::kAdd;
  double threshold = 0.0, scale = 1.0;
};

inline RelposParams make_relpos_params(const RelposShape& s, double threshold, double scale, bool causal) {
  RelposParams p;
  p.B = s.B;
  p.H = s.H;
  p.N = s.N;
  p.tok_stride = s.N;
  p.packed_samples = s.packed_samples;
  p.D = s.D;
  p.Dv = s.Dv;
  p.G_in = static_cast<int64_t>(s.grid.size());
  p.g = squeeze_grid(s.grid.data(), static_cast<int>(s.grid.size()));
  int64_t stride = 1;
  for (int d = p.g.ndim - 1; d >= 0; --d) {
    p.rel_stride[d] = stride;
    stride *= 2 * p.g.n[d] - 1;
    const int64_t n = p.g.n[d], a = p.g.axis[d];
    p.win_left[d] = s.has_window() ? std::min<int64_t>(s.window_left[a], n - 1) : n - 1;
    p.win_right[d] = s.has_window() ? std::min<int64_t>(s.window_right[a], n - 1) : n - 1;
    p.win_stride[d] = s.has_window() ? std::min<int64_t>(s.window_stride[a], n) : 1;
    p.win_causal[d] = s.has_window() && s.window_causal[a] != 0;
  }
  p.U = stride;
  p.has_pos = s.has_pos;
  p.has_sigma = s.has_sigma;
  p.has_bias = s.has_bias;
  p.has_box = threshold > 0.0 || s.has_window();
  p.causal = causal;
  p.window_shift = s.window_shift;
  p.mode = s.mode;
  p.threshold = threshold;
  p.scale = scale;
  return p;
}

// The key limits of kept axis d of a call (span: the span box's half width, n_d - 1 without one).
POSATTN_HD AxisLimit window_limit(const RelposParams& p, int d, int64_t span) {
  AxisLimit a;
  a.n = p.g.n[d];
  a.span = span;
  a.left = p.win_left[d];
  a.right = p.win_right[d];
  a.stride = p.win_stride[d];
  a.causal = p.win_causal[d];
  a.shift = p.window_shift;
  return a;
}

}  // namespace posattn
