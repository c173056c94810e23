// What the fast path's forward (relpos_fast_forward.cuh) and backward
// (relpos_fast_backward.cuh) share, written once: the block's geometry (the grid as 32-bit
// extents and strides, box origins, a query's key range per axis), the copies into shared
// memory (cp.async per row of a box), the positional term per warp (the warp's columns of
// the offset tile, the offset tile's copy with the add / mul tables, the positional products
// on the tensor cores, the skewed read into S), the masks per key range, and the launchers'
// checks. A layout L (FwdLayout, BwdLayout) gives kLd, kPLd, kWarpCols, kWarpOffsets and
// table_at(stage, warp, which).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "../core/grid_index.h"
#include "../core/relpos_params.h"
#include "../core/relpos_tensors.h"
#include "relpos_fast_boxes.cuh"
#include "relpos_fast_tables.cuh"
#include "warp_primitives.cuh"

namespace posattn::relpos::cuda_fast {

constexpr int kWarps = 4, kThreads = 32 * kWarps;
constexpr int kBlockM = 16 * kWarps;  // queries per tile
constexpr int kBlockN = 64;           // keys per key block

// The kinds of call whose kernel instances a build holds: the extension both; a test program
// one (-DPOSATTN_FAST_INSTANCES=1: single-grid calls, 2: packed ones), since the simulator runs
// ptxas on, and parses, all of a program's PTX at every start (tests/cuda_sim, benchmarks/simlib.py).
// A launcher asked for a kind the build lacks returns cudaErrorNotSupported.
#ifndef POSATTN_FAST_INSTANCES
#define POSATTN_FAST_INSTANCES 3
#endif
constexpr bool kSingleGridInstances = (POSATTN_FAST_INSTANCES & 1) != 0;
constexpr bool kPackedInstances = (POSATTN_FAST_INSTANCES & 2) != 0;
static_assert(kSingleGridInstances || kPackedInstances, "POSATTN_FAST_INSTANCES: 1, 2 or 3");

// The classes of devices the fast layouts are sized for, by their opt-in shared memory per
// block: 0, sm_90 (H100, H200): 227 KiB; 1, sm_80 (A100; also Jetson Orin): 163 KiB; 2,
// sm_86 / sm_89 / sm_120 (RTX 30 / 40 / 50, A10, A40, L4, L40): 99 KiB. Each layout (FwdLayout,
// BwdLayout, offsets_shape) takes its class SC and picks the widest shape within its budget; a
// device runs the largest class its limit admits (smem_class_of), and a class whose layout is
// a larger class's runs that one's kernel (fwd_canonical_class, bwd_canonical_class; the offset
// kernel's instances are its shapes'): one instance per distinct layout.
constexpr int kSmemClasses = 3;
constexpr __host__ __device__ size_t smem_budget(int sc) {
  return sc == 0 ? size_t{227} * 1024 : sc == 1 ? size_t{163} * 1024 : size_t{99} * 1024;
}
constexpr const char* smem_class_name(int sc) {
  return sc == 0 ? "227 KiB (sm_90)" : sc == 1 ? "163 KiB (sm_80)" : "99 KiB (sm_86, sm_89, sm_120)";
}
// The class of a device with `optin` bytes of opt-in shared memory per block: -1 below the
// smallest (the fast kernels then do not run).
constexpr int smem_class_of(size_t optin) {
  int sc = -1;
  for (int c = kSmemClasses - 1; c >= 0; --c)
    if (smem_budget(c) <= optin) sc = c;
  return sc;
}
// Calls fn(std::integral_constant<int, SC>{}) for class sc (0 ... kSmemClasses - 1).
template <typename Fn>
decltype(auto) by_smem_class(int sc, Fn&& fn) {
  if (sc == 0) return fn(std::integral_constant<int, 0>{});
  if (sc == 1) return fn(std::integral_constant<int, 1>{});
  return fn(std::integral_constant<int, 2>{});
}

// Rows 0 ... ROWS - 1 of a box into shared memory (row stride LD) by 16-byte cp.async
// copies: D columns of row r from row token(r) of the row-major (., GD) matrix g, zero-filled
// where token(r) < 0 (GD > D: a chunk of the columns, g pointing at its first). WS > 0: each
// warp's 16 rows in a region of their own, row r at (r / 16) WS + (r % 16) LD (the backward's
// q_pos rows in the warps' positional buffers). The caller commits the group.
// A thread copies one fixed 16-byte chunk of every kStep-th row (unsigned row indices: no
// sign fix-ups in the row decode).
template <typename T, int D, int LD, int ROWS, int GD = D, int WS = 0, typename RowFn>
__device__ __forceinline__ void load_rows_async(T* s, const T* __restrict__ g, RowFn token) {
  constexpr int kPer = 16 / static_cast<int>(sizeof(T)),
                kChunks = D / kPer;  // elements per copy, copies per row
  constexpr unsigned kStep = kThreads / kChunks;
  static_assert(kThreads % kChunks == 0, "every thread copies one chunk of its rows");
  const unsigned c = threadIdx.x % kChunks;
  T* sc = s + c * kPer;
  const T* gc = g + c * kPer;
#pragma unroll 1  // (unrolled, the copies' addresses would hold registers the math needs)
  for (unsigned r = threadIdx.x / kChunks; r < ROWS; r += kStep) {
    const int row = token(r);
    const unsigned at = WS > 0 ? r / 16 * WS + r % 16 * LD : r * LD;
    warp::cp_async_16(sc + at, row >= 0 ? gc + static_cast<int64_t>(row) * GD : g, row >= 0);
  }
}

// The rows of box B (row-major over its extents) into shared memory (row stride LD) by
// 16-byte cp.async copies: D columns of row r from row token(x) of the row-major (., GD)
// matrices g (into s) and, where PAIR, g2 (into s2: K and V share their rows), x being r's
// coordinates in the box, zero-filled where token(x) < 0. A thread copies one fixed chunk
// of every kStep-th row and walks x by kStep's coordinates with carries (compile-time
// extents): no row decode per copy. The caller commits the group.
template <typename T, int D, int LD, int NDIM, Box B, bool PAIR, int GD = D, typename TokenFn>
__device__ __forceinline__ void load_box_async(T* s, const T* __restrict__ g, T* s2, const T* __restrict__ g2,
                                               TokenFn token) {
  constexpr int kPer = 16 / static_cast<int>(sizeof(T)), kChunks = D / kPer;
  constexpr int kStep = kThreads / kChunks, kRows = volume<NDIM>(B);
  static_assert(kThreads % kChunks == 0, "every thread copies one chunk of its rows");
  const int c = threadIdx.x % kChunks;
  int r = threadIdx.x / kChunks, x[NDIM];
  for_axes<NDIM>([&](auto ax) {
    constexpr int a = decltype(ax)::value;
    x[a] = coord_of<NDIM, B, a>(r);
  });
#pragma unroll 1  // (unrolled, the copies' addresses would hold registers the math needs)
  for (; r < kRows; r += kStep) {
    const int row = token(x);
    const int64_t at = static_cast<int64_t>(row >= 0 ? row : 0) * GD + c * kPer;
    warp::cp_async_16(s + r * LD + c * kPer, g + at, row >= 0);
    if constexpr (PAIR) warp::cp_async_16(s2 + r * LD + c * kPer, g2 + at, row >= 0);
    int carry = 0;  // x += kStep's coordinates, last axis first (at most one carry per axis)
    for_axes<NDIM>([&](auto ax) {
      constexpr int a = NDIM - 1 - decltype(ax)::value;
      constexpr int step = coord<NDIM>(B, kStep, a), ext = extent<NDIM>(B, a);
      x[a] += step + carry;
      carry = x[a] >= ext;
      x[a] -= carry ? ext : 0;
    });
  }
}

// The grid of a call as the kernels see it: extents, token strides and offset-row strides
// per axis in 32 bits (NDIM = 1: the N tokens in a row), and the offset row of offset 0 (the
// tables' centre, (U - 1) / 2). A packed call's sample (set_sample) has its own extents and
// token strides and the max grid's offset rows. SMEM: the extents and token strides in shared
// memory (2 NDIM ints at `at`, kGridSmemBytes), read where they are used rather than held in
// registers: a single grid's are reread from the kernel's parameters, a sample's in registers
// made the packed D = 128 backward spill.
constexpr int kGridSmemBytes = 32;
// Whether a packed call's fast backward kernel (keys: the key-major one; pos: with a term per
// offset) at head dim D in elements of `bytes` holds its sample's grid in shared memory: the
// key-major kernels at D = 128 but float32's with a term (with the grid in registers those spilled
// 4 to 108 bytes on sm_80 / sm_90; the query-major ones did not, and float32's positional
// key-major one spilled 8 bytes with the grid in shared memory: the register allocator's choice at
// 255 registers, checked instance by instance)
__host__ __device__ constexpr bool packed_grid_in_smem(int64_t D, bool keys, int bytes, bool pos) {
  return D == 128 && keys && !(bytes == 4 && pos);
}
template <int NDIM, bool SMEM = false>
struct FastGrid {
  using Ext = std::conditional_t<SMEM, const int*, int[NDIM]>;
  Ext n, gs;
  int rs[NDIM], c0;
  __device__ __forceinline__ explicit FastGrid(const RelposParams& p) {
    static_assert(!SMEM, "FastGrid<NDIM, true>(p, at)");
    c0 = static_cast<int>((p.U - 1) / 2);
    if constexpr (NDIM == 1) {
      n[0] = static_cast<int>(p.N), gs[0] = 1, rs[0] = 1;
    } else {
      int s = 1;
#pragma unroll
      for (int a = NDIM - 1; a >= 0; --a) {
        n[a] = static_cast<int>(p.g.n[a]), gs[a] = s, rs[a] = static_cast<int>(p.rel_stride[a]);
        s *= n[a];
      }
    }
  }
  // SMEM: a packed call's sample, its extents and strides at `at` in shared memory (set_sample)
  __device__ __forceinline__ FastGrid(const RelposParams& p, int* at) : n(at), gs(at + NDIM) {
    static_assert(SMEM, "FastGrid<NDIM>(p)");
    c0 = static_cast<int>((p.U - 1) / 2);
#pragma unroll
    for (int a = 0; a < NDIM; ++a) rs[a] = NDIM == 1 ? 1 : static_cast<int>(p.rel_stride[a]);
  }
  // sample s of a packed call p (its values checked by the schedule: relpos_packed.cuh); SMEM:
  // written by thread 0, for the caller's barrier to make visible
  __device__ __forceinline__ void set_sample(const RelposParams& p, const int* __restrict__ off,
                                             const int* __restrict__ shapes, int s) {
    if constexpr (SMEM) {
      if (threadIdx.x != 0) return;
      int* nw = const_cast<int*>(n);  // (the shared memory the grid reads)
      int* gw = const_cast<int*>(gs);
      int st = 1;
#pragma unroll
      for (int a = NDIM - 1; a >= 0; --a) {
        const int e =
            NDIM == 1 ? off[s + 1] - off[s] : shapes[static_cast<int64_t>(s) * p.G_in + p.g.axis[a]];
        nw[a] = e, gw[a] = st;
        st *= e;
      }
    } else if constexpr (NDIM == 1) {
      n[0] = off[s + 1] - off[s];
    } else {
      int st = 1;
#pragma unroll
      for (int a = NDIM - 1; a >= 0; --a) {
        n[a] = shapes[static_cast<int64_t>(s) * p.G_in + p.g.axis[a]], gs[a] = st;
        st *= n[a];
      }
    }
  }
  // origin o of box r of the tiles' extents (row-major over the grid: the blocks' order)
  __device__ __forceinline__ void box_origin(int r, int* o) const {
#pragma unroll
    for (int a = NDIM - 1; a >= 0; --a) {
      const int e = extent<NDIM>(Box::kTile, a), cnt = (n[a] + e - 1) / e;
      o[a] = r % cnt * e;
      r /= cnt;
    }
  }
  // coordinate a of row r of the query tile at qo (row 16 w' + i: query i of warp w')
  template <int A>
  __device__ __forceinline__ int query_coord(const int* qo, int r) const {
    return qo[A] + coord_of<NDIM, Box::kWarpsInTile, A>(r / 16) * extent<NDIM>(Box::kWarp, A) +
           coord_of<NDIM, Box::kWarp, A>(r % 16);
  }
  // the token of row r of the query tile at qo, -1 outside the grid
  __device__ __forceinline__ int query_token(const int* qo, int r) const {
    int tok = 0;
    bool in = true;
    for_axes<NDIM>([&](auto ax) {
      constexpr int a = decltype(ax)::value;
      const int c = query_coord<a>(qo, r);
      in = in && c < n[a];
      tok += c * gs[a];
    });
    return in ? tok : -1;
  }
  // the token of the cell at x in the key block at kb, -1 outside the grid
  __device__ __forceinline__ int key_token(const int* kb, const int* x) const {
    int tok = 0;
    bool in = true;
#pragma unroll
    for (int a = 0; a < NDIM; ++a) {
      in = in && kb[a] + x[a] < n[a];
      tok += (kb[a] + x[a]) * gs[a];
    }
    return in ? tok : -1;
  }
  // the offset row of the first row of the tile offset box between the query tile at qo
  // and the key block at kb
  __device__ __forceinline__ int first_offset(const int* qo, const int* kb) const {
    int u = 0;
#pragma unroll
    for (int a = 0; a < NDIM; ++a)
      u += (kb[a] - qo[a] - (extent<NDIM>(Box::kTile, a) - 1) + n[a] - 1) * rs[a];
    return u;
  }
  // the same in a packed call's sample (its offsets' rows on the max grid's tables: from their centre)
  __device__ __forceinline__ int first_offset_packed(const int* qo, const int* kb) const {
    int u = c0;
#pragma unroll
    for (int a = 0; a < NDIM; ++a) u += (kb[a] - qo[a] - (extent<NDIM>(Box::kTile, a) - 1)) * rs[a];
    return u;
  }
  // the same in a packed call's sample's own tables (sample_tables: rows delta + n - 1 of its grid,
  // row-major; *rows: their number), and their row strides (ts)
  __device__ __forceinline__ int first_offset_own(const int* qo, const int* kb, int* rows) const {
    int u = 0, st = 1;
#pragma unroll
    for (int a = NDIM - 1; a >= 0; --a) {
      u += (kb[a] - qo[a] - (extent<NDIM>(Box::kTile, a) - 1) + n[a] - 1) * st;
      st *= 2 * n[a] - 1;
    }
    *rows = st;
    return u;
  }
  __device__ __forceinline__ void own_strides(int* ts) const {
#pragma unroll
    for (int a = NDIM - 1, st = 1; a >= 0; --a) ts[a] = st, st *= 2 * n[a] - 1;
  }
};

// Which keys a query keeps along axis a: [lo, hi] of its window and span box
// (axis_key_range: NATTEN's vocabulary; the span's half width from sigma and the
// threshold, as the other paths compute it), the whole axis where the call has neither
// (or its grid is not of NDIM axes: the control on any grid). Neither bound decreases as
// the query's coordinate grows, so the queries of a box keep keys in [lo(its first cell),
// hi(its last)] only, and all of them every key of [lo(its last cell), hi(its first)].
template <int NDIM, bool PACKED = false>
struct KeyRanges {
  bool boxed;
  int span[NDIM];
  template <bool SM>
  __device__ __forceinline__ KeyRanges(const RelposParams& p, const double* __restrict__ sigma,
                                       const FastGrid<NDIM, SM>& g, int head) {
    boxed = p.has_box && p.g.ndim == NDIM;
#pragma unroll
    for (int a = 0; a < NDIM; ++a) {
      span[a] = g.n[a] - 1;
      if (boxed && p.has_sigma && p.threshold > 0.0) {
        const double sg = sigma[head * p.G_in + p.g.axis[a]];
        if (sg > 0.0) span[a] = static_cast<int>(span_half_width(sg, p.threshold, g.n[a]));
      }
    }
  }
  // the range of a query at coordinate c (past the grid's end: its last cell's)
  template <bool SM>
  __device__ __forceinline__ int2 operator()(const RelposParams& p, const FastGrid<NDIM, SM>& g, int a,
                                             int c) const {
    if (!boxed) return make_int2(0, g.n[a] - 1);
    AxisLimit l = window_limit(p, a, span[a]);
    if constexpr (PACKED) {  // a sample: its windows capped by its own extents, as a call of its grid has
                             // them
      l.n = g.n[a];
      l.left = min(l.left, l.n - 1), l.right = min(l.right, l.n - 1), l.stride = min(l.stride, l.n);
    }
    int64_t lo, hi;
    axis_key_range(l, min(c, g.n[a] - 1), lo, hi);
    return make_int2(static_cast<int>(lo), static_cast<int>(hi));
  }
};

// The warp's columns of its offset box: their offset row relative to the tile offset box's
// first (woff) and their row in the tile offset box (wrow); padding columns: column 0's.
template <int NDIM, typename L>
__device__ __forceinline__ void fill_warp_columns(int w, int lane, const int* rs, int* woff, int* wrow) {
  for (int c = lane; c < L::kWarpCols; c += 32) {
    const int cc = c < L::kWarpOffsets ? c : 0;
    int o = 0, r = 0;
    for_axes<NDIM>([&](auto ax) {
      constexpr int a = decltype(ax)::value;
      const int x = warp_to_tile_offset<NDIM>(w, coord_of<NDIM, Box::kWarpOffsets, a>(cc), a);
      o += x * rs[a];
      r += x * stride<NDIM>(Box::kTileOffsets, a);
    });
    woff[c] = o, wrow[c] = r;
  }
}

// Whether a call has a term per offset (q_pos rel, a bias, a span): the kernels' positional
// instances (POS) take it, with rel null where it has no q_pos (tables only: its bias and
// span through the add / mul tables); else the control's (POS = false) take it.
inline bool has_offset_terms(const RelposParams& p) {
  return p.has_pos || p.has_bias || p.has_sigma;
}

// The offset tile's rows (or all of a pair's rows) in RC chunks of columns, a compile-time loop:
// body(c) for chunk c = 0 ... RC - 1 (REVERSE: RC - 1 ... 0; c an integral_constant), each chunk
// after the first waited for and made visible to every warp by a barrier before its body, and
// `load(next)` issuing the next chunk's copies (committed here) once every warp is done with
// this one. The first chunk is the caller's: copied before, or still there.
template <int RC, bool REVERSE = false, typename Body, typename Load>
__device__ __forceinline__ void for_chunks(Body&& body, Load&& load) {
  for_axes<RC>([&](auto i) {
    constexpr int k = decltype(i)::value, c = REVERSE ? RC - 1 - k : k;
    if constexpr (k > 0) {
      warp::cp_async_wait<0>();
      __syncthreads();  // chunk c visible to every warp
    }
    body(std::integral_constant<int, c>{});
    if constexpr (k + 1 < RC) {
      __syncthreads();  // every warp done with chunk c
      load(REVERSE ? c - 1 : c + 1);
      warp::cp_async_commit();
    }
  });
}

// The offset tile's view of a forward or backward layout L whose offset tile may hold its rel
// rows in chunks of columns: its rows kRLd apart (load_offset_tile and warp_positional_products
// read L::kLd).
template <typename L>
struct RelRows : L {
  static constexpr int kLd = L::kRLd;
};

// load_offset_tile's table_rows for tables on rel's grid
struct SameRows {
  __device__ __forceinline__ void operator()(int&, int&) const {}
};

// The tile offset box whose first row is offset row u0 into dst (row stride L::kLd): its rel
// rows (D columns of rel's GD, from the column rel points at), zero-filled outside [0, U)
// (none where rel is null: tables only); and the warp's add / mul entries, the box's first row
// being row tu of `rows` (table_rows(tu, rows) sets them, or table_rows() returns them as an int2:
// u0 and U but for tables of another grid than rel's, a packed call's sample_tables; asked for when
// the tables' copies are issued, which keeps a register free meanwhile; which of the two forms
// decides whether ptxas spills in the sm_80 16-bit D = 128 2-D kernels: the int2 made the backward's
// single-grid one spill, the references the forward's packed one; 4-byte copies at woff, zero-filled
// likewise; add or mul null where the call has none). The caller commits.
template <typename T, int D, int NDIM, typename L, int GD = D, typename TableRows>
__device__ __forceinline__ void load_offset_tile(T* dst, const T* __restrict__ rel, int u0, int U,
                                                 const int* rs, const float* __restrict__ add,
                                                 const float* __restrict__ mul, TableRows&& table_rows,
                                                 float* add_w, float* mul_w, const int* woff, int lane) {
  const auto offset_row = [&](const int* x) {  // row x of the box in rel, -1 outside [0, U)
    int u = u0;
#pragma unroll
    for (int a = 0; a < NDIM; ++a) u += x[a] * rs[a];
    return u >= 0 && u < U ? u : -1;
  };
  if (rel != nullptr)
    load_box_async<T, D, L::kLd, NDIM, Box::kTileOffsets, false, GD>(dst, rel, nullptr, nullptr, offset_row);
  if (add != nullptr || mul != nullptr) {
    int tu = u0, rows = U;
    if constexpr (std::is_invocable_v<TableRows>) {  // (table_rows(): the (row, rows) as an int2)
      const int2 r = table_rows();
      tu = r.x, rows = r.y;
    } else {
      table_rows(tu, rows);
    }
    for (int c = lane; c < L::kWarpCols; c += 32) {
      const int u = tu + woff[c];
      const bool in = u >= 0 && u < rows;
      if (add != nullptr) warp::cp_async_4(add_w + c, in ? add + u : add, in);
      if (mul != nullptr) warp::cp_async_4(mul_w + c, in ? mul + u : mul, in);
    }
  }
}

// The warp's positional products into pbuf: column c of row i is (scale q_pos_i . rel[wrow
// c] + add[c]) mul[c], with q_pos's A fragments qpf, the offset tile R; row 16 holds scale
// mul[c] (has_mul). Tables only (!with_rel: R and qpf unused): add[c] mul[c] in every row.
// (R is never null: a null pointer here was converted to a shared address ahead of the branch,
// which the simulator rejects, at 16-bit D = 128 on 3-D grids.) UNROLL:
// the column loop unrolled (the forward) or not (the backward, whose accumulators leave
// fewer registers). The caller syncs the warp before reading.
// CHUNKS > 1: the D columns of q_pos (qpf) and R are chunk CHUNK of q_pos . rel's; the
// chunks before the last leave their partial dot products in pbuf (each lane's own entries,
// read back by the same lane: no sync between chunks), each next one goes on from them, the
// last finishes.
template <typename T, int D, typename L, bool UNROLL, int CHUNK = 0, int CHUNKS = 1>
__device__ __forceinline__ void warp_positional_products(const uint32_t (&qpf)[D / warp::Mma<T>::kK][4],
                                                         const T* R, bool with_rel, const int* wrow,
                                                         const float* add_w, const float* mul_w, float* pbuf,
                                                         int lane, float scale, bool has_add, bool has_mul) {
  static_assert(CHUNK >= 0 && CHUNK < CHUNKS, "a chunk of the columns");
  constexpr bool kLast = CHUNK + 1 == CHUNKS;
  if (!with_rel) {  // 4 columns per lane and 16-byte stores (rows and tables 16-byte aligned)
    static_assert(L::kWarpCols % 4 == 0 && L::kPLd % 4 == 0 && L::kPbuf % 4 == 0, "float4 columns");
    // (the tables once, with the last chunk)
#pragma unroll 1
    for (int c = 4 * lane; kLast && c < L::kWarpCols; c += 128) {
      const float4 m =
          has_mul ? *reinterpret_cast<const float4*>(mul_w + c) : make_float4(1.f, 1.f, 1.f, 1.f);
      const float4 a =
          has_add ? *reinterpret_cast<const float4*>(add_w + c) : make_float4(0.f, 0.f, 0.f, 0.f);
      const float4 x = make_float4(a.x * m.x, a.y * m.y, a.z * m.z, a.w * m.w);
#pragma unroll
      for (int i = 0; i < 16; ++i) *reinterpret_cast<float4*>(pbuf + i * L::kPLd + c) = x;
      if (has_mul)
        *reinterpret_cast<float4*>(pbuf + 16 * L::kPLd + c) =
            make_float4(scale * m.x, scale * m.y, scale * m.z, scale * m.w);
    }
    return;
  }
  using F = warp::Mma<T>;
  constexpr int LD = L::kLd, kUnroll = UNROLL ? L::kWarpCols / 16 : 1;
  const T* Rj = R + F::b_col(lane);
#pragma unroll kUnroll
  for (int nb = 0; nb < L::kWarpCols / 8; nb += 2) {
    const T* rows[F::kRowsPerLane];  // this lane's rows of the 16 columns' rel rows
#pragma unroll
    for (int i = 0; i < F::kRowsPerLane; ++i) rows[i] = Rj + wrow[8 * nb + F::b_rows(lane, i)] * LD;
    float acc[2][4] = {};
    // the earlier chunks' sums, the products going on from them (the same additions in the
    // same order as whole rows: bitwise the forward's positional term)
    if constexpr (CHUNK > 0) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int col = 8 * (nb + h) + 2 * (lane % 4);
        const float2 e0 = *reinterpret_cast<const float2*>(pbuf + (lane / 4) * L::kPLd + col);
        const float2 e1 = *reinterpret_cast<const float2*>(pbuf + (lane / 4 + 8) * L::kPLd + col);
        acc[h][0] = e0.x, acc[h][1] = e0.y, acc[h][2] = e1.x, acc[h][3] = e1.y;
      }
    }
#pragma unroll
    for (int kk = 0; kk < D / F::kK; ++kk) {
      uint32_t b[4];
      F::load_b_rows(b, rows, F::kK * kk);
      F::mma(acc[0], qpf[kk], {b[0], b[1]});
      F::mma(acc[1], qpf[kk], {b[2], b[3]});
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {  // columns col, col + 1 of rows g, g + 8
      const int col = 8 * (nb + h) + 2 * (lane % 4);
      float2* p0 = reinterpret_cast<float2*>(pbuf + (lane / 4) * L::kPLd + col);
      float2* p1 = reinterpret_cast<float2*>(pbuf + (lane / 4 + 8) * L::kPLd + col);
      if constexpr (!kLast) {
        *p0 = make_float2(acc[h][0], acc[h][1]);
        *p1 = make_float2(acc[h][2], acc[h][3]);
        continue;
      }
      const float2 a = has_add ? *reinterpret_cast<const float2*>(add_w + col) : make_float2(0.f, 0.f);
      const float2 m = has_mul ? *reinterpret_cast<const float2*>(mul_w + col) : make_float2(1.f, 1.f);
      *p0 = make_float2(fmaf(acc[h][0], scale, a.x) * m.x, fmaf(acc[h][1], scale, a.y) * m.y);
      *p1 = make_float2(fmaf(acc[h][2], scale, a.x) * m.x, fmaf(acc[h][3], scale, a.y) * m.y);
      if (has_mul && lane < 4)
        *reinterpret_cast<float2*>(pbuf + 16 * L::kPLd + col) = make_float2(scale * m.x, scale * m.y);
    }
  }
}

