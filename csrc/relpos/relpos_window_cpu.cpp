// Windowed CPU kernels of relpos_attention (see relpos_window_cpu.h).
//
// Layout. Queries are taken in runs of up to kRun consecutive cells along the
// grid's last axis (a "line"). Keys and values of a (b, h) are transposed once
// into line-major, feature-major buffers with `pad` = h_last zero cells on
// either side of each line: kt[(line * D + d) * Lk + pad + x] = k[line, x, d].
// For a run starting at x0, the keys at last-axis offset dx of line `kl` are
// then kt[(kl * D + d) * Lk + pad + x0 + dx + i], i = 0 .. run length - 1: one
// shifted vector load per feature, whatever dx.
//
// Scores live in an (offset box rows x run) block S: row r = (outer offset,
// dx), lane i = query x0 + i. Per row, the span term and the bias are
// constants (they only depend on the offset), the queries that keep the row's
// keys (inside the grid, the span box and the window) are a lane range, and
// causal masking drops whole rows (key - query in token order is constant
// along a row). The positional term q_pos . rel[offset] is one GEMM per run
// against the box's rows of rel, which every query of the run shares.
//
// Memory per thread: the transposed keys/values of one (b, h) (and, in the
// backward, their gradients), and three (box rows x kRun) blocks.
#include "relpos_window_cpu.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "../common/cpu_blas.h"
#include "../common/cpu_vec.h"

