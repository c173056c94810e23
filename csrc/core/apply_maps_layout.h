// Index math of apply_maps shared by the CPU and CUDA kernels.
//   x, y:  (B, H, N, D) contiguous, D = A * m
//   maps:  (P, H, A, m, m) contiguous
//   index: (N, A) shared by the batch, or (B, N, A)
#pragma once

#include <cstdint>

#include "grid_index.h"  // POSATTN_HD

namespace posattn {
namespace apply_maps {

struct MapsShape {
  int64_t B = 0, H = 0, N = 0, D = 0, P = 0, A = 0, m = 0;
  bool batched_index = false;  // index is (B, N, A)
};

// Offset of token (b, h, n)'s block a in x / y.
POSATTN_HD int64_t x_offset(const MapsShape& s, int64_t b, int64_t h, int64_t n, int64_t a) {
  return ((b * s.H + h) * s.N + n) * s.D + a * s.m;
}

// Offset of the index entry of token (b, n), axis a.
POSATTN_HD int64_t index_offset(const MapsShape& s, int64_t b, int64_t n, int64_t a) {
  return ((s.batched_index ? b * s.N : 0) + n) * s.A + a;
}

// Offset of map (p, h, a) (an m x m row-major matrix) in maps.
POSATTN_HD int64_t map_offset(const MapsShape& s, int64_t p, int64_t h, int64_t a) {
  return ((p * s.H + h) * s.A + a) * s.m * s.m;
}

}  // namespace apply_maps
}  // namespace posattn
