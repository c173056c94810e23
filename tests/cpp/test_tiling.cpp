#include <catch2/catch.hpp>

#include <vector>

#include "core/relpos_tiling.h"

using namespace posattn;
using namespace posattn::tiling;

namespace {
Grid make_grid(std::vector<int64_t> shape) {
  return squeeze_grid(shape.data(), static_cast<int>(shape.size()));
}

// A 2-D box [lo0, hi0) x [lo1, hi1).
Box make_box(int64_t lo0, int64_t hi0, int64_t lo1, int64_t hi1) {
  Box b;
  b.lo[0] = lo0;
  b.hi[0] = hi0;
  b.lo[1] = lo1;
  b.hi[1] = hi1;
  return b;
}
}  // namespace

TEST_CASE("squeeze_grid drops size-1 axes and remembers the caller's axes", "[tiling]") {
  const Grid g = make_grid({4, 1, 3});
  REQUIRE(g.ndim == 2);
  CHECK(g.n[0] == 4);
  CHECK(g.n[1] == 3);
  CHECK(g.axis[0] == 0);
  CHECK(g.axis[1] == 2);
  const Grid ones = make_grid({1, 1});
  REQUIRE(ones.ndim == 1);
  CHECK(ones.n[0] == 1);
}

TEST_CASE("tiles are near-cubic, within target, and cover the grid exactly once", "[tiling]") {
  const std::vector<std::vector<int64_t>> shapes = {{7}, {1000}, {32, 32}, {5, 9}, {3, 4, 5}, {16, 16, 16}};
  for (const auto& shape : shapes) {
    const Grid g = make_grid(shape);
    int64_t tile[kMaxGridDims];
    choose_tile(g, 32, tile);
    int64_t vol = 1;
    for (int d = 0; d < g.ndim; ++d) {
      REQUIRE(tile[d] >= 1);
      REQUIRE(tile[d] <= g.n[d]);
      vol *= tile[d];
    }
    REQUIRE(vol <= 32);
    int64_t N = 1;
    for (int d = 0; d < g.ndim; ++d) N *= g.n[d];
    std::vector<int> hits(N, 0);
    const int64_t count = num_tiles(g, tile);
    for (int64_t i = 0; i < count; ++i) {
      const Box b = tile_box(g, tile, i);
      REQUIRE(box_volume(b, g.ndim) >= 1);
      int64_t ext[kMaxGridDims], c[kMaxGridDims];
      for (int d = 0; d < g.ndim; ++d) ext[d] = b.hi[d] - b.lo[d];
      for (int64_t r = 0; r < box_volume(b, g.ndim); ++r) {
        unravel_index(r, ext, g.ndim, c);
        for (int d = 0; d < g.ndim; ++d) c[d] += b.lo[d];
        hits[ravel_index(c, g.n, g.ndim)] += 1;
      }
    }
    for (int h : hits) REQUIRE(h == 1);
  }
  const Grid g = make_grid({32, 32});
  int64_t tile[kMaxGridDims];
  choose_tile(g, 32, tile);
  CHECK(tile[0] * tile[1] == 32);
  CHECK((tile[0] == 4 || tile[0] == 8));
}

TEST_CASE("key region: span box around the tile, clipped; causal stops at the tile", "[tiling]") {
  const Grid g = make_grid({10, 12});
  const Box tile = make_box(4, 6, 0, 4);
  const AxisLimit limits[] = {make_axis_limit(10, 2, 9, 9, 1, false),
                              make_axis_limit(12, 3, 11, 11, 1, false)};  // span boxes of half widths 2, 3
  const Box r = key_region(g, tile, limits, false);
  CHECK(r.lo[0] == 2);
  CHECK(r.hi[0] == 8);
  CHECK(r.lo[1] == 0);
  CHECK(r.hi[1] == 7);
  const Box all = key_region(g, tile, nullptr, false);
  CHECK(box_volume(all, 2) == 120);
  const Box causal = key_region(g, tile, nullptr, true);
  CHECK(causal.hi[0] == 6);
  CHECK(causal.hi[1] == 12);
}

