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
  std::vector<int64_t> grid;  // as given, prod == N
  bool has_pos = false;
  bool has_sigma = false;
  bool has_bias = false;
  SpanMode mode = SpanMode::kAdd;
  std::vector<int64_t> window;  // G half widths as given, or empty (no window)
  bool window_shift = false;    // NATTEN's border rule (window_border == "shift")
};

}  // namespace posattn