// Where a thread's skewed reads of pbuf start for its row il (accumulator rows lane / 4 and
// + 8): the row in pbuf + kpart(2 (lane % 4)) - qpart(il) + C0 (relpos_fast_boxes.cuh).
template <int NDIM, typename L>
__device__ __forceinline__ int skew_start(int lane, int il) {
  return il * L::kPLd + column_part<NDIM>(Box::kKey, 2 * (lane % 4)) - column_part<NDIM>(Box::kWarp, il) +
         column_part<NDIM>(Box::kWarp, 15);
}

// S's logits in natural units: q k (scale mul) + ((scale q_pos rel + add) mul), the pair's
// column kpart(8 nb) + e past the row's start pcol.
template <int NDIM, typename L>
__device__ __forceinline__ void skewed_logits(float (&s)[kBlockN / 8][4], const float* pbuf,
                                              const int (&pcol)[2], int lane, float scale, bool has_mul) {
  constexpr KeyBlockParts<NDIM> kParts{};
#pragma unroll
  for (int nb = 0; nb < kBlockN / 8; ++nb) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int c = pcol[i >> 1] + kParts.col[nb] + (i & 1);
      // (the row of scale mul: 16 rows below row 0, so c - il kPLd + 16 kPLd)
      const int mc = c + (16 - lane / 4 - 8 * (i >> 1)) * L::kPLd;
      s[nb][i] = fmaf(s[nb][i], has_mul ? pbuf[mc] : scale, pbuf[c]);
    }
  }
}