TEST_CASE("key region of a shifted window: the union of its queries' windows", "[tiling]") {
  const Grid g = make_grid({10, 12});
  const Box tile = make_box(0, 2, 8, 12);
  const AxisLimit limits[] = {make_axis_limit(10, 9, 2, 2, 1, true),
                              make_axis_limit(12, 11, 1, 1, 1, true)};  // 5-cell and 3-cell windows
  const Box r = key_region(g, tile, limits, false);
  CHECK(r.lo[0] == 0);
  CHECK(r.hi[0] == 5);  // queries 0 and 1 both see 0..4
  CHECK(r.lo[1] == 7);  // query 8 sees 7..9
  CHECK(r.hi[1] == 12);
}

TEST_CASE("chunks partition the region and stay near the target size", "[tiling]") {
  const std::vector<std::vector<int64_t>> shapes = {{3000}, {40, 40}, {7, 9, 11}, {2, 300}};
  for (const auto& shape : shapes) {
    const Grid g = make_grid(shape);
    Box region;
    for (int d = 0; d < g.ndim; ++d) {
      region.lo[d] = g.n[d] > 2 ? 1 : 0;
      region.hi[d] = g.n[d];
    }
    for (int64_t target : {1, 64, 1024}) {
      const ChunkPlan plan = plan_chunks(g, region, target);
      int64_t N = 1;
      for (int d = 0; d < g.ndim; ++d) N *= g.n[d];
      std::vector<int> hits(N, 0);
      int64_t covered = 0;
      for (int64_t i = 0; i < plan.count; ++i) {
        const Box b = chunk_box(g, plan, i);
        const int64_t vol = box_volume(b, g.ndim);
        REQUIRE(vol >= 1);
        // Only the last axis alone may exceed the target.
        if (g.ndim > 1 || target >= 1) REQUIRE((vol <= target || plan.split == g.ndim - 1));
        int64_t ext[kMaxGridDims], c[kMaxGridDims];
        for (int d = 0; d < g.ndim; ++d) ext[d] = b.hi[d] - b.lo[d];
        for (int64_t r = 0; r < vol; ++r) {
          unravel_index(r, ext, g.ndim, c);
          for (int d = 0; d < g.ndim; ++d) {
            c[d] += b.lo[d];
            REQUIRE(c[d] >= region.lo[d]);
            REQUIRE(c[d] < region.hi[d]);
          }
          hits[ravel_index(c, g.n, g.ndim)] += 1;
        }
        covered += vol;
      }
      CHECK(covered == box_volume(region, g.ndim));
      for (int h : hits) REQUIRE(h <= 1);
    }
  }
}

TEST_CASE("tile target: dense tiles are large; with a span box, the union of boxes stays small", "[tiling]") {
  const int64_t shape[] = {32, 32};
  const Grid g = squeeze_grid(shape, 2);
  CHECK(tile_target(g, nullptr, 64, 8) == 64);
  const int64_t h5[] = {5, 5}, h11[] = {11, 11}, h0[] = {0, 0}, wide[] = {31, 31};
  CHECK(tile_target(g, h5, 64, 8) == 8);     // 2x4 tile: 12x14 keys for 11x11 boxes (1.39x)
  CHECK(tile_target(g, h11, 64, 8) == 32);   // 4x8 tile: 26x30 keys for 23x23 boxes (1.47x)
  CHECK(tile_target(g, h0, 64, 8) == 8);     // one key per query: never below the minimum
  CHECK(tile_target(g, wide, 64, 8) == 64);  // a box as large as the grid: dense tiles
  for (const int64_t* half : {h5, h11}) {    // the union of the chosen tile's boxes is <= 1.5x a box
    const int64_t target = tile_target(g, half, 64, 8);
    int64_t tile[kMaxGridDims];
    choose_tile(g, target, tile);
    const double box = static_cast<double>((2 * half[0] + 1) * (2 * half[1] + 1));
    CHECK((tile[0] + 2 * half[0]) * (tile[1] + 2 * half[1]) <= 1.5 * box);
  }
}

