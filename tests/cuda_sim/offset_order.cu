// Checks the order in which the fast offset kernel (csrc/cuda/relpos_fast_offsets.cuh) adds
// its blocks' boxes into d rel and d bias, on a device (the simulated GPU in CI; runs as is on a
// real GPU). The simulator runs a launch's blocks one after another, so it never shows a
// missing wait; what it can check is the order's logic, which this does for boxes of tile
// offsets on 1-3 axes:
//   table    fast_offsets_order_kernel's table (2-3 axes) is a permutation of the tile
//            offsets sorted by sum |dT_a|, ties by number; on 1 axis rank_to_dT1 is that order;
//   waits    every two tile offsets whose boxes overlap (within one of each other on every
//            axis, different) are ordered: the later one in the table waits for the earlier
//            (earlier_neighbour), never the other way (a wait on a later item could deadlock),
//            and no tile offset waits for one whose box does not overlap its own.
//
//   offset_order   prints "PASS name" / "FAIL name: detail" per check, exit status 1 on a failure
//
// Run by tests/cuda_sim/test_offset_order.py (built as the harness is).
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "cuda/relpos_fast_offsets.cuh"
#include "sim_host.h"

namespace {

namespace cf = posattn::relpos::cuda_fast;

int passed = 0, failed = 0;

void report(const std::string& name, bool ok, const std::string& detail = "") {
  printf("%s %s%s%s\n", ok ? "PASS" : "FAIL", name.c_str(), ok ? "" : ": ", ok ? "" : detail.c_str());
  (ok ? passed : failed) += 1;
}

template <int NDIM>
cf::OffsetTiles tiles_of(const std::vector<int>& reach) {
  cf::OffsetTiles ot;
  for (int a = 0; a < NDIM; ++a) {
    ot.reach[a] = reach[a];
    ot.nt[a] = reach[a] + 1;
    ot.count *= 2 * reach[a] + 1;
  }
  return ot;
}

template <int NDIM>
void check(const std::vector<int>& reach) {
  const cf::OffsetTiles ot = tiles_of<NDIM>(reach);
  std::string name = std::to_string(NDIM) + "-D reach";
  for (int r : reach) name += " " + std::to_string(r);
  // rank -> tile offset number
  std::vector<int> table(ot.count);
  if constexpr (NDIM == 1) {
    for (int r = 0; r < ot.count; ++r) table[r] = cf::rank_to_dT1(r) + ot.reach[0];
  } else {
    sim_host::Device<int> dev(std::vector<int>(ot.count, -1));
    cf::fast_offsets_order_kernel<NDIM><<<1, 256>>>(ot, dev.p);
    CHECK_CUDA(cudaGetLastError());
    CHECK_CUDA(cudaDeviceSynchronize());
    table = dev.get();
  }
  std::vector<int> rank(ot.count, -1);
  std::string why;
  for (int r = 0; r < ot.count && why.empty(); ++r) {
    const int i = table[r];
    if (i < 0 || i >= ot.count || rank[i] >= 0) {
      why = "rank " + std::to_string(r) + " holds " + std::to_string(i) + " (not a permutation)";
      break;
    }
    rank[i] = r;
    if (r > 0) {
      int d[NDIM], e[NDIM];
      cf::tile_offset_of<NDIM>(ot, table[r - 1], d);
      cf::tile_offset_of<NDIM>(ot, i, e);
      const int l1d = cf::tile_offset_l1<NDIM>(d), l1e = cf::tile_offset_l1<NDIM>(e);
      if (l1d > l1e || (l1d == l1e && table[r - 1] > i))
        why = "ranks " + std::to_string(r - 1) + ", " + std::to_string(r) + " out of order";
    }
  }
  report("table " + name, why.empty(), why);

  why.clear();
  for (int i = 0; i < ot.count && why.empty(); ++i) {
    int dT[NDIM];
    cf::tile_offset_of<NDIM>(ot, i, dT);
    std::vector<bool> waits(ot.count, false);
    for (int m = 0; m < (NDIM == 1 ? 3 : NDIM == 2 ? 9 : 27); ++m) {
      const int k = cf::earlier_neighbour<NDIM>(ot, dT, m);
      if (k >= 0) waits[k] = true;
    }
    for (int j = 0; j < ot.count && why.empty(); ++j) {
      int d[NDIM];
      cf::tile_offset_of<NDIM>(ot, j, d);
      bool overlap = j != i;
      for (int a = 0; a < NDIM; ++a) overlap = overlap && std::abs(d[a] - dT[a]) <= 1;
      const bool want = overlap && rank[j] < rank[i];
      if (waits[j] != want)
        why = "tile offset " + std::to_string(i) + (waits[j] ? " waits for " : " does not wait for ") +
              std::to_string(j) + (overlap ? "" : " (boxes apart)");
    }
  }
  report("waits " + name, why.empty(), why);
}

}  // namespace

int main() {
  check<1>({0});
  check<1>({6});
  check<2>({0, 0});
  check<2>({3, 4});
  check<2>({0, 5});
  check<2>({7, 7});
  check<3>({2, 3, 1});
  check<3>({3, 3, 3});
  check<3>({1, 0, 2});
  printf("%d passed, %d failed\n", passed, failed);
  return failed > 0 ? 1 : 0;
}
