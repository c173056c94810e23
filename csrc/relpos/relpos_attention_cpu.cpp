// CPU entry points of posattn::relpos_attention, which run the windowed
// kernels (relpos_window_cpu.h) for small span boxes, and the tiled kernels
// below otherwise: flash-attention style forward
// (online softmax over key chunks) and backward (recomputed from the saved
// log-sum-exp), with the relative positional term computed per (query tile,
// key chunk) as one small GEMM against the box of offsets the pair spans.
//
// Memory: besides inputs and outputs, per-thread tiles (Bq x chunk keys,
// Bq x offset box, offset box x D) and, in the backward, one (U, D) d`rel`
// accumulator per task. Nothing is N x N.
#include <ATen/Parallel.h>
#include <torch/library.h>
#include <torch/types.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "../common/cpu_blas.h"
#include "../common/cpu_vec.h"
#include "../common/tensor_args.h"
#include "../common/grid_index.h"
#include "relpos_checks.h"
#include "relpos_cpu_problem.h"
#include "relpos_cpu_tile.h"
#include "relpos_tiling.h"
#include "relpos_window_cpu.h"

namespace posattn {
namespace {

using namespace relpos_cpu;
using cpu::map_vec;
using cpu::Vec;
using cpu::vsplat;

constexpr int64_t kChunkTarget = 1024;

// What query r sees of line l: keys t in [t0, t1) are kept (the rest are
// masked); `dl0` is the last-axis offset of key t = 0 and `row0` its row of
// rel and bias; `cq` the span's quadratic term from the other axes. Returns
// false if the whole line is masked.
template <typename T>
struct LineView {
  int64_t t0, t1, dl0, row0;
  T cq;
};

template <typename T>
inline bool line_view(const Problem& p, const SpanTables<T>* st, int64_t h, const TileGeom& t,
                      const ChunkGeom& c, int64_t r, int64_t l, LineView<T>& v) {
  const int G = p.g.ndim;
  const int64_t* qc = &t.coord[r * G];
  const int64_t* lc = &c.line_coord[l * G];
  const AxisLimit* lim = p.limits_of(h);
  int64_t lo, hi;
  v.t0 = 0;
  v.t1 = c.L;
  v.cq = T(0);
  v.row0 = c.line_row[l] - t.qrow[r];
  v.dl0 = lc[G - 1] - qc[G - 1];
  if (lim == nullptr && st == nullptr) {  // dense, no span: only causal masks
    if (p.causal) v.t1 = std::min<int64_t>(v.t1, t.tok[r] - c.line_tok[l] + 1);
    return v.t0 < v.t1;
  }
  for (int d = 0; d < G - 1; ++d) {
    if (lim != nullptr) {
      axis_key_range(lim[d], qc[d], lo, hi);
      if (lc[d] < lo || lc[d] > hi) return false;
    }
    if (st != nullptr) v.cq += st->quad_at(h, d)[lc[d] - qc[d]];
  }
  if (lim != nullptr) {
    axis_key_range(lim[G - 1], qc[G - 1], lo, hi);
    v.t0 = std::max<int64_t>(v.t0, lo - lc[G - 1]);
    v.t1 = std::min<int64_t>(v.t1, hi - lc[G - 1] + 1);
  }
  if (p.causal) v.t1 = std::min<int64_t>(v.t1, t.tok[r] - c.line_tok[l] + 1);
  return v.t0 < v.t1;
}

// Logits of n kept keys from their raw products sk (in place), the positional
// products tp and the bias bp (either may be null):
//   a = scale (sk + tp) + bp;  s = a | a - (cq + quad) | a * gc * gauss.
enum class Span { kNone, kAdd, kMultiply };

template <typename T, bool kPos, bool kBias, Span kSpan>
void finish_keys(T* __restrict sk, const T* __restrict tp, const T* __restrict bp, const T* __restrict sd,
                 T scale, T c, int64_t n) {
  using V = typename Vec<T>::V;
  const V sv = vsplat<T>(scale), cv = vsplat<T>(c);
  map_vec<T>(sk, n, [&](auto ld) {
    V a = ld(sk);
    if constexpr (kPos) a = a + ld(tp);
    a = sv * a;
    if constexpr (kBias) a = a + ld(bp);
    if constexpr (kSpan == Span::kAdd) a = a - (cv + ld(sd));
    if constexpr (kSpan == Span::kMultiply) a = a * (cv * ld(sd));
    return a;
  });
}

template <typename T, Span kSpan>
void finish_keys_span(bool pos, bool bias, T* sk, const T* tp, const T* bp, const T* sd, T scale, T c,
                      int64_t n) {
  if (pos && bias) finish_keys<T, true, true, kSpan>(sk, tp, bp, sd, scale, c, n);
  else if (pos) finish_keys<T, true, false, kSpan>(sk, tp, bp, sd, scale, c, n);
  else if (bias) finish_keys<T, false, true, kSpan>(sk, tp, bp, sd, scale, c, n);
  else finish_keys<T, false, false, kSpan>(sk, tp, bp, sd, scale, c, n);
}

// Final logits of query r (Bk, masked = -inf) against a chunk, from its raw
// products with the keys (in `srow` on entry), Tb = Qpos relbox^T (Bq x R)
// and the head's bias row `biash` (U).
template <typename T>
void finish_row(const Problem& p, const SpanTables<T>* st, int64_t h, const TileGeom& t,
                const ChunkGeom& c, const T* Tb, const T* biash, int64_t r, T* srow) {
  const T scale = static_cast<T>(p.scale);
  const int G = p.g.ndim;
  if (!p.has_box && st == nullptr && !p.causal) {  // every key kept: no masks, no span
    const bool pos = Tb != nullptr, bias = biash != nullptr;
    const T* tr = pos ? Tb + r * c.R + c.base[r] : nullptr;
    const T* br = bias ? biash - t.qrow[r] : nullptr;
    for (int64_t l = 0; l < c.nlines; ++l)
      finish_keys_span<T, Span::kNone>(pos, bias, srow + l * c.L, pos ? tr + c.line_e[l] : nullptr,
                                       bias ? br + c.line_row[l] : nullptr, nullptr, scale, T(0), c.L);
    return;
  }
  for (int64_t l = 0; l < c.nlines; ++l) {
    T* __restrict sl = srow + l * c.L;
    LineView<T> v;
    if (!line_view<T>(p, st, h, t, c, r, l, v)) {
      std::fill(sl, sl + c.L, neg_inf<T>());
      continue;
    }
    std::fill(sl, sl + v.t0, neg_inf<T>());
    std::fill(sl + v.t1, sl + c.L, neg_inf<T>());
    // The kept keys t0 .. t1 - 1 of the line, in one pass (the offset-box
    // entries of masked keys may lie outside the box).
    const int64_t n = v.t1 - v.t0;
    T* sk = sl + v.t0;
    const T* tp = Tb != nullptr ? Tb + r * c.R + (c.base[r] + c.line_e[l] + v.t0) : nullptr;
    const T* bp = biash != nullptr ? biash + v.row0 + v.t0 : nullptr;
    const bool pos = tp != nullptr, bias = bp != nullptr;
    if (st == nullptr) {
      finish_keys_span<T, Span::kNone>(pos, bias, sk, tp, bp, nullptr, scale, T(0), n);
    } else if (p.mode == SpanMode::kAdd) {
      finish_keys_span<T, Span::kAdd>(pos, bias, sk, tp, bp, st->quad_at(h, G - 1) + v.dl0 + v.t0, scale,
                                      v.cq, n);
    } else {
      const T gc = static_cast<T>(std::exp(-static_cast<double>(v.cq)));
      finish_keys_span<T, Span::kMultiply>(pos, bias, sk, tp, bp, st->gauss_at(h, G - 1) + v.dl0 + v.t0,
                                           scale, gc, n);
    }
  }
}

// Growable per-thread scratch.
template <typename T>
struct Scratch {
  std::vector<T> qt, qpt, acc, s, tb, relbox, kbuf, vbuf;             // forward and backward
  std::vector<T> dot, dqt, dqpt, pbuf, dc, dtb, dkc, dvc, drelbox, line;  // backward only
  std::vector<T> m, l, rowd, lser;
  static T* get(std::vector<T>& v, int64_t n) {
    if (static_cast<int64_t>(v.size()) < n) v.resize(n);
    return v.data();
  }
};

template <typename T>
void gather_rows(const T* src, const std::vector<int64_t>& rows, int64_t width, T* dst) {
  for (size_t r = 0; r < rows.size(); ++r)
    std::memcpy(dst + r * width, src + rows[r] * width, width * sizeof(T));
}

// Pointers to the chunk's keys and values: straight into k/v when the chunk
// is contiguous, else gathered line by line into scratch.
template <typename T>
void chunk_kv(const ChunkGeom& c, const T* kbh, const T* vbh, int64_t D, int64_t Dv,
              Scratch<T>& sc, const T*& kc, const T*& vc) {
  if (c.contiguous) {
    kc = kbh + c.line_tok[0] * D;
    vc = vbh + c.line_tok[0] * Dv;
    return;
  }
  T* kb = Scratch<T>::get(sc.kbuf, c.Bk * D);
  T* vb = Scratch<T>::get(sc.vbuf, c.Bk * Dv);
  for (int64_t l = 0; l < c.nlines; ++l) {
    std::memcpy(kb + l * c.L * D, kbh + c.line_tok[l] * D, c.L * D * sizeof(T));
    std::memcpy(vb + l * c.L * Dv, vbh + c.line_tok[l] * Dv, c.L * Dv * sizeof(T));
  }
  kc = kb;
  vc = vb;
}

// The rows of rel (one head) covered by the chunk's offset box, as an R x D matrix.
template <typename T>
const T* chunk_relbox(const Problem& p, const ChunkGeom& c, const T* relh, Scratch<T>& sc) {
  const int64_t D = p.D;
  if (c.rel_contiguous) return relh + c.rel_first_row * D;
  T* rb = Scratch<T>::get(sc.relbox, c.R * D);
  const int64_t wl = c.W[p.g.ndim - 1];
  for_each_offset_line(p, c, [&](int64_t bl, int64_t row) {
    std::memcpy(rb + bl * wl * D, relh + row * D, wl * D * sizeof(T));
  });
  return rb;
}

// Raw products and final logits of a tile against a chunk, into sc.s; calls
// row_fn(r, srow) on each row as soon as it is final (while it is in L1: the
// softmax passes over it follow at once, not after the whole tile).
template <typename T, typename RowFn>
T* tile_chunk_scores(const Problem& p, const SpanTables<T>* st, int64_t h, const TileGeom& t,
                     const ChunkGeom& c, const T* qt, const T* qpt, const T* kc,
                     const T* relbox, const T* biash, Scratch<T>& sc, RowFn row_fn) {
  T* s = Scratch<T>::get(sc.s, t.Bq * c.Bk);
  cpu::gemm<T>(false, true, t.Bq, c.Bk, p.D, T(1), qt, p.D, kc, p.D, T(0), s, c.Bk);
  T* tb = nullptr;
  if (p.has_pos) {
    tb = Scratch<T>::get(sc.tb, t.Bq * c.R);
    cpu::gemm<T>(false, true, t.Bq, c.R, p.D, T(1), qpt, p.D, relbox, p.D, T(0), tb, c.R);
  }
  for (int64_t r = 0; r < t.Bq; ++r) {
    T* srow = s + r * c.Bk;
    finish_row<T>(p, st, h, t, c, tb, biash, r, srow);
    row_fn(r, srow);
  }
  return s;
}

// ---------------------------------------------------------------------------
// Forward.
template <typename T>
void forward_kernel(const Problem& p, const SpanTables<T>* st, const ForwardPtrs<T>& a) {
  const T *q = a.q, *k = a.k, *v = a.v, *qpos = a.qpos, *rel = a.rel;
  T *out = a.out, *lse = a.lse;
  const int64_t D = p.D, Dv = p.Dv, N = p.N;
  const int64_t total = p.B * p.H * p.ntiles;
  at::parallel_for(0, total, 1, [&](int64_t begin, int64_t end) {
    const cpu::FlushDenormals flush;  // far keys' tiny weights must not be denormals
    Scratch<T> sc;
    TileGeom t;
    ChunkGeom c;
    for (int64_t task = begin; task < end; ++task) {
      const int64_t bh = task / p.ntiles;
      const int64_t h = bh % p.H;
      build_tile(p, task % p.ntiles, t);
      const int64_t Bq = t.Bq;
      const T* qbh = q + bh * N * D;
      const T* kbh = k + bh * N * D;
      const T* vbh = v + bh * N * Dv;
      T* qt = Scratch<T>::get(sc.qt, Bq * D);
      gather_rows(qbh, t.tok, D, qt);
      T* qpt = nullptr;
      if (p.has_pos) {
        qpt = Scratch<T>::get(sc.qpt, Bq * D);
        gather_rows(qpos + bh * N * D, t.tok, D, qpt);
      }
      T* acc = Scratch<T>::get(sc.acc, Bq * Dv);
      std::fill(acc, acc + Bq * Dv, T(0));
      T* m = Scratch<T>::get(sc.m, Bq);
      T* l = Scratch<T>::get(sc.l, Bq);
      std::fill(m, m + Bq, neg_inf<T>());
      std::fill(l, l + Bq, T(0));

      const Box region = tiling::key_region(p.g, t.box, p.limits_of(h), p.causal);
      const tiling::ChunkPlan plan = tiling::plan_chunks(p.g, region, kChunkTarget);
      for (int64_t ci = 0; ci < plan.count; ++ci) {
        build_chunk(p, h, t, tiling::chunk_box(p.g, plan, ci), c);
        if (p.causal && c.line_tok[0] > t.tok[Bq - 1]) continue;
        const T *kc, *vc;
        chunk_kv(c, kbh, vbh, D, Dv, sc, kc, vc);
        const T* relbox = p.has_pos ? chunk_relbox(p, c, rel + h * p.U * D, sc) : nullptr;
        // Online softmax: rescale the running sums to the new row maximum.
        const T* biash = a.bias != nullptr ? a.bias + h * p.U : nullptr;
        T* s = tile_chunk_scores<T>(p, st, h, t, c, qt, qpt, kc, relbox, biash, sc, [&](int64_t r, T* sr) {
          // A NaN (in the logits, or already in m) sticks: it makes the row NaN.
          const T cm = cpu::row_max(sr, c.Bk);
          const T mnew = (cm != cm || m[r] != m[r]) ? cm + m[r] : std::max(m[r], cm);
          if (mnew == neg_inf<T>()) {  // nothing kept yet for this query
            std::fill(sr, sr + c.Bk, T(0));
            return;
          }
          const T sum = cpu::exp_shift_sum(sr, sr, c.Bk, mnew);
          const T alpha = cpu::exp1(m[r] - mnew);
          if (alpha != T(1)) {
            T* ar = acc + r * Dv;
            for (int64_t j = 0; j < Dv; ++j) ar[j] *= alpha;
          }
          l[r] = l[r] * alpha + sum;
          m[r] = mnew;
        });
        cpu::gemm<T>(false, false, Bq, Dv, c.Bk, T(1), s, c.Bk, vc, Dv, T(1), acc, Dv);
      }
      T* obh = out + bh * N * Dv;
      T* lbh = lse + bh * N;
      for (int64_t r = 0; r < Bq; ++r) {
        T* orow = obh + t.tok[r] * Dv;
        if (m[r] == std::numeric_limits<T>::infinity()) {  // a +inf logit: lse +inf and, as its weight is
          std::fill(orow, orow + Dv, std::numeric_limits<T>::quiet_NaN());  // exp(inf - inf), a NaN row
          lbh[t.tok[r]] = m[r];
        } else if (m[r] != neg_inf<T>()) {  // NaN / inf logits or values give NaN rows, as in the reference
          const T inv = T(1) / l[r];
          for (int64_t j = 0; j < Dv; ++j) orow[j] = acc[r * Dv + j] * inv;
          lbh[t.tok[r]] = m[r] + std::log(l[r]);
        } else {  // every key masked: zeros, not NaN
          std::fill(orow, orow + Dv, T(0));
          lbh[t.tok[r]] = neg_inf<T>();
        }
      }
    }
  });
}

// Backward through the span for the kept keys t0 .. t1 - 1 of one (query,
// line): on entry dl holds dP, on exit dA (the gradient of the logit before
// the span, scale (q.k + q_pos.rel) + bias); accumulates
// sum dquad * x_d^2 per axis into dsig_acc (d sigma = -that / sigma^3).
template <typename T>
void line_span_backward(const Problem& p, const SpanTables<T>& st, int64_t h,
                        const LineView<T>& lv, const T* pl, const T* sl, T rd,
                        const int64_t* qc, const int64_t* lc, T* dl, double* dsig_acc,
                        Scratch<T>& sc) {
  const int G = p.g.ndim;
  const T* xl = st.xsq_at(G - 1) + lv.dl0;
  const int64_t n = lv.t1 - lv.t0;
  T sum_dq, sum_dq_x;
  if (p.mode == SpanMode::kAdd) {  // dquad = -dS, dA = dS: one fused pass
    cpu::softmax_backward_line(pl + lv.t0, dl + lv.t0, xl + lv.t0, rd, T(1), n, sum_dq, sum_dq_x);
    sum_dq = -sum_dq;
    sum_dq_x = -sum_dq_x;
  } else {  // dquad = -dS * s, dA = dS * exp(-quad)
    for (int64_t i = lv.t0; i < lv.t1; ++i) dl[i] = pl[i] * (dl[i] - rd);  // dS
    T* dqd = Scratch<T>::get(sc.line, n);
    for (int64_t i = 0; i < n; ++i) dqd[i] = -dl[lv.t0 + i] * sl[lv.t0 + i];
    sum_dq = cpu::sum(dqd, n);
    sum_dq_x = cpu::dot(dqd, xl + lv.t0, n);
    const T* __restrict gd = st.gauss_at(h, G - 1) + lv.dl0;
    const T gc = static_cast<T>(std::exp(-static_cast<double>(lv.cq)));
    for (int64_t i = lv.t0; i < lv.t1; ++i) dl[i] *= gc * gd[i];
  }
  for (int d = 0; d < G - 1; ++d)
    dsig_acc[d] += static_cast<double>(sum_dq) * static_cast<double>(st.xsq_at(d)[lc[d] - qc[d]]);
  dsig_acc[G - 1] += static_cast<double>(sum_dq_x);
}

// dC = dA holds the logits' gradients before the scale, which the GEMMs
// below apply (alpha = scale), so that d bias is their plain sum.
template <typename T>
void backward_kernel(const Problem& p, const SpanTables<T>* st, const BackwardPtrs<T>& a,
                     BackwardSplit split) {
  const T *q = a.q, *k = a.k, *v = a.v, *qpos = a.qpos, *rel = a.rel, *out = a.out, *lse = a.lse,
          *gout = a.gout, *glse = a.glse;
  T *dq = a.dq, *dk_acc = a.dk_acc, *dv_acc = a.dv_acc, *dqpos = a.dqpos, *drel_part = a.drel_part;
  double* dsig_part = a.dsig_part;
  const int64_t D = p.D, Dv = p.Dv, N = p.N, G = p.g.ndim;
  const int64_t nparts = split.nparts;
  at::parallel_for(0, split.tasks(p.H), 1, [&](int64_t begin, int64_t end) {
    const cpu::FlushDenormals flush;
    Scratch<T> sc;
    TileGeom t;
    ChunkGeom c;
    for (int64_t task = begin; task < end; ++task) {
      const TaskRange tr = task_range(split, task, p.B, p.ntiles);
      const int64_t h = tr.h, b0 = tr.b0, b1 = tr.b1, tile0 = tr.u0, tile1 = tr.u1, part = tr.part;
      T* drel_acc = p.has_pos ? drel_part + task * p.U * D : nullptr;
      T* dbias_acc = p.has_bias ? a.dbias_part + task * p.U : nullptr;
      const T* biash = p.has_bias ? a.bias + h * p.U : nullptr;
      double* dsig_acc = dsig_part + task * G;
      const T* relh = p.has_pos ? rel + h * p.U * D : nullptr;
      for (int64_t b = b0; b < b1; ++b) {
        const int64_t bh = b * p.H + h;
        const T* kbh = k + bh * N * D;
        const T* vbh = v + bh * N * Dv;
        T* dkbh = dk_acc + (bh * nparts + part) * N * D;
        T* dvbh = dv_acc + (bh * nparts + part) * N * Dv;
        for (int64_t ti = tile0; ti < tile1; ++ti) {
          build_tile(p, ti, t);
          const int64_t Bq = t.Bq;
          T* qt = Scratch<T>::get(sc.qt, Bq * D);
          gather_rows(q + bh * N * D, t.tok, D, qt);
          T* qpt = nullptr;
          if (p.has_pos) {
            qpt = Scratch<T>::get(sc.qpt, Bq * D);
            gather_rows(qpos + bh * N * D, t.tok, D, qpt);
          }
          T* dot = Scratch<T>::get(sc.dot, Bq * Dv);
          gather_rows(gout + bh * N * Dv, t.tok, Dv, dot);
          // rowd = rowsum(dO * O) - dlse: the softmax backward's row term.
          T* rowd = Scratch<T>::get(sc.rowd, Bq);
          T* lser = Scratch<T>::get(sc.lser, Bq);
          for (int64_t r = 0; r < Bq; ++r) {
            const T* orow = out + (bh * N + t.tok[r]) * Dv;
            rowd[r] = cpu::dot(dot + r * Dv, orow, Dv) - (glse != nullptr ? glse[bh * N + t.tok[r]] : T(0));
            const T lv = lse[bh * N + t.tok[r]];
            // A query with every key masked has lse = -inf and no gradient.
            lser[r] = lv == neg_inf<T>() ? std::numeric_limits<T>::infinity() : lv;
          }
          T* dqt = Scratch<T>::get(sc.dqt, Bq * D);
          std::fill(dqt, dqt + Bq * D, T(0));
          T* dqpt = nullptr;
          if (p.has_pos) {
            dqpt = Scratch<T>::get(sc.dqpt, Bq * D);
            std::fill(dqpt, dqpt + Bq * D, T(0));
          }
          const Box region = tiling::key_region(p.g, t.box, p.limits_of(h), p.causal);
          const tiling::ChunkPlan plan = tiling::plan_chunks(p.g, region, kChunkTarget);
          for (int64_t ci = 0; ci < plan.count; ++ci) {
            build_chunk(p, h, t, tiling::chunk_box(p.g, plan, ci), c);
            if (p.causal && c.line_tok[0] > t.tok[Bq - 1]) continue;
            const int64_t Bk = c.Bk;
            const T *kc, *vc;
            chunk_kv(c, kbh, vbh, D, Dv, sc, kc, vc);
            const T* relbox = p.has_pos ? chunk_relbox(p, c, relh, sc) : nullptr;
            // dP = dO V^T first, so that each row's probabilities, dS = P (dP -
            // rowd), the chain through the span and dC's copy into the offset
            // box (positional term) follow its logits while they are in L1.
            T* dc = Scratch<T>::get(sc.dc, Bq * Bk);
            cpu::gemm<T>(false, true, Bq, Bk, Dv, T(1), dot, Dv, vc, Dv, T(0), dc, Bk);
            T* pb = Scratch<T>::get(sc.pbuf, Bq * Bk);
            T* dtb = p.has_pos ? Scratch<T>::get(sc.dtb, Bq * c.R) : nullptr;
            const T scale = static_cast<T>(p.scale);
            tile_chunk_scores<T>(p, st, h, t, c, qt, qpt, kc, relbox, biash, sc, [&](int64_t r, T* sr) {
              T* pr = pb + r * Bk;
              cpu::exp_shift_sum(sr, pr, Bk, lser[r]);
              T* dtr = dtb != nullptr ? dtb + r * c.R : nullptr;
              if (dtr != nullptr) std::fill(dtr, dtr + c.R, T(0));
              const T rd = rowd[r];
              const typename Vec<T>::V rdv = vsplat<T>(rd);
              for (int64_t l = 0; l < c.nlines; ++l) {
                T* __restrict dl = dc + r * Bk + l * c.L;  // dP on entry, dC on exit
                LineView<T> lv;
                if (!line_view<T>(p, st, h, t, c, r, l, lv)) {
                  std::fill(dl, dl + c.L, T(0));
                  continue;
                }
                std::fill(dl, dl + lv.t0, T(0));
                std::fill(dl + lv.t1, dl + c.L, T(0));
                const T* __restrict pl = pr + l * c.L;
                T* __restrict tl = dtr != nullptr ? dtr + (c.base[r] + c.line_e[l]) : nullptr;
                const int64_t n = lv.t1 - lv.t0;
                T* __restrict dk = dl + lv.t0;
                T* db = dbias_acc != nullptr ? dbias_acc + lv.row0 + lv.t0 : nullptr;
                if (st == nullptr) {
                  const T* __restrict pk = pl + lv.t0;
                  auto dA = [&](auto ld) { return ld(pk) * (ld(dk) - rdv); };
                  if (db != nullptr) {
                    cpu::map_vec_accumulate<T>(dk, db, n, dA);  // d bias += dA in the same pass
                    db = nullptr;
                  } else {
                    map_vec<T>(dk, n, dA);
                  }
                } else {
                  line_span_backward(p, *st, h, lv, pl, sr + l * c.L, rd, t.coord.data() + r * G,
                                     c.line_coord.data() + l * G, dl, dsig_acc, sc);
                }
                if (tl != nullptr) map_vec<T>(tl + lv.t0, n, [&](auto ld) { return ld(dk); });
                if (db != nullptr) map_vec<T>(db, n, [&](auto ld) { return ld(db) + ld(dk); });
              }
            });
            // dQ += scale dC K, dK += scale dC^T Q, dV += P^T dO.
            cpu::gemm<T>(false, false, Bq, D, Bk, scale, dc, Bk, kc, D, T(1), dqt, D);
            if (c.contiguous) {
              const int64_t k0 = c.line_tok[0];
              cpu::gemm<T>(true, false, Bk, D, Bq, scale, dc, Bk, qt, D, T(1), dkbh + k0 * D, D);
              cpu::gemm<T>(true, false, Bk, Dv, Bq, T(1), pb, Bk, dot, Dv, T(1), dvbh + k0 * Dv,
                           Dv);
            } else {
              T* dkc = Scratch<T>::get(sc.dkc, Bk * D);
              T* dvc = Scratch<T>::get(sc.dvc, Bk * Dv);
              cpu::gemm<T>(true, false, Bk, D, Bq, scale, dc, Bk, qt, D, T(0), dkc, D);
              cpu::gemm<T>(true, false, Bk, Dv, Bq, T(1), pb, Bk, dot, Dv, T(0), dvc, Dv);
              for (int64_t l = 0; l < c.nlines; ++l) {
                T* __restrict kd = dkbh + c.line_tok[l] * D;
                const T* __restrict ks = dkc + l * c.L * D;
                for (int64_t i = 0; i < c.L * D; ++i) kd[i] += ks[i];
                T* __restrict vd = dvbh + c.line_tok[l] * Dv;
                const T* __restrict vs = dvc + l * c.L * Dv;
                for (int64_t i = 0; i < c.L * Dv; ++i) vd[i] += vs[i];
              }
            }
            if (!p.has_pos) continue;
            // Positional term: dQpos += scale dT relbox and d relbox += scale dT^T Qpos.
            cpu::gemm<T>(false, false, Bq, D, c.R, scale, dtb, c.R, relbox, D, T(1), dqpt, D);
            if (c.rel_contiguous) {
              cpu::gemm<T>(true, false, c.R, D, Bq, scale, dtb, c.R, qpt, D, T(1),
                           drel_acc + c.rel_first_row * D, D);
            } else {
              T* drb = Scratch<T>::get(sc.drelbox, c.R * D);
              cpu::gemm<T>(true, false, c.R, D, Bq, scale, dtb, c.R, qpt, D, T(0), drb, D);
              const int64_t wl = c.W[G - 1];
              for_each_offset_line(p, c, [&](int64_t bl, int64_t row) {
                T* __restrict dst = drel_acc + row * D;
                const T* __restrict src = drb + bl * wl * D;
                for (int64_t i = 0; i < wl * D; ++i) dst[i] += src[i];
              });
            }
          }
          for (int64_t r = 0; r < Bq; ++r) {
            std::memcpy(dq + (bh * N + t.tok[r]) * D, dqt + r * D, D * sizeof(T));
            if (p.has_pos)
              std::memcpy(dqpos + (bh * N + t.tok[r]) * D, dqpt + r * D, D * sizeof(T));
          }
        }
      }
    }
  });
}

// ---------------------------------------------------------------------------
// Operator entry points.
void check_cpu(const at::Tensor& q) {
  TORCH_CHECK_VALUE(q.device().is_cpu(), "relpos_attention: the CPU kernel got q on ", q.device());
  TORCH_CHECK_TYPE(q.scalar_type() == at::kFloat || q.scalar_type() == at::kDouble,
                   "relpos_attention (CPU): dtype must be float32 or float64, got ",
                   q.scalar_type());
}

std::tuple<at::Tensor, at::Tensor> relpos_attention_cpu(
    const at::Tensor& q_in, const at::Tensor& k_in, const at::Tensor& v_in,
    const c10::optional<at::Tensor>& q_pos, const c10::optional<at::Tensor>& rel,
    at::IntArrayRef grid, const c10::optional<at::Tensor>& sigma, double threshold,
    c10::string_view span_mode, double scale, bool causal, const c10::optional<at::Tensor>& bias,
    at::OptionalIntArrayRef window, c10::string_view window_border) {
  const RelposShape shape =
      check_relpos_inputs(q_in, k_in, v_in, q_pos, rel, grid, sigma, threshold, std::string(span_mode),
                          scale, bias, window, std::string(window_border));
  check_cpu(q_in);
  if (shape.has_sigma) check_sigma_values_cpu(*sigma);
  const at::Tensor q = q_in.contiguous(), k = k_in.contiguous(), v = v_in.contiguous();
  const at::Tensor qp = opt_contig(q_pos), rl = opt_contig(rel), bs = opt_contig(bias);
  at::Tensor out = at::empty({shape.B, shape.H, shape.N, shape.Dv}, q.options());
  at::Tensor lse = at::empty({shape.B, shape.H, shape.N}, q.options());
  if (shape.B == 0 || shape.H == 0) return {out, lse};
  const Problem p = make_problem(shape, sigma, threshold, scale, causal);
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "relpos_attention_cpu", [&] {
    SpanTables<scalar_t> st;
    if (p.has_sigma) st = make_span_tables<scalar_t>(p, *sigma);
    const ForwardPtrs<scalar_t> a{q.data_ptr<scalar_t>(),      k.data_ptr<scalar_t>(),
                                  v.data_ptr<scalar_t>(),      ptr_or_null<scalar_t>(qp),
                                  ptr_or_null<scalar_t>(rl),   ptr_or_null<scalar_t>(bs),
                                  out.data_ptr<scalar_t>(),    lse.data_ptr<scalar_t>()};
    auto kernel = use_window(p) ? &window_forward<scalar_t> : &forward_kernel<scalar_t>;
    kernel(p, p.has_sigma ? &st : nullptr, a);
  });
  return {out, lse};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>
relpos_attention_backward_cpu(const at::Tensor& grad_out_in,
                              const c10::optional<at::Tensor>& grad_lse, const at::Tensor& q_in,
                              const at::Tensor& k_in, const at::Tensor& v_in,
                              const c10::optional<at::Tensor>& q_pos,
                              const c10::optional<at::Tensor>& rel, at::IntArrayRef grid,
                              const c10::optional<at::Tensor>& sigma, double threshold,
                              c10::string_view span_mode, double scale, bool causal,
                              const at::Tensor& out_in, const at::Tensor& lse_in,
                              const c10::optional<at::Tensor>& bias, at::OptionalIntArrayRef window,
                              c10::string_view window_border) {
  const RelposShape shape =
      check_relpos_inputs(q_in, k_in, v_in, q_pos, rel, grid, sigma, threshold, std::string(span_mode),
                          scale, bias, window, std::string(window_border));
  check_relpos_backward_inputs(shape, q_in, grad_out_in, grad_lse, out_in, lse_in);
  check_cpu(q_in);
  if (shape.has_sigma) check_sigma_values_cpu(*sigma);
  const at::Tensor q = q_in.contiguous(), k = k_in.contiguous(), v = v_in.contiguous();
  const at::Tensor qp = opt_contig(q_pos), rl = opt_contig(rel), gl = opt_contig(grad_lse),
                   bs = opt_contig(bias);
  const at::Tensor gout = grad_out_in.contiguous(), out = out_in.contiguous(),
                   lse = lse_in.contiguous();
  at::Tensor dq = at::empty_like(q);
  at::Tensor dk = at::zeros_like(k);
  at::Tensor dv = at::zeros_like(v);
  at::Tensor dqpos = shape.has_pos ? at::empty_like(q) : at::empty({0}, q.options());
  at::Tensor drel = shape.has_pos ? at::zeros_like(rl) : at::empty({0}, q.options());
  at::Tensor dsigma = shape.has_sigma ? at::zeros_like(*sigma) : at::empty({0}, q.options());
  at::Tensor dbias = shape.has_bias ? at::zeros_like(bs) : at::empty({0}, q.options());
  if (shape.B == 0 || shape.H == 0) return {dq, dk, dv, dqpos, drel, dsigma, dbias};
  const Problem p = make_problem(shape, sigma, threshold, scale, causal);
  // Enough tasks to keep every thread busy (see BackwardSplit).
  const bool window_kernel = use_window(p);
  const BackwardSplit split = choose_split(shape.B, shape.H, window_kernel ? window_units(p) : p.ntiles,
                                           at::get_num_threads());
  const int64_t ntasks = split.tasks(shape.H);
  const int64_t G = p.g.ndim;
  // One task per head (the usual split): its d rel / d bias go straight into
  // drel / dbias. Otherwise per-task partials, summed below (deterministic, no
  // atomics); at 64x64 with a small box the allocation, page faults and sum of
  // those (ntasks, U, D) buffers took a quarter of the backward.
  const bool direct = ntasks == shape.H;
  at::Tensor drel_part = !shape.has_pos ? at::Tensor()
                         : direct       ? drel
                                        : at::zeros({ntasks, p.U, shape.D}, q.options());
  at::Tensor dbias_part = !shape.has_bias ? at::Tensor()
                          : direct        ? dbias
                                          : at::zeros({ntasks, p.U}, q.options());
  at::Tensor dsig_part = at::zeros({ntasks, G}, q.options().dtype(at::kDouble));
  at::Tensor dk_acc = dk, dv_acc = dv;
  if (split.nparts > 1) {
    dk_acc = at::zeros({shape.B, shape.H, split.nparts, shape.N, shape.D}, q.options());
    dv_acc = at::zeros({shape.B, shape.H, split.nparts, shape.N, shape.Dv}, q.options());
  }
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "relpos_attention_backward_cpu", [&] {
    SpanTables<scalar_t> st;
    if (p.has_sigma) st = make_span_tables<scalar_t>(p, *sigma);
    BackwardPtrs<scalar_t> a{};
    a.q = q.data_ptr<scalar_t>();
    a.k = k.data_ptr<scalar_t>();
    a.v = v.data_ptr<scalar_t>();
    a.qpos = ptr_or_null<scalar_t>(qp);
    a.rel = ptr_or_null<scalar_t>(rl);
    a.bias = ptr_or_null<scalar_t>(bs);
    a.out = out.data_ptr<scalar_t>();
    a.lse = lse.data_ptr<scalar_t>();
    a.gout = gout.data_ptr<scalar_t>();
    a.glse = ptr_or_null<scalar_t>(gl);
    a.dq = dq.data_ptr<scalar_t>();
    a.dk_acc = dk_acc.data_ptr<scalar_t>();
    a.dv_acc = dv_acc.data_ptr<scalar_t>();
    a.dqpos = shape.has_pos ? dqpos.data_ptr<scalar_t>() : nullptr;
    a.drel_part = ptr_or_null<scalar_t>(drel_part);
    a.dbias_part = ptr_or_null<scalar_t>(dbias_part);
    a.dsig_part = dsig_part.data_ptr<double>();
    auto kernel = window_kernel ? &window_backward<scalar_t> : &backward_kernel<scalar_t>;
    kernel(p, p.has_sigma ? &st : nullptr, a, split);
  });
  if (split.nparts > 1) {
    dk.copy_(dk_acc.sum(2));
    dv.copy_(dv_acc.sum(2));
  }
  if (shape.has_pos && !direct)
    drel.copy_(drel_part.view({shape.H, ntasks / shape.H, p.U, shape.D}).sum(1));
  if (shape.has_bias && !direct) dbias.copy_(dbias_part.view({shape.H, ntasks / shape.H, p.U}).sum(1));
  if (shape.has_sigma) {
    // d sigma_{h,d} = sum_pairs dquad * d quad / d sigma = -(sum dquad x_d^2) / sigma^3.
    const at::Tensor acc = dsig_part.view({shape.H, ntasks / shape.H, G}).sum(1);
    const at::Tensor sig = sigma->to(at::kDouble);
    at::Tensor ds = at::zeros({shape.H, static_cast<int64_t>(grid.size())}, acc.options());
    for (int64_t d = 0; d < G; ++d) {
      const int64_t a = p.g.axis[d];
      if (p.g.n[d] > 1) ds.select(1, a).copy_(-acc.select(1, d) / sig.select(1, a).pow(3));
    }
    dsigma.copy_(ds);
  }
  return {dq, dk, dv, dqpos, drel, dsigma, dbias};
}

}  // namespace

TORCH_LIBRARY_IMPL(posattn, CPU, m) {
  m.impl("relpos_attention", &relpos_attention_cpu);
  m.impl("relpos_attention_backward", &relpos_attention_backward_cpu);
}

}  // namespace posattn
