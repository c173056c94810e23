// Geometry of the CPU tiled kernel: one query tile (a box on the grid) and one
// key chunk seen from it (its lines, and the offset box of the relative
// embeddings they span). In a header of its own so that tests/cpp can check it
// against the index math of grid_index.h.
#pragma once

#include <cstdint>
#include <vector>

#include "../core/grid_index.h"
#include "relpos_problem.h"
#include "../core/relpos_tiling.h"

namespace posattn {
namespace relpos {
namespace cpu_kernels {

// Geometry of one query tile and of one key chunk seen from it.
struct TileGeom {
  Box box;
  int64_t Bq = 0;
  std::vector<int64_t> tok;    // (Bq) token index of each query, ascending
  std::vector<int64_t> coord;  // (Bq, G) grid coordinates
  std::vector<int64_t> qrow;   // (Bq) query part of an offset's rel / bias row: sum_d coord_d rel_stride_d
};

inline void build_tile(const Problem& p, int64_t index, TileGeom& t) {
  const int G = p.g.ndim;
  t.box = tiling::tile_box(p.g, p.tile, index);
  t.Bq = tiling::box_volume(t.box, G);
  t.tok.resize(t.Bq);
  t.coord.resize(t.Bq * G);
  t.qrow.resize(t.Bq);
  int64_t ext[kMaxGridDims], c[kMaxGridDims];
  for (int d = 0; d < G; ++d) ext[d] = t.box.hi[d] - t.box.lo[d];
  for (int64_t r = 0; r < t.Bq; ++r) {
    unravel_index(r, ext, G, c);
    for (int d = 0; d < G; ++d) {
      c[d] += t.box.lo[d];
      t.coord[r * G + d] = c[d];
    }
    t.tok[r] = ravel_index(c, p.g.n, G);
    int64_t qr = 0;
    for (int d = 0; d < G; ++d) qr += c[d] * p.rel_stride[d];
    t.qrow[r] = qr;
  }
}

// A key chunk is a box of keys, stored as lines along the last axis (each
// line is contiguous in memory). The offsets between the tile and the chunk
// form the "offset box" of W_d = chunk extent + tile extent - 1 per axis;
// the entry for query r and key (line l, position t) is base[r] + line_e[l] + t.
struct ChunkGeom {
  Box box;
  int64_t Bk = 0, L = 0, nlines = 0;
  std::vector<int64_t> line_tok;    // first token of each line
  std::vector<int64_t> line_e;      // offset-box index of the line (minus the query part)
  std::vector<int64_t> line_coord;  // (nlines, G) coordinates of each line's first key
  std::vector<int64_t> line_row;    // key part of the rel / bias row of (query, line start):
                                    // sum_d (k_d + n_d - 1) rel_stride_d, minus the query's qrow
  bool contiguous = false;          // keys are tokens line_tok[0] .. line_tok[0] + Bk - 1
  int64_t W[kMaxGridDims] = {}, Wstride[kMaxGridDims] = {};
  int64_t olo[kMaxGridDims] = {};  // smallest offset of the box per axis
  int64_t R = 0;
  int64_t rel_first_row = 0;
  bool rel_contiguous = false;  // box rows are rel rows first .. first + R - 1
  std::vector<int64_t> base;    // (Bq) query part of the offset-box index
};

inline void build_chunk(const Problem& p, int64_t h, const TileGeom& t, const Box& box, ChunkGeom& c) {
  const int G = p.g.ndim;
  const int64_t* half = p.half_of(h);
  c.box = box;
  int64_t ext[kMaxGridDims] = {};
  for (int d = 0; d < G; ++d) ext[d] = box.hi[d] - box.lo[d];
  c.Bk = tiling::box_volume(box, G);
  c.L = ext[G - 1];
  c.nlines = c.Bk / c.L;
  // Offset box: every offset between the tile and the chunk or, with a span
  // box, only those inside it (the others are masked and never read).
  c.R = 1;
  for (int d = G - 1; d >= 0; --d) {
    int64_t lo = box.lo[d] - (t.box.hi[d] - 1);
    int64_t hi = box.hi[d] - 1 - t.box.lo[d];
    if (half != nullptr) {
      lo = std::max(lo, -half[d]);
      hi = std::min(hi, half[d]);
    }
    c.olo[d] = lo;
    c.W[d] = hi - lo + 1;
    c.Wstride[d] = c.R;
    c.R *= c.W[d];
  }
  // Lines.
  c.line_tok.resize(c.nlines);
  c.line_e.resize(c.nlines);
  c.line_coord.resize(c.nlines * G);
  c.line_row.resize(c.nlines);
  int64_t k[kMaxGridDims];
  for (int64_t l = 0; l < c.nlines; ++l) {
    unravel_index(l, ext, G - 1, k);
    k[G - 1] = 0;
    int64_t e = 0;
    for (int d = 0; d < G; ++d) {
      e += k[d] * c.Wstride[d];
      k[d] += box.lo[d];
      c.line_coord[l * G + d] = k[d];
    }
    c.line_e[l] = e;
    c.line_tok[l] = ravel_index(k, p.g.n, G);
    int64_t row = 0;
    for (int d = 0; d < G; ++d) row += (k[d] + p.g.n[d] - 1) * p.rel_stride[d];
    c.line_row[l] = row;
  }
  c.contiguous = c.line_tok[c.nlines - 1] + c.L - c.line_tok[0] == c.Bk;
  // Rows of rel covered by the offset box.
  if (p.has_pos) {
    int64_t first = 0, last = 0;
    for (int d = 0; d < G; ++d) {
      first += (c.olo[d] + p.g.n[d] - 1) * p.rel_stride[d];
      last += (c.olo[d] + c.W[d] - 1 + p.g.n[d] - 1) * p.rel_stride[d];
    }
    c.rel_first_row = first;
    c.rel_contiguous = last - first + 1 == c.R;
  }
  // Entry of (query r, key k) = sum_d (k_d - q_d - olo_d) Wstride_d, split into
  // a key part (line_e, above) and this query part; it may be negative for
  // pairs outside the box, which are masked and never looked up.
  c.base.resize(t.Bq);
  for (int64_t r = 0; r < t.Bq; ++r) {
    int64_t e = 0;
    for (int d = 0; d < G; ++d) e += (box.lo[d] - t.coord[r * G + d] - c.olo[d]) * c.Wstride[d];
    c.base[r] = e;
  }
}

// Calls fn(box_line_index, first_rel_row) for every line of the offset box
// along the last axis (each covers W_last consecutive rows of rel).
template <typename Fn>
void for_each_offset_line(const Problem& p, const ChunkGeom& c, Fn fn) {
  const int G = p.g.ndim;
  const int64_t nbl = c.R / c.W[G - 1];
  int64_t e[kMaxGridDims];
  for (int64_t bl = 0; bl < nbl; ++bl) {
    unravel_index(bl, c.W, G - 1, e);
    int64_t row = (c.olo[G - 1] + p.g.n[G - 1] - 1) * p.rel_stride[G - 1];
    for (int d = 0; d < G - 1; ++d) row += (c.olo[d] + e[d] + p.g.n[d] - 1) * p.rel_stride[d];
    fn(bl, row);
  }
}

}  // namespace cpu_kernels
}  // namespace relpos
}  // namespace posattn