// S scaled by to_log2 where a pair is kept, -inf where its key is outside its row's ranges
// (the warp's rows' int2 per axis, the grid's end included) or after its causal limit
// (row_tok: the thread's rows' tokens); kb: the key block's origin.
template <int NDIM>
__device__ __forceinline__ void mask_keys(float (&s)[kBlockN / 8][4], const int2* ranges, const int* kb,
                                          const int* gs, int lane, const int (&row_tok)[2], bool causal,
                                          float to_log2) {
  constexpr KeyBlockParts<NDIM> kParts{};
  // this lane's keys 8 nb + 2 (lane % 4) + e: its part of their coordinates and tokens
  int kc[NDIM], key_tok = 0;
  for_axes<NDIM>([&](auto ax) {
    constexpr int a = decltype(ax)::value;
    kc[a] = kb[a] + coord_of<NDIM, Box::kKey, a>(2 * (lane % 4));
    key_tok += kc[a] * gs[a];
  });
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    int lo[NDIM], hi[NDIM];  // the row's ranges against this lane's part of the keys
#pragma unroll
    for (int a = 0; a < NDIM; ++a) {
      const int2 x = ranges[(lane / 4 + 8 * r) * NDIM + a];
      lo[a] = x.x - kc[a], hi[a] = x.y - kc[a];
    }
#pragma unroll
    for (int nb = 0; nb < kBlockN / 8; ++nb) {
      int tok = key_tok;
#pragma unroll
      for (int a = 0; a < NDIM; ++a) tok += kParts.c[nb][a] * gs[a];
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        bool kept = !causal || tok + e <= row_tok[r];
#pragma unroll
        for (int a = 0; a < NDIM; ++a) {
          const int c = kParts.c[nb][a] + (a == NDIM - 1 ? e : 0);
          kept = kept && c >= lo[a] && c <= hi[a];
        }
        float& x = s[nb][2 * r + e];
        x = kept ? x * to_log2 : -INFINITY;
      }
    }
  }
}