TEST_CASE("query region: exactly the queries whose key ranges meet the key box", "[tiling]") {
  // Per axis: (n, span, win, shift), as in AxisLimit; the grid is 2-D.
  const std::vector<std::vector<AxisLimit>> cases = {
      {make_axis_limit(9, 8, 8, 8, 1, false),
       make_axis_limit(11, 10, 10, 10, 1, false)},  // no limit: the whole grid
      {make_axis_limit(9, 2, 8, 8, 1, false), make_axis_limit(11, 3, 10, 10, 1, false)},  // span boxes
      {make_axis_limit(9, 8, 1, 1, 1, true),
       make_axis_limit(11, 10, 2, 2, 1, true)},  // shifted windows (border queries look one way)
      {make_axis_limit(9, 8, 4, 4, 1, true),
       make_axis_limit(11, 10, 5, 5, 1, true)},  // windows as large as the axis
      {make_axis_limit(9, 1, 3, 3, 1, true),
       make_axis_limit(11, 2, 1, 1, 1, false)},  // a span inside a shifted window; a plain window
      // NATTEN's vocabulary: even kernels, strided query groups, causal axes
      {make_axis_limit(9, 8, 2, 1, 2, true), make_axis_limit(11, 10, 3, 2, 3, false)},
      {make_axis_limit(9, 8, 2, 1, 1, false, true), make_axis_limit(11, 10, 1, 1, 3, true, true)},
      {make_axis_limit(9, 2, 3, 3, 4, true), make_axis_limit(11, 10, 1, 0, 2, false, true)},
  };
  for (const auto& lim : cases) {
    const Grid g = make_grid({lim[0].n, lim[1].n});
    for (bool causal : {false, true}) {
      for (int64_t t0 : {1, 2, 4}) {
        const int64_t tile[kMaxGridDims] = {t0, 3};
        for (int64_t ti = 0; ti < num_tiles(g, tile); ++ti) {
          const Box kb = tile_box(g, tile, ti);
          const Box r = query_region(g, kb, lim.data(), causal);
          int64_t need_lo[2] = {g.n[0], g.n[1]}, need_hi[2] = {-1, -1};  // the kept queries' bounding box
          for (int64_t q0 = 0; q0 < g.n[0]; ++q0)
            for (int64_t q1 = 0; q1 < g.n[1]; ++q1) {
              const int64_t qc[2] = {q0, q1};
              bool any = false;
              for (int64_t k0 = kb.lo[0]; k0 < kb.hi[0]; ++k0)
                for (int64_t k1 = kb.lo[1]; k1 < kb.hi[1]; ++k1) {
                  const int64_t kc[2] = {k0, k1};
                  bool keep = !causal || k0 * g.n[1] + k1 <= q0 * g.n[1] + q1;
                  for (int d = 0; d < 2; ++d) {
                    int64_t lo, hi;
                    axis_key_range(lim[d], qc[d], lo, hi);
                    keep = keep && kc[d] >= lo && kc[d] <= hi;
                  }
                  any = any || keep;
                }
              if (!any) continue;
              for (int d = 0; d < 2; ++d) {
                REQUIRE(qc[d] >= r.lo[d]);
                REQUIRE(qc[d] < r.hi[d]);
                need_lo[d] = std::min(need_lo[d], qc[d]);
                need_hi[d] = std::max(need_hi[d], qc[d]);
              }
            }
          if (!causal) {  // tight: the region is the kept queries' bounding box
            for (int d = 0; d < 2; ++d) {
              CHECK(r.lo[d] == need_lo[d]);
              CHECK(r.hi[d] == need_hi[d] + 1);
            }
          } else if (need_hi[0] >= 0) {  // causal: nothing before the box's first outer coordinate
            CHECK(r.lo[0] == std::max(need_lo[0], kb.lo[0]));
          }
        }
      }
    }
  }
  const Grid g = make_grid({9, 11});
  const Box kb = make_box(3, 5, 0, 11);
  const Box all = query_region(g, kb, nullptr, false);
  CHECK(box_volume(all, 2) == 99);
  const Box causal = query_region(g, kb, nullptr, true);
  CHECK(causal.lo[0] == 3);
  CHECK(causal.hi[0] == 9);
}
