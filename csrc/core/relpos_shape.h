// The sizes and options of a validated relpos_attention call: plain data, no
// ATen, so that the torch-free CUDA kernels (csrc/cuda/) and the simulator
// harness (tests/cuda_sim/) build the same RelposParams as the operators.
#pragma once

#include <cstdint>
#include <vector>

namespace posattn {

enum class SpanMode { kAdd, kMultiply };

// Sizes of a validated relpos_attention call.
struct RelposShape {
  int64_t B = 0, H = 0, N = 0, D = 0, Dv = 0;
  std::vector<int64_t> grid;   // as given, prod == N; a packed call's max_grid
  int64_t packed_samples = 0;  // a packed call's samples S (0: not packed)
  bool has_pos = false;
  bool has_sigma = false;
  bool has_bias = false;
  SpanMode mode = SpanMode::kAdd;
  // The window per axis of the caller's grid (all empty: no window): cells
  // before and after its centre (a kernel of left + right + 1 cells), the stride
  // of the query groups sharing one window, and whether the axis is causal
  // (NATTEN's vocabulary; see AxisLimit in grid_index.h).
  std::vector<int64_t> window_left, window_right, window_stride, window_causal;
  bool window_shift = false;  // NATTEN's border rule (window_border == "shift")

  // A window of 2 w_d + 1 cells centred on each query (the `window` argument).
  void set_symmetric_window(const std::vector<int64_t>& half) {
    window_left = window_right = half;
    window_stride.assign(half.size(), 1);
    window_causal.assign(half.size(), 0);
  }
  bool has_window() const { return !window_left.empty(); }
  bool packed() const { return packed_samples > 0; }
};

}  // namespace posattn