// The checks both launchers share: D = Dv, N < 2^31, H and B at most 65535 (the grid's
// y and z), q, k, v (q_pos, rel) 16-byte aligned; NDIM > 1: a grid of NDIM axes (NDIM = 1
// takes the N tokens in a row, any grid for the control without a window or span box);
// sigma given where a threshold makes span boxes; POS: q_pos and rel both given or both null
// (tables only) as p.has_pos says, the add / mul tables given where the call has them,
// U = prod (2 n_d - 1) offsets and at most 2^26 of them for NDIM > 1 (offset rows in 32
// bits), N <= 2^30 - kBlockN for NDIM = 1. *boxes: the query tiles (key blocks) per
// (batch, head). cudaErrorInvalidValue where one fails.
template <int D, bool POS, int NDIM, typename T>
cudaError_t check_fast_call(const RelposParams& p, const RelposTensors<T>& t, int64_t* boxes) {
  const auto misaligned = [](const void* ptr, uintptr_t a) {
    return reinterpret_cast<uintptr_t>(ptr) % a != 0;
  };
  if (p.D != D || p.Dv != D || p.N >= (int64_t{1} << 31) || p.H > 65535 || p.B > 65535)
    return cudaErrorInvalidValue;
  if (misaligned(t.q, 16) || misaligned(t.k, 16) || misaligned(t.v, 16)) return cudaErrorInvalidValue;
  if (NDIM > 1 && p.g.ndim != NDIM) return cudaErrorInvalidValue;
  // windows and span boxes on the grid's own axes only
  if (p.has_box && p.g.ndim != NDIM) return cudaErrorInvalidValue;
  if (p.has_box && p.has_sigma && p.threshold > 0.0 && t.sigma == nullptr) return cudaErrorInvalidValue;
  *boxes = 1;
  if (NDIM == 1) {
    *boxes = (p.N + kBlockM - 1) / kBlockM;
  } else {
    for (int a = 0; a < NDIM; ++a)
      *boxes *= (p.g.n[a] + extent<NDIM>(Box::kTile, a) - 1) / extent<NDIM>(Box::kTile, a);
  }
  if (*boxes >= (int64_t{1} << 31)) return cudaErrorInvalidValue;
  if (POS) {  // (q_pos and rel both null: tables only, as the call says: never a term dropped)
    if ((t.qpos == nullptr) != (t.rel == nullptr) || (t.qpos != nullptr) != p.has_pos ||
        misaligned(t.qpos, 16) || misaligned(t.rel, 16))
      return cudaErrorInvalidValue;
    // the offset tables the call needs, filled (a null table would drop its bias or span)
    if ((t.offset_add != nullptr) != has_offset_add(p) || (t.offset_mul != nullptr) != has_offset_mul(p))
      return cudaErrorInvalidValue;
    // (a packed call's tokens in a row: its samples', the max grid's extent at most)
    const int64_t row = p.packed_samples > 0 ? p.g.n[0] : p.N;
    if (NDIM == 1 && (p.g.ndim > 1 || p.U != 2 * row - 1 || p.N > (int64_t{1} << 30) - kBlockN))
      return cudaErrorInvalidValue;
    if (NDIM > 1 && (p.U != num_offsets(p.g.n, NDIM) || p.U > (int64_t{1} << 26)))
      return cudaErrorInvalidValue;
  }
  return cudaSuccess;
}

}  // namespace posattn::relpos::cuda_fast
