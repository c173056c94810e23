// How the relpos_attention kernels cut the work: query tiles are boxes on the
// grid (so the offsets between a tile and a key chunk span a small box of the
// relative-embedding table), and the keys a tile attends to (the whole grid,
// or the span box around the tile) are cut into chunks of about `target` keys
// that are boxes too: single coordinates on the outer axes, a piece of one
// axis, and the full region on the inner axes (contiguous in memory whenever
// the region covers the grid on those inner axes).
#pragma once

#include <algorithm>
#include <cstdint>

#include "grid_index.h"

namespace posattn {
namespace tiling {

// The squeezed grid lives with the index math (grid_index.h).
using posattn::Grid;
using posattn::squeeze_grid;

// Half-open box [lo_d, hi_d) per axis.
struct Box {
  int64_t lo[kMaxGridDims] = {};
  int64_t hi[kMaxGridDims] = {};
};

POSATTN_HD int64_t box_volume(const Box& b, int ndim) {
  int64_t v = 1;
  for (int d = 0; d < ndim; ++d) v *= b.hi[d] > b.lo[d] ? b.hi[d] - b.lo[d] : 0;
  return v;
}

// Tile extents: a near-cubic box of at most `target` cells (powers of two per
// axis, capped by the grid). Doubling the smallest extent first keeps the
// offset box (extent + key extent - 1 per axis) small; ties go to the inner
// axis, whose rows are contiguous in memory.
inline void choose_tile(const Grid& g, int64_t target, int64_t* tile) {
  for (int d = 0; d < g.ndim; ++d) tile[d] = 1;
  int64_t vol = 1;
  while (true) {
    int best = -1;
    for (int d = g.ndim - 1; d >= 0; --d) {
      if (tile[d] >= g.n[d]) continue;
      if (best < 0 || tile[d] < tile[best]) best = d;
    }
    if (best < 0) break;
    const int64_t grown = std::min<int64_t>(tile[best] * 2, g.n[best]);
    if (vol / tile[best] * grown > target) break;
    vol = vol / tile[best] * grown;
    tile[best] = grown;
  }
}

// How many queries a tile should hold. Without a span box (`half` == nullptr)
// the tile's keys are the whole grid and the positional term is one GEMM
// against the offset box (tile extent + grid extent - 1 per axis), so larger
// tiles amortise it: `dense_target`. With a box, a tile attends to the union
// of its queries' boxes (tile extent + 2 half per axis), so the tile is the
// largest (halving from `dense_target`, at least `min_target`) whose union
// holds at most 1.5x the keys of one query's box.
inline int64_t tile_target(const Grid& g, const int64_t* half, int64_t dense_target, int64_t min_target) {
  if (half == nullptr) return dense_target;
  double box = 1.0;
  for (int d = 0; d < g.ndim; ++d) box *= static_cast<double>(std::min<int64_t>(2 * half[d] + 1, g.n[d]));
  int64_t target = dense_target;
  for (; target > min_target; target /= 2) {
    int64_t tile[kMaxGridDims];
    choose_tile(g, target, tile);
    double region = 1.0;
    for (int d = 0; d < g.ndim; ++d)
      region *= static_cast<double>(std::min<int64_t>(tile[d] + 2 * half[d], g.n[d]));
    if (region <= 1.5 * box) break;
  }
  return std::max(target, min_target);
}

POSATTN_HD int64_t num_tiles(const Grid& g, const int64_t* tile) {
  int64_t t = 1;
  for (int d = 0; d < g.ndim; ++d) t *= (g.n[d] + tile[d] - 1) / tile[d];
  return t;
}

// The `index`-th tile in row-major order of tiles; edge tiles are clipped.
POSATTN_HD Box tile_box(const Grid& g, const int64_t* tile, int64_t index) {
  Box b;
  for (int d = g.ndim - 1; d >= 0; --d) {
    const int64_t count = (g.n[d] + tile[d] - 1) / tile[d];
    const int64_t i = index % count;
    index /= count;
    b.lo[d] = i * tile[d];
    b.hi[d] = b.lo[d] + tile[d] < g.n[d] ? b.lo[d] + tile[d] : g.n[d];
  }
  return b;
}

// Keys that any query of `tile` may attend to: the tile grown by each axis'
// key range (see axis_key_range; `limits` holds one AxisLimit per axis, or is
// null for the whole grid), and, for causal attention, no outer-axis
// coordinate past the tile's last one (every such key comes later in token
// order than every query of the tile). The ranges never decrease along an
// axis, so the tile's first and last coordinates bound the region.
POSATTN_HD Box key_region(const Grid& g, const Box& tile, const AxisLimit* limits, bool causal) {
  Box r;
  for (int d = 0; d < g.ndim; ++d) {
    if (limits != nullptr) {
      int64_t lo, hi;
      axis_key_range(limits[d], tile.lo[d], r.lo[d], hi);
      axis_key_range(limits[d], tile.hi[d] - 1, lo, hi);
      r.hi[d] = hi + 1;
    } else {
      r.lo[d] = 0;
      r.hi[d] = g.n[d];
    }
  }
  if (causal && tile.hi[0] < r.hi[0]) r.hi[0] = tile.hi[0];
  return r;
}

// Queries that may attend to a key of `keys` (the transpose of key_region, for
// the key-major backward): per axis, the queries i whose key range
// [lo(i), hi(i)] meets the box's coordinates. Both ends never decrease with i, so
// these form an interval, found by bisection: from the first i with
// hi(i) >= keys.lo to the last with lo(i) < keys.hi. Exact for shifted windows,
// whose reach is twice as wide as any one query's range. For causal attention,
// no outer-axis coordinate before the box's first (every such query comes
// earlier in token order than every key of the box). An axis no query meets
// gives an empty box.
POSATTN_HD Box query_region(const Grid& g, const Box& keys, const AxisLimit* limits, bool causal) {
  Box r;
  for (int d = 0; d < g.ndim; ++d) {
    r.lo[d] = 0;
    r.hi[d] = g.n[d];
    if (limits == nullptr) continue;
    int64_t a = 0, b = g.n[d];  // first i with hi(i) >= keys.lo[d], in [0, n]
    while (a < b) {
      const int64_t mid = a + (b - a) / 2;
      int64_t lo, hi;
      axis_key_range(limits[d], mid, lo, hi);
      if (hi >= keys.lo[d])
        b = mid;
      else
        a = mid + 1;
    }
    r.lo[d] = a;
    a = 0;
    b = g.n[d];  // first i with lo(i) >= keys.hi[d]
    while (a < b) {
      const int64_t mid = a + (b - a) / 2;
      int64_t lo, hi;
      axis_key_range(limits[d], mid, lo, hi);
      if (lo >= keys.hi[d])
        b = mid;
      else
        a = mid + 1;
    }
    r.hi[d] = a > r.lo[d] ? a : r.lo[d];
  }
  if (causal && r.lo[0] < keys.lo[0]) r.lo[0] = keys.lo[0] < r.hi[0] ? keys.lo[0] : r.hi[0];
  return r;
}

// Cutting a region into chunks: every axis before `split` takes one
// coordinate per chunk, axis `split` a piece of `piece` coordinates, the axes
// after it their full region extent.
struct ChunkPlan {
  Box region;
  int split = 0;
  int64_t piece = 1;
  int64_t count = 0;
};

inline ChunkPlan plan_chunks(const Grid& g, const Box& region, int64_t target) {
  ChunkPlan p;
  p.region = region;
  if (box_volume(region, g.ndim) == 0) return p;
  int64_t inner = 1;  // volume of the axes after `split`
  int split = g.ndim - 1;
  while (split > 0 && inner * (region.hi[split] - region.lo[split]) <= target) {
    inner *= region.hi[split] - region.lo[split];
    --split;
  }
  p.split = split;
  const int64_t ext = region.hi[split] - region.lo[split];
  p.piece = std::max<int64_t>(1, std::min<int64_t>(ext, target / inner));
  p.count = (ext + p.piece - 1) / p.piece;
  for (int d = 0; d < split; ++d) p.count *= region.hi[d] - region.lo[d];
  return p;
}

inline Box chunk_box(const Grid& g, const ChunkPlan& p, int64_t index) {
  Box b = p.region;
  const int s = p.split;
  const int64_t ext = p.region.hi[s] - p.region.lo[s];
  const int64_t pieces = (ext + p.piece - 1) / p.piece;
  const int64_t piece_index = index % pieces;
  index /= pieces;
  b.lo[s] = p.region.lo[s] + piece_index * p.piece;
  b.hi[s] = std::min(b.lo[s] + p.piece, p.region.hi[s]);
  for (int d = s - 1; d >= 0; --d) {
    const int64_t e = p.region.hi[d] - p.region.lo[d];
    b.lo[d] = p.region.lo[d] + index % e;
    b.hi[d] = b.lo[d] + 1;
    index /= e;
  }
  return b;
}

}  // namespace tiling
}  // namespace posattn
