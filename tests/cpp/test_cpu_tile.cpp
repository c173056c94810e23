// The CPU tiled kernel's geometry (cpu/relpos_tile.h) against the index math of
// grid_index.h: for every query of a tile and every key of a chunk, the
// offset-box entry base[r] + line_e[l] + t is the offset k - q, and the rel row
// that for_each_offset_line gives that entry is offset_row(k - q).
#include <catch2/catch.hpp>

#include <vector>

#include "cpu/relpos_tile.h"

using namespace posattn;
using namespace posattn::relpos::cpu_kernels;

namespace {

Problem dense_problem(std::vector<int64_t> grid) {
  RelposShape s;
  s.B = 1;
  s.H = 1;
  s.D = 4;
  s.Dv = 4;
  s.N = 1;
  for (int64_t n : grid) s.N *= n;
  s.grid = grid;
  s.has_pos = true;
  return make_problem(make_relpos_params(s, 0.0, 1.0, false), at::Tensor());
}

}  // namespace

TEST_CASE("offset-box entries and rel rows of every (query, key) pair", "[cpu_tile]") {
  const std::vector<std::vector<int64_t>> grids = {{9}, {5, 6}, {1, 7}, {3, 4, 5}, {2, 3, 2, 3}, {12, 12}};
  for (const auto& grid : grids) {
    const Problem p = dense_problem(grid);
    const int G = p.g.ndim;
    for (int64_t ti = 0; ti < p.ntiles; ++ti) {
      TileGeom t;
      build_tile(p, ti, t);
      // chunks of a few shapes over the whole grid
      for (int64_t target : {int64_t{1}, int64_t{5}, int64_t{64}}) {
        tiling::Box whole;
        for (int d = 0; d < G; ++d) whole.hi[d] = p.g.n[d];
        const tiling::ChunkPlan plan = tiling::plan_chunks(p.g, whole, target);
        for (int64_t ci = 0; ci < plan.count; ++ci) {
          ChunkGeom c;
          build_chunk(p, 0, t, tiling::chunk_box(p.g, plan, ci), c);
          std::vector<int64_t> entry_row(c.R, -1);
          for_each_offset_line(p, c, [&](int64_t bl, int64_t row) {
            for (int64_t x = 0; x < c.W[G - 1]; ++x) entry_row[bl * c.W[G - 1] + x] = row + x;
          });
          for (int64_t r = 0; r < t.Bq; ++r)
            for (int64_t l = 0; l < c.nlines; ++l)
              for (int64_t x = 0; x < c.L; ++x) {
                const int64_t e = c.base[r] + c.line_e[l] + x;
                REQUIRE(e >= 0);
                REQUIRE(e < c.R);
                int64_t delta[kMaxGridDims];
                for (int d = 0; d < G; ++d) delta[d] = c.line_coord[l * G + d] - t.coord[r * G + d];
                delta[G - 1] += x;
                CHECK(entry_row[e] == offset_row(delta, p.g.n, G));
                // and the key part of the bias / rel row, as the kernels use it
                CHECK(c.line_row[l] + x - t.qrow[r] == offset_row(delta, p.g.n, G));
              }
        }
      }
    }
  }
}
