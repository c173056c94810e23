// The boxes of the fast path (relpos_fast_forward.cuh) on a grid of NDIM = 1, 2, 3 axes,
// fixed at compile time: a block's query tile (64 queries), each warp's part of it
// (16 queries), a key block (64 keys), and the offsets between them. Tokens inside a box
// are numbered row-major over the box's extents, so a box's coordinates, strides and the
// offset rows of a pair are compile-time arithmetic; only the box's origin on the grid
// is known at run time.
//
//   NDIM  warp box   query tile  key block   warp offsets         tile offsets
//   1     16         64          64          79 (80 columns)      127
//   2     4 x 4      8 x 8       8 x 8       11 x 11 = 121 (128)  15 x 15 = 225
//   3     2 x 2 x 4  4 x 4 x 4   4 x 4 x 4   5 x 5 x 7 = 175 (176) 7 x 7 x 7 = 343
//
// The offset box between boxes of extents a and b has extent a + b - 1 per axis: pair
// (query x, key y) sits at y - x + (a - 1). Its row-major index is linear in the pair's
// coordinates, so a warp's column of pair (i, j) is kpart(j) - qpart(i) + C0 (column_part).
#pragma once

#include <type_traits>
#include <utility>

namespace posattn::relpos::cuda_fast {

enum class Box { kWarp, kTile, kKey, kWarpOffsets, kTileOffsets, kWarpsInTile };

template <int NDIM>
struct Boxes;
template <>
struct Boxes<1> {
  static constexpr __host__ __device__ int warp(int) { return 16; }
  static constexpr __host__ __device__ int tile(int) { return 64; }
  static constexpr __host__ __device__ int key(int) { return 64; }
};
template <>
struct Boxes<2> {
  static constexpr __host__ __device__ int warp(int) { return 4; }
  static constexpr __host__ __device__ int tile(int) { return 8; }
  static constexpr __host__ __device__ int key(int) { return 8; }
};
template <>
struct Boxes<3> {
  static constexpr __host__ __device__ int warp(int a) { return a < 2 ? 2 : 4; }
  static constexpr __host__ __device__ int tile(int) { return 4; }
  static constexpr __host__ __device__ int key(int) { return 4; }
};

// Extent of box `b` along axis a.
template <int NDIM>
constexpr __host__ __device__ __forceinline__ int extent(Box b, int a) {
  using S = Boxes<NDIM>;
  switch (b) {
    case Box::kWarp:
      return S::warp(a);
    case Box::kTile:
      return S::tile(a);
    case Box::kKey:
      return S::key(a);
    case Box::kWarpOffsets:
      return S::warp(a) + S::key(a) - 1;
    case Box::kTileOffsets:
      return S::tile(a) + S::key(a) - 1;
    case Box::kWarpsInTile:
      return S::tile(a) / S::warp(a);
  }
  return 0;
}

// Row-major stride of axis a in box b, the box's volume, coordinate a of its index r.
template <int NDIM>
constexpr __host__ __device__ __forceinline__ int stride(Box b, int a) {
  int s = 1;
#pragma unroll
  for (int c = a + 1; c < NDIM; ++c) s *= extent<NDIM>(b, c);
  return s;
}
template <int NDIM>
constexpr __host__ __device__ __forceinline__ int volume(Box b) {
  return stride<NDIM>(b, -1);
}
template <int NDIM>
constexpr __host__ __device__ __forceinline__ int coord(Box b, int r, int a) {
  return r / stride<NDIM>(b, a) % extent<NDIM>(b, a);
}

// The same with the box and axis known at compile time (the kernels' form: constant
// divisors, whatever the compiler unrolls), and a loop over the axes that gives each
// step its axis as a compile-time constant:
//   for_axes<NDIM>([&](auto ax) { constexpr int a = decltype(ax)::value; ... }).
template <int NDIM, Box B, int A>
__host__ __device__ __forceinline__ int coord_of(int r) {  // (r >= 0: unsigned division, no sign fix-ups)
  constexpr unsigned s = stride<NDIM>(B, A), e = extent<NDIM>(B, A);
  return static_cast<int>(static_cast<unsigned>(r) / s % e);
}
template <typename F, int... A>
__host__ __device__ __forceinline__ void for_axes_(F& f, std::integer_sequence<int, A...>) {
  (f(std::integral_constant<int, A>{}), ...);
}
template <int NDIM, typename F>
__host__ __device__ __forceinline__ void for_axes(F&& f) {
  for_axes_(f, std::make_integer_sequence<int, NDIM>{});
}

// The part of a warp-offset-box column that cell r of box b (the key block or the warp
// box) contributes: sum_a coord_a(r) stride_a. The column of offset (key j) - (query i) is
// column_part(kKey, j) - column_part(kWarp, i) + column_part(kWarp, 15), the last term
// being (w_a - 1) per axis: the warp box's last cell.
template <int NDIM>
constexpr __host__ __device__ __forceinline__ int column_part(Box b, int r) {
  int c = 0;
#pragma unroll
  for (int a = 0; a < NDIM; ++a) c += coord<NDIM>(b, r, a) * stride<NDIM>(Box::kWarpOffsets, a);
  return c;
}

// A thread's keys in S's accumulators are j = 8 nb + t (t = 2 (lane % 4) + e < 8): the
// kernels split their coordinates into a compile-time part (nb) and a per-lane part (t),
// which holds when no group of 8 keys carries across an axis, and e into the last axis.
template <int NDIM>
constexpr bool keys_split_by_eight() {
  if (extent<NDIM>(Box::kKey, NDIM - 1) % 2 != 0) return false;
  for (int nb = 0; nb < volume<NDIM>(Box::kKey) / 8; ++nb)
    for (int t = 0; t < 8; ++t)
      for (int a = 0; a < NDIM; ++a)
        if (coord<NDIM>(Box::kKey, 8 * nb + t, a) !=
            coord<NDIM>(Box::kKey, 8 * nb, a) + coord<NDIM>(Box::kKey, t, a))
          return false;
  return true;
}

// The compile-time part of the keys of S's n-blocks (8 keys each), as constants the
// kernels index with their unrolled loop counters: kpart(8 nb) and coord_a(8 nb).
// (Computed through the functions above inside the kernels' loops, ptxas left part of
// it to run time on 3-D grids.)
template <int NDIM>
struct KeyBlockParts {
  int col[volume<NDIM>(Box::kKey) / 8] = {};
  int c[volume<NDIM>(Box::kKey) / 8][NDIM] = {};
  constexpr KeyBlockParts() {
    for (int nb = 0; nb < volume<NDIM>(Box::kKey) / 8; ++nb) {
      col[nb] = column_part<NDIM>(Box::kKey, 8 * nb);
      for (int a = 0; a < NDIM; ++a) c[nb][a] = coord<NDIM>(Box::kKey, 8 * nb, a);
    }
  }
};

template <int NDIM>
constexpr bool boxes_fit() {
  if (volume<NDIM>(Box::kWarp) != 16 || volume<NDIM>(Box::kTile) != 64 || volume<NDIM>(Box::kKey) != 64)
    return false;
  for (int a = 0; a < NDIM; ++a)
    if (extent<NDIM>(Box::kTile, a) % extent<NDIM>(Box::kWarp, a) != 0) return false;
  return volume<NDIM>(Box::kWarpsInTile) == 4 && keys_split_by_eight<NDIM>();
}
static_assert(boxes_fit<1>() && boxes_fit<2>() && boxes_fit<3>(),
              "16-query warps, 64-query tiles, 64-key blocks");

// Origin of warp w's box inside the query tile, along axis a (warps row-major over the
// tile).
template <int NDIM>
constexpr __host__ __device__ __forceinline__ int warp_origin(int w, int a) {
  return coord<NDIM>(Box::kWarpsInTile, w, a) * extent<NDIM>(Box::kWarp, a);
}

// Coordinate a in the tile's offset box of coordinate c (axis a) of warp w's offset box.
template <int NDIM>
constexpr __host__ __device__ __forceinline__ int warp_to_tile_offset(int w, int c, int a) {
  return c + extent<NDIM>(Box::kTile, a) - extent<NDIM>(Box::kWarp, a) - warp_origin<NDIM>(w, a);
}

}  // namespace posattn::relpos::cuda_fast