namespace posattn {
namespace relpos_cpu {
namespace {

constexpr int64_t kRun = 64;  // queries per run: a multiple of every vector width below
constexpr int64_t kMaxBox = 16384;  // the automatic choice's largest box (3 blocks of ~6 MiB in float32)

using cpu::lanes_in;
using cpu::Vec;
using cpu::vload;
using cpu::vselect;
using cpu::vsplat;
using cpu::vstore;

inline int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// ---------------------------------------------------------------------------
// The box of one head: outer offsets (axes 0 .. G-2) times last-axis offsets.
struct Window {
  int G = 0;
  int64_t L = 0, nlines = 0, Lp = 0, pad = 0, Lk = 0;
  int64_t nx = 0, nob = 0, nbox = 0;
  std::vector<int64_t> ob_off;    // (nob, G) outer offsets (the last entry unused)
  std::vector<int64_t> ob_delta;  // (nob) token delta of the outer offset
  std::vector<int64_t> ob_rel;    // (nob) rel row of (outer offset, dx = -pad)
};

Window make_window(const Problem& p, int64_t h, int W) {
  Window w;
  const int G = p.g.ndim;
  const int64_t* half = p.half_of(h);
  w.G = G;
  w.L = p.g.n[G - 1];
  w.nlines = p.N / w.L;
  w.Lp = round_up(w.L, W);
  w.pad = half[G - 1];
  w.Lk = w.Lp + 2 * w.pad + W;  // + W: the backward's last gathered vector may run past a line
  w.nx = 2 * w.pad + 1;
  int64_t ext[kMaxGridDims] = {};
  w.nob = 1;
  for (int d = 0; d < G - 1; ++d) {
    ext[d] = 2 * half[d] + 1;
    w.nob *= ext[d];
  }
  w.nbox = w.nob * w.nx;
  int64_t tokstride[kMaxGridDims] = {}, stride = 1;  // token-order stride of each axis
  for (int d = G - 1; d >= 0; --d) {
    tokstride[d] = stride;
    stride *= p.g.n[d];
  }
  w.ob_off.assign(w.nob * G, 0);
  w.ob_delta.resize(w.nob);
  w.ob_rel.resize(w.nob);
  int64_t e[kMaxGridDims] = {};
  for (int64_t ob = 0; ob < w.nob; ++ob) {
    unravel_index(ob, ext, G - 1, e);
    int64_t delta = 0, row = (p.g.n[G - 1] - 1 - w.pad) * p.rel_stride[G - 1];
    for (int d = 0; d < G - 1; ++d) {
      const int64_t o = e[d] - half[d];
      w.ob_off[ob * G + d] = o;
      delta += o * tokstride[d];
      row += (o + p.g.n[d] - 1) * p.rel_stride[d];
    }
    w.ob_delta[ob] = delta;
    w.ob_rel[ob] = row;
  }
  return w;
}

// Per-row constants of a head: the span term depends only on the offset, and
// so does the bias. The logits of a row are s = acc * mul - sub, with acc =
// q.k + q_pos.rel: mul = scale (no span, add mode) or scale * exp(-quad)
// (multiply mode), sub = quad - bias (add mode) or -bias * exp(-quad)
// (multiply mode); the gradient before the span is dA = dS * gain, gain =
// exp(-quad) in multiply mode, else 1. The span's factors are those of the
// tiled kernel; with a bias the order of the additions differs from it (a
// few ulps).
template <typename T>
struct RowConst {
  std::vector<T> mul, sub, gain;
};

template <typename T>
RowConst<T> make_row_const(const Problem& p, const SpanTables<T>* st, const T* biash, const Window& w,
                           int64_t h) {
  RowConst<T> rc;
  const int G = w.G;
  const T scale = static_cast<T>(p.scale);
  rc.mul.assign(w.nbox, scale);
  rc.sub.assign(w.nbox, T(0));
  rc.gain.assign(w.nbox, T(1));
  for (int64_t ob = 0; ob < w.nob; ++ob) {
    T cq = T(0);
    if (st != nullptr)
      for (int d = 0; d < G - 1; ++d) cq += st->quad_at(h, d)[w.ob_off[ob * G + d]];
    const T gc = static_cast<T>(std::exp(-static_cast<double>(cq)));
    for (int64_t j = 0; j < w.nx; ++j) {
      const int64_t r = ob * w.nx + j, dx = j - w.pad;
      const T b = biash != nullptr ? biash[w.ob_rel[ob] + j] : T(0);
      if (st == nullptr) {
        rc.sub[r] = -b;
      } else if (p.mode == SpanMode::kAdd) {
        rc.sub[r] = cq + st->quad_at(h, G - 1)[dx] - b;
      } else {
        const T g = gc * st->gauss_at(h, G - 1)[dx];
        rc.mul[r] = scale * g;
        rc.sub[r] = -b * g;
        rc.gain[r] = g;
      }
    }
  }
  return rc;
}

// A run of queries: `n` cells from x0 on query line `line`.
struct Run {
  int64_t line = 0, x0 = 0, n = 0, np = 0;
  int64_t coord[kMaxGridDims] = {};  // outer coordinates of the line
};

Run make_run(const Problem& p, const Window& w, int64_t unit, int W) {
  Run run;
  const int64_t per_line = (w.L + kRun - 1) / kRun;
  run.line = unit / per_line;
  run.x0 = unit % per_line * kRun;
  run.n = std::min(kRun, w.L - run.x0);
  run.np = round_up(run.n, W);
  unravel_index(run.line, p.g.n, w.G - 1, run.coord);
  return run;
}

// A kept row of the score block: its key line, last-axis offset and the lanes
// whose key lies inside the grid.
struct Row {
  int64_t r = 0, kl = 0, dx = 0, ilo = 0, ihi = 0;
};

// The rows of the box a run keeps (sorted by key line, then dx), with the
// lanes of each whose key the query keeps. Along the last axis a query x
// keeps the offsets dx in [lo(x) - x, hi(x) - x] (axis_key_range); both ends
// never increase with x, so the lanes keeping a given dx are an interval.
void kept_rows(const Problem& p, const Window& w, int64_t h, const Run& run, std::vector<Row>& rows,
               std::vector<char>& valid, std::vector<int64_t>& dlo, std::vector<int64_t>& dhi) {
  const int G = w.G;
  const AxisLimit* lim = p.limits_of(h);
  rows.clear();
  valid.assign(w.nbox, 0);
  int64_t klo[kMaxGridDims], khi[kMaxGridDims];
  for (int d = 0; d < G - 1; ++d) axis_key_range(lim[d], run.coord[d], klo[d], khi[d]);
  dlo.resize(run.n);
  dhi.resize(run.n);
  for (int64_t i = 0; i < run.n; ++i) {
    const int64_t x = run.x0 + i;
    axis_key_range(lim[G - 1], x, dlo[i], dhi[i]);
    dlo[i] -= x;
    dhi[i] -= x;
  }
  for (int64_t ob = 0; ob < w.nob; ++ob) {
    int64_t kl = 0;
    bool inside = true;
    for (int d = 0; d < G - 1; ++d) {
      const int64_t c = run.coord[d] + w.ob_off[ob * G + d];
      if (c < klo[d] || c > khi[d]) inside = false;
      kl = kl * p.g.n[d] + c;
    }
    if (!inside) continue;
    for (int64_t j = 0; j < w.nx; ++j) {
      Row row;
      row.r = ob * w.nx + j;
      row.kl = kl;
      row.dx = j - w.pad;
      if (p.causal && w.ob_delta[ob] + row.dx > 0) continue;  // every key of the row comes later
      const int64_t dx = row.dx;
      row.ilo = std::partition_point(dlo.begin(), dlo.end(), [dx](int64_t v) { return v > dx; }) - dlo.begin();
      row.ihi = std::partition_point(dhi.begin(), dhi.end(), [dx](int64_t v) { return v >= dx; }) - dhi.begin();
      if (row.ilo >= row.ihi) continue;
      valid[row.r] = 1;
      rows.push_back(row);
    }
  }
}

// ---------------------------------------------------------------------------
// Inner loops.

// For u < U: out_u[i] (+)= sum_d a[d * lda + i] * b[d * ldb + i + shift_u], then
// fin(u, i, value) is stored. All lanes 0 .. np - 1.
template <typename T, int U, typename Fin>
inline void shifted_dots(const T* a, int64_t lda, const T* b, int64_t ldb, const int64_t* shift,
                         int64_t D, int64_t np, T* const* out, bool accumulate, Fin fin) {
  using V = typename Vec<T>::V;
  constexpr int W = Vec<T>::W;
  for (int64_t i = 0; i < np; i += W) {
    V acc[U];
    for (int u = 0; u < U; ++u) acc[u] = accumulate ? vload(out[u] + i) : V{};
    const T* bi = b + i;
    for (int64_t d = 0; d < D; ++d) {
      const V av = vload(a + d * lda + i);
      const T* bd = bi + d * ldb;
      for (int u = 0; u < U; ++u) acc[u] += av * vload(bd + shift[u]);
    }
    for (int u = 0; u < U; ++u) vstore(out[u] + i, fin(u, i, acc[u]));
  }
}

// shifted_dots for a run-time number of rows U <= 4.
template <typename T, typename Fin>
inline void shifted_dots_n(int U, const T* a, int64_t lda, const T* b, int64_t ldb, const int64_t* shift,
                           int64_t D, int64_t np, T* const* out, bool accumulate, Fin fin) {
  switch (U) {
    case 4: shifted_dots<T, 4>(a, lda, b, ldb, shift, D, np, out, accumulate, fin); break;
    case 3: shifted_dots<T, 3>(a, lda, b, ldb, shift, D, np, out, accumulate, fin); break;
    case 2: shifted_dots<T, 2>(a, lda, b, ldb, shift, D, np, out, accumulate, fin); break;
    default: shifted_dots<T, 1>(a, lda, b, ldb, shift, D, np, out, accumulate, fin); break;
  }
}

// outT[(d0 + u) * np + i] = sum_r w_r[i] * src_r[(d0 + u) * lds + i] for u < U.
template <typename T, int U>
inline void weighted_sum(const T* const* wrow, const T* const* src, int64_t nrows, int64_t lds,
                         int64_t d0, int64_t np, T* outT) {
  using V = typename Vec<T>::V;
  constexpr int W = Vec<T>::W;
  for (int64_t i = 0; i < np; i += W) {
    V acc[U];
    for (int u = 0; u < U; ++u) acc[u] = V{};
    for (int64_t r = 0; r < nrows; ++r) {
      const V wv = vload(wrow[r] + i);
      const T* s = src[r] + d0 * lds + i;
      for (int u = 0; u < U; ++u) acc[u] += wv * vload(s + u * lds);
    }
    for (int u = 0; u < U; ++u) vstore(outT + (d0 + u) * np + i, acc[u]);
  }
}

template <typename T>
void weighted_sum_all(const T* const* wrow, const T* const* src, int64_t nrows, int64_t lds,
                      int64_t Dn, int64_t np, T* outT) {
  int64_t d = 0;
  for (; d + 8 <= Dn; d += 8) weighted_sum<T, 8>(wrow, src, nrows, lds, d, np, outT);
  for (; d + 4 <= Dn; d += 4) weighted_sum<T, 4>(wrow, src, nrows, lds, d, np, outT);
  for (; d < Dn; ++d) weighted_sum<T, 1>(wrow, src, nrows, lds, d, np, outT);
}

// The key side of the backward (dK += dC q, dV += P dO) for the kept rows of
// one key line, gathered rather than scattered: for each vector of keys j
// (relative to the run's x0), the rows whose queries j - dx_r fall in the run
// are summed in registers, then dst is updated once:
//   dst[d * ldd + j] += sum_r c_r[j - dx_r] * src[d * lds + j - dx_r].
// Rows are sorted by dx; c_r and src rows hold W zeros on either side of
// their np lanes, so partially overlapping vectors read zeros.
template <typename T, int U>
inline void gather_block(const T* const* c, const int64_t* dx, int64_t m, const T* src, int64_t lds,
                         int64_t d0, int64_t np, T* dst, int64_t ldd) {
  using V = typename Vec<T>::V;
  constexpr int W = Vec<T>::W;
  int64_t r0 = 0, r1 = 0;
  for (int64_t j = dx[0]; j < dx[m - 1] + np; j += W) {
    while (r0 < m && dx[r0] <= j - np) ++r0;  // rows whose queries all lie before j
    while (r1 < m && dx[r1] < j + W) ++r1;    // rows whose first query reaches j + W - 1
    V acc[U];
    for (int u = 0; u < U; ++u) acc[u] = vload(dst + (d0 + u) * ldd + j);
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t o = j - dx[r];
      const V cv = vload(c[r] + o);
      const T* sp = src + d0 * lds + o;
      for (int u = 0; u < U; ++u) acc[u] += cv * vload(sp + u * lds);
    }
    for (int u = 0; u < U; ++u) vstore(dst + (d0 + u) * ldd + j, acc[u]);
  }
}

template <typename T>
void gather_line(const T* const* c, const int64_t* dx, int64_t m, const T* src, int64_t lds,
                 int64_t Dn, int64_t np, T* dst, int64_t ldd) {
  if (m == 0) return;
  int64_t d = 0;
  for (; d + 8 <= Dn; d += 8) gather_block<T, 8>(c, dx, m, src, lds, d, np, dst, ldd);
  for (; d + 4 <= Dn; d += 4) gather_block<T, 4>(c, dx, m, src, lds, d, np, dst, ldd);
  for (; d < Dn; ++d) gather_block<T, 1>(c, dx, m, src, lds, d, np, dst, ldd);
}

// Line-major, feature-major copy of a (N, Dn) matrix with `pad` zeros on either
// side of each line (see the file comment).
template <typename T>
void to_lines(const T* src, const Window& w, int64_t Dn, std::vector<T>& dst) {
  dst.assign(w.nlines * Dn * w.Lk, T(0));
  for (int64_t line = 0; line < w.nlines; ++line)
    for (int64_t x = 0; x < w.L; ++x) {
      const T* s = src + (line * w.L + x) * Dn;
      T* o = dst.data() + line * Dn * w.Lk + w.pad + x;
      for (int64_t d = 0; d < Dn; ++d) o[d * w.Lk] = s[d];
    }
}

// dst[(line * L + x) * Dn + d] += src[(line * Dn + d) * Lk + pad + x].
template <typename T>
void add_from_lines(const std::vector<T>& src, const Window& w, int64_t Dn, T* dst) {
  for (int64_t line = 0; line < w.nlines; ++line)
    for (int64_t x = 0; x < w.L; ++x) {
      const T* s = src.data() + line * Dn * w.Lk + w.pad + x;
      T* o = dst + (line * w.L + x) * Dn;
      for (int64_t d = 0; d < Dn; ++d) o[d] += s[d * w.Lk];
    }
}

// (n, Dn) rows -> (Dn, ld) block: row d holds lanes 0 .. np - 1 at dst + d * ld,
// zero past n and, when `padded`, W zeros on either side (ld = np + 2 W).
template <typename T>
void run_transpose(const T* rows, int64_t n, int64_t np, int64_t Dn, T* dst, int64_t ld, int padw) {
  for (int64_t d = 0; d < Dn; ++d) {
    T* o = dst + d * ld;
    std::fill(o - padw, o, T(0));
    for (int64_t i = 0; i < n; ++i) o[i] = rows[i * Dn + d];
    std::fill(o + n, o + np + padw, T(0));
  }
}

template <typename T>
struct Buf {
  std::vector<T> kt, vt, dkt, dvt, qt, dot, s, pb, dc, outT, relbox, drelbox, lane;
  std::vector<Row> rows;
  std::vector<char> valid;
  std::vector<int64_t> dlo, dhi;
  std::vector<const T*> wp, sp;
  std::vector<int64_t> dx;
  static T* get(std::vector<T>& v, int64_t n) {
    if (static_cast<int64_t>(v.size()) < n) v.resize(n);
    return v.data();
  }
};

// Final logits of a run into S (nbox x np): positional GEMM, q.k over the
// kept rows, scale and span, lanes outside the grid = -inf. Rows not kept are
// left as they are (never read).
template <typename T>
void run_scores(const Problem& p, const Window& w, const RowConst<T>& rc, const Run& run,
                const std::vector<Row>& rows, const T* qt, int64_t ldq, const T* kt,
                const T* qpos_rows, const T* relbox, T* S) {
  using V = typename Vec<T>::V;
  const int64_t D = p.D, np = run.np;
  const bool pos = qpos_rows != nullptr;
  if (pos)
    cpu::gemm<T>(false, true, w.nbox, run.n, D, T(1), relbox, D, qpos_rows, D, T(0), S, np);
  const V ninf = vsplat<T>(neg_inf<T>());
  const Row* rp = rows.data();
  const int64_t nrows = static_cast<int64_t>(rows.size());
  for (int64_t a = 0; a < nrows;) {
    // Up to 4 consecutive rows on the same key line share the loads of q.
    int U = 1;
    while (U < 4 && a + U < nrows && rp[a + U].kl == rp[a].kl) ++U;
    const T* b = kt + rp[a].kl * D * w.Lk + w.pad + run.x0;
    int64_t shift[4];
    T* out[4];
    V sub[4], mul[4];
    int64_t lo[4], hi[4];
    for (int u = 0; u < U; ++u) {
      const Row& row = rp[a + u];
      shift[u] = row.dx;
      out[u] = S + row.r * np;
      lo[u] = row.ilo;
      hi[u] = row.ihi;
      sub[u] = vsplat<T>(rc.sub[row.r]);
      mul[u] = vsplat<T>(rc.mul[row.r]);
    }
    // (qk + pos) * mul - sub (see RowConst).
    auto fin = [&](int u, int64_t i, V acc) {
      const V s = acc * mul[u] - sub[u];
      return vselect<T>(lanes_in<T>(i, lo[u], hi[u]), s, ninf);
    };
    shifted_dots_n<T>(U, qt, ldq, b, w.Lk, shift, D, np, out, pos, fin);
    a += U;
  }
}

// (Dn, np) block: the sum over the kept rows of weights[row] (a row of the
// score block, stride wld) times the row's shifted run of `lines` (Dn features).
template <typename T>
const T* rows_times_shifted(Buf<T>& bf, const T* weights, int64_t wld, const std::vector<T>& lines,
                            int64_t Dn, const Window& w, const Run& run) {
  const int64_t nrows = static_cast<int64_t>(bf.rows.size());
  bf.wp.resize(nrows);
  bf.sp.resize(nrows);
  for (int64_t a = 0; a < nrows; ++a) {
    const Row& row = bf.rows[a];
    bf.wp[a] = weights + row.r * wld;
    bf.sp[a] = lines.data() + row.kl * Dn * w.Lk + w.pad + run.x0 + row.dx;
  }
  T* outT = Buf<T>::get(bf.outT, Dn * run.np);
  weighted_sum_all<T>(bf.wp.data(), bf.sp.data(), nrows, w.Lk, Dn, run.np, outT);
  return outT;
}

template <typename T>
void gather_relbox(const Window& w, const T* relh, int64_t D, T* relbox) {
  for (int64_t ob = 0; ob < w.nob; ++ob)
    std::memcpy(relbox + ob * w.nx * D, relh + w.ob_rel[ob] * D, w.nx * D * sizeof(T));
}

}  // namespace

bool use_window(const Problem& p) {
  // POSATTN_CPU_KERNEL=tiled|window overrides the choice (tests run both
  // kernels on every case; benchmarks compare them). Checked on every call, so
  // that a misspelt value is an error even where it would change nothing.
  int force = 0;  // 1: window, -1: tiled
  if (const char* env = std::getenv("POSATTN_CPU_KERNEL")) {
    const std::string f(env);
    TORCH_CHECK_VALUE(f.empty() || f == "auto" || f == "tiled" || f == "window",
                      "POSATTN_CPU_KERNEL must be 'auto', 'tiled' or 'window', got '", f, "'");
    force = f == "window" ? 1 : f == "tiled" ? -1 : 0;
  }
  if (!p.has_box || p.N <= 0 || p.D <= 0 || p.Dv <= 0) return false;
  if (force != 0) return force > 0;
  const int G = p.g.ndim;
  const int64_t L = p.g.n[G - 1];
  if (round_up(L, Vec<float>::W) * 2 > 3 * L) return false;  // short lines waste most vector lanes
  // The largest box (as a fraction of the keys) for which the windowed kernel
  // is the faster one: the tiled kernel's GEMMs gain with the head dim.
  // Measured fwd+bwd break-even on 2 cores (BENCHMARKS.md): about 1/2 of the
  // keys at D = 8, 0.45 at 16, 0.28 at 32, 0.22 at 64.
  const double limit = p.D <= 16 ? 0.5 : p.D <= 32 ? 0.25 : 0.2;
  for (int64_t h = 0; h < p.H; ++h) {
    int64_t box = 1, keys = 1;  // offsets in the box; keys a query keeps away from the borders
    for (int d = 0; d < G; ++d) {
      const AxisLimit& lim = p.limits_of(h)[d];
      box *= 2 * p.half_of(h)[d] + 1;
      keys *= 2 * std::min(lim.span, lim.win) + 1;
    }
    // kMaxBox bounds the per-thread score blocks (box rows x (kRun + 2 W)).
    if (static_cast<double>(keys) > limit * static_cast<double>(p.N) || box > kMaxBox) return false;
  }
  return true;
}

int64_t window_units(const Problem& p) {
  const int64_t L = p.g.n[p.g.ndim - 1];
  return p.N / L * ((L + kRun - 1) / kRun);
}

template <typename T>
void window_forward(const Problem& p, const SpanTables<T>* st, const ForwardPtrs<T>& args) {
  const T *q = args.q, *k = args.k, *v = args.v, *qpos = args.qpos, *rel = args.rel;
  T *out = args.out, *lse = args.lse;
  using V = typename Vec<T>::V;
  constexpr int W = Vec<T>::W;
  const int64_t D = p.D, Dv = p.Dv, N = p.N;
  const int64_t units = window_units(p);
  const BackwardSplit split = choose_split(p.B, p.H, units, at::get_num_threads());
  at::parallel_for(0, split.tasks(p.H), 1, [&](int64_t begin, int64_t end) {
    const cpu::FlushDenormals flush;
    Buf<T> bf;
    for (int64_t task = begin; task < end; ++task) {
      const TaskRange tr = task_range(split, task, p.B, units);
      const int64_t h = tr.h, b0 = tr.b0, b1 = tr.b1, u0 = tr.u0, u1 = tr.u1;
      const Window w = make_window(p, h, W);
      const RowConst<T> rc = make_row_const(p, st, args.bias != nullptr ? args.bias + h * p.U : nullptr, w, h);
      T* relbox = nullptr;
      if (p.has_pos) {
        relbox = Buf<T>::get(bf.relbox, w.nbox * D);
        gather_relbox(w, rel + h * p.U * D, D, relbox);
      }
      for (int64_t b = b0; b < b1; ++b) {
        const int64_t bh = b * p.H + h;
        to_lines(k + bh * N * D, w, D, bf.kt);
        to_lines(v + bh * N * Dv, w, Dv, bf.vt);
        for (int64_t unit = u0; unit < u1; ++unit) {
          const Run run = make_run(p, w, unit, W);
          const int64_t np = run.np, tok0 = run.line * w.L + run.x0;
          kept_rows(p, w, h, run, bf.rows, bf.valid, bf.dlo, bf.dhi);
          T* qt = Buf<T>::get(bf.qt, D * np);
          run_transpose(q + (bh * N + tok0) * D, run.n, np, D, qt, np, 0);
          T* S = Buf<T>::get(bf.s, w.nbox * np);
          run_scores<T>(p, w, rc, run, bf.rows, qt, np, bf.kt.data(),
                        p.has_pos ? qpos + (bh * N + tok0) * D : nullptr, relbox, S);
          // Softmax over the kept rows, lane by lane (NaN sticks, as in the tiled kernel).
          T* lane = Buf<T>::get(bf.lane, 2 * np);  // m, l per lane
          for (int64_t i = 0; i < np; i += W) {
            V m = vsplat<T>(neg_inf<T>());
            typename Vec<T>::I nan = {};
            for (const Row& row : bf.rows) {
              const V s = vload(S + row.r * np + i);
              nan |= (s != s);
              m = vselect<T>(s > m, s, m);
            }
            m = vselect<T>(nan, vsplat<T>(std::numeric_limits<T>::quiet_NaN()), m);
            const V shift = vselect<T>(m == vsplat<T>(neg_inf<T>()), V{}, m);
            V l = V{};
            for (const Row& row : bf.rows) {
              T* sp = S + row.r * np + i;
              const V e = Vec<T>::exp(vload(sp) - shift);
              vstore(sp, e);
              l += e;
            }
            vstore(lane + i, m);
            vstore(lane + np + i, l);
          }
          // out^T = sum over rows of P times the rows' shifted values.
          const T* outT = rows_times_shifted(bf, S, np, bf.vt, Dv, w, run);
          for (int64_t i = 0; i < run.n; ++i) {
            const T m = lane[i], l = lane[np + i];
            T* orow = out + (bh * N + tok0 + i) * Dv;
            if (m == std::numeric_limits<T>::infinity()) {  // a +inf logit: lse +inf, a NaN row (exp(inf - inf))
              std::fill(orow, orow + Dv, std::numeric_limits<T>::quiet_NaN());
              lse[bh * N + tok0 + i] = m;
            } else if (m != neg_inf<T>()) {
              const T inv = T(1) / l;
              for (int64_t d = 0; d < Dv; ++d) orow[d] = outT[d * np + i] * inv;
              lse[bh * N + tok0 + i] = m + std::log(l);
            } else {  // every key masked: zeros, not NaN
              std::fill(orow, orow + Dv, T(0));
              lse[bh * N + tok0 + i] = neg_inf<T>();
            }
          }
        }
      }
    }
  });
}

template <typename T>
void window_backward(const Problem& p, const SpanTables<T>* st, const BackwardPtrs<T>& args,
                     BackwardSplit split) {
  const T *q = args.q, *k = args.k, *v = args.v, *qpos = args.qpos, *rel = args.rel, *out = args.out,
          *lse = args.lse, *gout = args.gout, *glse = args.glse;
  T *dq = args.dq, *dk_acc = args.dk_acc, *dv_acc = args.dv_acc, *dqpos = args.dqpos,
    *drel_part = args.drel_part;
  double* dsig_part = args.dsig_part;
  using V = typename Vec<T>::V;
  constexpr int W = Vec<T>::W;
  const int64_t D = p.D, Dv = p.Dv, N = p.N;
  const int G = p.g.ndim;
  const int64_t units = window_units(p);
  const int64_t nparts = split.nparts;
  at::parallel_for(0, split.tasks(p.H), 1, [&](int64_t begin, int64_t end) {
    const cpu::FlushDenormals flush;
    Buf<T> bf;
    std::vector<double> dsig_row, dbias_row;  // per row of the box: sum of dquad, of dA
    for (int64_t task = begin; task < end; ++task) {
      const TaskRange tr = task_range(split, task, p.B, units);
      const int64_t h = tr.h, b0 = tr.b0, b1 = tr.b1, u0 = tr.u0, u1 = tr.u1, part = tr.part;
      const Window w = make_window(p, h, W);
      const RowConst<T> rc = make_row_const(p, st, args.bias != nullptr ? args.bias + h * p.U : nullptr, w, h);
      dsig_row.assign(w.nbox, 0.0);
      dbias_row.assign(w.nbox, 0.0);
      T *relbox = nullptr, *drelbox = nullptr;
      if (p.has_pos) {
        relbox = Buf<T>::get(bf.relbox, w.nbox * D);
        gather_relbox(w, rel + h * p.U * D, D, relbox);
        drelbox = Buf<T>::get(bf.drelbox, w.nbox * D);
        std::fill(drelbox, drelbox + w.nbox * D, T(0));
      }
      for (int64_t b = b0; b < b1; ++b) {
        const int64_t bh = b * p.H + h;
        to_lines(k + bh * N * D, w, D, bf.kt);
        to_lines(v + bh * N * Dv, w, Dv, bf.vt);
        bf.dkt.assign(w.nlines * D * w.Lk, T(0));
        bf.dvt.assign(w.nlines * Dv * w.Lk, T(0));
        for (int64_t unit = u0; unit < u1; ++unit) {
          const Run run = make_run(p, w, unit, W);
          const int64_t np = run.np, n = run.n, tok0 = run.line * w.L + run.x0;
          kept_rows(p, w, h, run, bf.rows, bf.valid, bf.dlo, bf.dhi);
          const int64_t nrows = static_cast<int64_t>(bf.rows.size());
          // Blocks with W zero lanes on either side of each row (see gather_block).
          const int64_t ld = np + 2 * W;
          T* qt = Buf<T>::get(bf.qt, D * ld) + W;
          run_transpose(q + (bh * N + tok0) * D, n, np, D, qt, ld, W);
          T* dot = Buf<T>::get(bf.dot, Dv * ld) + W;
          run_transpose(gout + (bh * N + tok0) * Dv, n, np, Dv, dot, ld, W);
          // Per lane: rowd = dO . O - dlse, and the lse to subtract (+inf where
          // every key was masked, so that P = 0 there).
          T* lane = Buf<T>::get(bf.lane, 2 * np);
          for (int64_t i = 0; i < np; ++i) {
            if (i < n) {
              const int64_t t = bh * N + tok0 + i;
              lane[i] = cpu::dot(gout + t * Dv, out + t * Dv, Dv) - (glse != nullptr ? glse[t] : T(0));
              lane[np + i] = lse[t] == neg_inf<T>() ? std::numeric_limits<T>::infinity() : lse[t];
            } else {
              lane[i] = T(0);
              lane[np + i] = std::numeric_limits<T>::infinity();
            }
          }
          const T* qpos_rows = p.has_pos ? qpos + (bh * N + tok0) * D : nullptr;
          T* S = Buf<T>::get(bf.s, w.nbox * np);
          run_scores<T>(p, w, rc, run, bf.rows, qt, ld, bf.kt.data(), qpos_rows, relbox, S);
          // dP = dO . v (shifted), into dc.
          T* dc = Buf<T>::get(bf.dc, w.nbox * ld) + W;
          T* pb = Buf<T>::get(bf.pb, w.nbox * ld) + W;
          for (int64_t a = 0; a < nrows;) {
            int U = 1;
            while (U < 4 && a + U < nrows && bf.rows[a + U].kl == bf.rows[a].kl) ++U;
            const T* vb = bf.vt.data() + bf.rows[a].kl * Dv * w.Lk + w.pad + run.x0;
            int64_t shift[4];
            T* o[4];
            for (int u = 0; u < U; ++u) {
              shift[u] = bf.rows[a + u].dx;
              o[u] = dc + bf.rows[a + u].r * ld;
            }
            auto id = [](int, int64_t, V x) { return x; };
            shifted_dots_n<T>(U, dot, ld, vb, w.Lk, shift, Dv, np, o, false, id);
            a += U;
          }
          // P = exp(s - lse); dS = P (dP - rowd); dA = dS gain; dC = scale dA = dS mul.
          for (const Row& row : bf.rows) {
            T* sr = S + row.r * np;
            T* pr = pb + row.r * ld;
            T* cr = dc + row.r * ld;
            std::fill(pr - W, pr, T(0));
            std::fill(pr + np, pr + np + W, T(0));
            std::fill(cr - W, cr, T(0));
            std::fill(cr + np, cr + np + W, T(0));
            const bool mul_mode = st != nullptr && p.mode != SpanMode::kAdd;
            const V cscale = vsplat<T>(rc.mul[row.r]);
            V dq_acc = V{}, ds_acc = V{};
            for (int64_t i = 0; i < np; i += W) {
              const auto keep = lanes_in<T>(i, row.ilo, row.ihi);
              const V s = vload(sr + i);
              const V pv = Vec<T>::exp(s - vload(lane + np + i));
              vstore(pr + i, pv);
              const V ds = vselect<T>(keep, pv * (vload(cr + i) - vload(lane + i)), V{});
              // dquad = -dS (add) or -dS * s (multiply).
              dq_acc -= mul_mode ? vselect<T>(keep, ds * s, V{}) : ds;
              ds_acc += ds;
              vstore(cr + i, ds * cscale);
            }
            if (st != nullptr) {
              double sum = 0.0;
              for (int l = 0; l < W; ++l) sum += static_cast<double>(dq_acc[l]);
              dsig_row[row.r] += sum;
            }
            if (args.bias != nullptr) {
              double sum = 0.0;
              for (int l = 0; l < W; ++l) sum += static_cast<double>(ds_acc[l]);
              dbias_row[row.r] += sum * static_cast<double>(rc.gain[row.r]);
            }
          }
          // dQ^T = sum over rows of dC times the rows' shifted keys.
          const T* dqT = rows_times_shifted(bf, dc, ld, bf.kt, D, w, run);
          for (int64_t i = 0; i < n; ++i) {
            T* o = dq + (bh * N + tok0 + i) * D;
            for (int64_t d = 0; d < D; ++d) o[d] = dqT[d * np + i];
          }
          // dK += dC q, dV += P dO: one gather per key line (rows are grouped by
          // key line and sorted by dx within it).
          bf.dx.resize(nrows);
          for (int64_t a = 0; a < nrows;) {
            int64_t e = a;
            while (e < nrows && bf.rows[e].kl == bf.rows[a].kl) {
              bf.dx[e] = bf.rows[e].dx;
              bf.wp[e] = dc + bf.rows[e].r * ld;
              bf.sp[e] = pb + bf.rows[e].r * ld;
              ++e;
            }
            const int64_t kl = bf.rows[a].kl, off = w.pad + run.x0;
            gather_line<T>(bf.wp.data() + a, bf.dx.data() + a, e - a, qt, ld, D, np,
                           bf.dkt.data() + kl * D * w.Lk + off, w.Lk);
            gather_line<T>(bf.sp.data() + a, bf.dx.data() + a, e - a, dot, ld, Dv, np,
                           bf.dvt.data() + kl * Dv * w.Lk + off, w.Lk);
            a = e;
          }
          if (p.has_pos) {
            // Rows not kept take no part: zero them before the GEMMs read them.
            for (int64_t r = 0; r < w.nbox; ++r)
              if (!bf.valid[r]) std::fill(dc + r * ld, dc + r * ld + np, T(0));
            cpu::gemm<T>(true, false, n, D, w.nbox, T(1), dc, ld, relbox, D, T(0),
                         dqpos + (bh * N + tok0) * D, D);
            cpu::gemm<T>(false, false, w.nbox, D, n, T(1), dc, ld, qpos_rows, D, T(1), drelbox, D);
          }
        }
        add_from_lines(bf.dkt, w, D, dk_acc + (bh * nparts + part) * N * D);
        add_from_lines(bf.dvt, w, Dv, dv_acc + (bh * nparts + part) * N * Dv);
      }
      if (p.has_pos) {
        T* dr = drel_part + task * p.U * D;
        for (int64_t ob = 0; ob < w.nob; ++ob) {
          T* dst = dr + w.ob_rel[ob] * D;
          const T* src = drelbox + ob * w.nx * D;
          for (int64_t i = 0; i < w.nx * D; ++i) dst[i] += src[i];
        }
      }
      if (args.bias != nullptr) {
        T* db = args.dbias_part + task * p.U;
        for (int64_t ob = 0; ob < w.nob; ++ob)
          for (int64_t j = 0; j < w.nx; ++j) db[w.ob_rel[ob] + j] += static_cast<T>(dbias_row[ob * w.nx + j]);
      }
      if (st != nullptr) {
        // d sigma accumulator: sum over pairs of dquad * x_d^2, per axis.
        double* acc = dsig_part + task * G;
        for (int64_t ob = 0; ob < w.nob; ++ob)
          for (int64_t j = 0; j < w.nx; ++j) {
            const double sq = dsig_row[ob * w.nx + j];
            if (sq == 0.0) continue;
            for (int d = 0; d < G - 1; ++d)
              acc[d] += sq * static_cast<double>(st->xsq_at(d)[w.ob_off[ob * G + d]]);
            acc[G - 1] += sq * static_cast<double>(st->xsq_at(G - 1)[j - w.pad]);
          }
      }
    }
  });
}

template void window_forward<float>(const Problem&, const SpanTables<float>*, const ForwardPtrs<float>&);
template void window_forward<double>(const Problem&, const SpanTables<double>*, const ForwardPtrs<double>&);
template void window_backward<float>(const Problem&, const SpanTables<float>*, const BackwardPtrs<float>&,
                                     BackwardSplit);
template void window_backward<double>(const Problem&, const SpanTables<double>*, const BackwardPtrs<double>&,
                                      BackwardSplit);

}  // namespace relpos_cpu
}  // namespace posattn
