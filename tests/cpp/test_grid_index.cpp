#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <set>
#include <vector>

#include "core/grid_index.h"

using namespace posattn;

TEST_CASE("unravel and ravel are inverse on odd and size-1 grids", "[index]") {
  const std::vector<std::vector<int64_t>> grids = {{7}, {3, 5}, {4, 1, 3}, {1, 1}, {2, 3, 4, 5}};
  for (const auto& g : grids) {
    const int nd = static_cast<int>(g.size());
    int64_t n = 1;
    for (auto s : g) n *= s;
    int64_t c[kMaxGridDims];
    for (int64_t i = 0; i < n; ++i) {
      unravel_index(i, g.data(), nd, c);
      for (int d = 0; d < nd; ++d) {
        REQUIRE(c[d] >= 0);
        REQUIRE(c[d] < g[d]);
      }
      REQUIRE(ravel_index(c, g.data(), nd) == i);
    }
  }
}

TEST_CASE("unravel is row-major (last axis fastest)", "[index]") {
  const int64_t g[] = {3, 5};
  int64_t c[2];
  unravel_index(7, g, 2, c);
  CHECK(c[0] == 1);
  CHECK(c[1] == 2);
  unravel_index(14, g, 2, c);
  CHECK(c[0] == 2);
  CHECK(c[1] == 4);
}

TEST_CASE("num_offsets is prod(2n - 1)", "[index]") {
  const int64_t g1[] = {7};
  const int64_t g2[] = {3, 5};
  const int64_t g3[] = {4, 1, 3};
  CHECK(num_offsets(g1, 1) == 13);
  CHECK(num_offsets(g2, 2) == 5 * 9);
  CHECK(num_offsets(g3, 3) == 7 * 1 * 5);
}

TEST_CASE("offset rows: extremes, zero offset, and a bijection", "[index]") {
  const int64_t g[] = {3, 5};
  const int64_t most_negative[] = {-2, -4};
  const int64_t zero[] = {0, 0};
  const int64_t most_positive[] = {2, 4};
  const int64_t one_right[] = {0, 1};
  const int64_t one_down[] = {1, 0};
  CHECK(offset_row(most_negative, g, 2) == 0);
  CHECK(offset_row(most_positive, g, 2) == 5 * 9 - 1);
  CHECK(offset_row(zero, g, 2) == 2 * 9 + 4);  // the centre of the (5, 9) table
  CHECK(offset_row(one_right, g, 2) - offset_row(zero, g, 2) == 1);
  CHECK(offset_row(one_down, g, 2) - offset_row(zero, g, 2) == 9);
  std::set<int64_t> rows;
  int64_t delta[2], back[2];
  for (delta[0] = -2; delta[0] <= 2; ++delta[0])
    for (delta[1] = -4; delta[1] <= 4; ++delta[1]) {
      const int64_t r = offset_row(delta, g, 2);
      rows.insert(r);
      offset_of_row(r, g, 2, back);
      CHECK(back[0] == delta[0]);
      CHECK(back[1] == delta[1]);
    }
  CHECK(rows.size() == 45);
  CHECK(*rows.begin() == 0);
  CHECK(*rows.rbegin() == 44);
}

TEST_CASE("offset row of a size-1 axis contributes nothing", "[index]") {
  const int64_t with_unit[] = {4, 1, 3};
  const int64_t without[] = {4, 3};
  const int64_t d3[] = {-2, 0, 1};
  const int64_t d2[] = {-2, 1};
  CHECK(offset_row(d3, with_unit, 3) == offset_row(d2, without, 2));
}

TEST_CASE("normalised offsets span [-1, 1]", "[index]") {
  CHECK(normalised_offset(4, 5) == Approx(1.0));
  CHECK(normalised_offset(-4, 5) == Approx(-1.0));
  CHECK(normalised_offset(2, 5) == Approx(0.5));
  CHECK(normalised_offset(0, 1) == 0.0);  // size-1 axis: no division by zero
}

TEST_CASE("span half widths", "[index][span]") {
  const double t = 0.1;
  const double radius = std::sqrt(-2.0 * std::log(t));
  CHECK(threshold_radius(t) == Approx(2.145966026));
  // ceil(sigma * radius * (n - 1)), capped at n - 1.
  CHECK(span_half_width(0.1, t, 32) == static_cast<int64_t>(std::ceil(0.1 * radius * 31)));
  CHECK(span_half_width(0.1, t, 32) == 7);
  CHECK(span_half_width(0.3, t, 28) == 18);
  CHECK(span_half_width(10.0, t, 28) == 27);       // cap
  CHECK(span_half_width(1e300, t, 28) == 27);      // no overflow
  CHECK(span_half_width(1e-9, t, 28) == 1);        // ceil of a tiny positive extent
  CHECK(span_half_width(0.3, t, 1) == 0);          // size-1 axis
  CHECK(span_half_width(0.3, 0.999999, 50) == 1);  // threshold close to 1: tiny box
  // Monotone in sigma.
  int64_t last = 0;
  for (double s = 0.01; s < 1.0; s += 0.01) {
    const int64_t h = span_half_width(s, t, 64);
    CHECK(h >= last);
    last = h;
  }
}

// NATTEN's border rule, straight from its definition: the window of k cells
// starts at i - k/2, moved to stay inside [0, n).
static void natten_window(int64_t n, int64_t k, int64_t i, int64_t& lo, int64_t& hi) {
  if (k >= n) {
    lo = 0;
    hi = n - 1;
    return;
  }
  int64_t start = i - k / 2;
  if (start < 0) start = 0;
  if (start + k > n) start = n - k;
  lo = start;
  hi = start + k - 1;
}

// NATTEN's mask for one axis, key by key, as its Flex backend writes it
// (natten/backends/flex.py, single_dim_tiling_mask, without dilation): the
// stride group's leader, the window centre clamped into the axis (max, then
// min, as torch.clamp), or for a causal axis the keys j <= i within k of the
// group's last cell.
static bool natten_keeps(int64_t n, int64_t k, int64_t s, bool causal, int64_t i, int64_t j) {
  if (causal) {
    const int64_t leader = std::min((i / s) * s + s - 1, n - 1);
    return i - j >= 0 && leader - j < k;
  }
  const int64_t left = k / 2, right = k / 2 + (k % 2 - 1);
  const int64_t leader = std::min((i / s) * s + s / 2, n - 1);
  const int64_t centre = std::min(std::max(leader, left), n - 1 - right);
  const int64_t w0 = centre - j, w1 = j - centre;
  return (0 <= w0 && w0 <= left) || (0 <= w1 && w1 <= right);
}

TEST_CASE("axis key ranges: NATTEN's kernel sizes (odd, even), strides and causal axes", "[index][window]") {
  for (int64_t n = 1; n <= 12; ++n) {
    for (int64_t k = 1; k <= n; ++k) {
      const int64_t left = k / 2, right = k - 1 - k / 2;
      for (int64_t s = 1; s <= k; ++s) {
        for (bool causal : {false, true}) {
          for (bool shift : {false, true}) {
            for (int64_t span : {n - 1, int64_t{1}}) {
              if (span > n - 1) continue;
              const AxisLimit a = make_axis_limit(n, span, left, right, s, shift, causal);
              int64_t last_lo = -1, last_hi = -1, max_off = 0;
              for (int64_t i = 0; i < n; ++i) {
                int64_t lo, hi;
                axis_key_range(a, i, lo, hi);
                for (int64_t j = 0; j < n; ++j) {
                  // the clipped window: NATTEN's centre without the clamp into the axis
                  const int64_t leader = std::min((i / s) * s + s / 2, n - 1);
                  const bool window = causal || shift ? natten_keeps(n, k, s, causal, i, j)
                                                      : j >= leader - left && j <= leader + right;
                  const bool want = window && std::abs(j - i) <= span;
                  INFO("n " << n << " k " << k << " s " << s << " causal " << causal << " shift " << shift
                            << " span " << span << " i " << i << " j " << j);
                  REQUIRE((j >= lo && j <= hi) == want);
                }
                CHECK(lo <= i);
                CHECK(i <= hi);
                CHECK(lo >= last_lo);  // monotone: the kernels bound a tile's keys by its ends
                CHECK(hi >= last_hi);
                last_lo = lo;
                last_hi = hi;
                max_off = std::max({max_off, i - lo, hi - i});
              }
              CHECK(axis_max_offset(a) >= max_off);
            }
          }
        }
      }
    }
  }
}

TEST_CASE("axis key ranges: capping the window at n - 1 and the stride at n changes nothing",
          "[index][window]") {
  // make_relpos_params caps them (a kernel beyond the axis, the int64 range); the rule must not notice
  for (int64_t n = 1; n <= 10; ++n)
    for (int64_t k = 1; k <= 2 * n + 3; ++k)
      for (int64_t s = 1; s <= k; ++s)
        for (bool shift : {false, true})
          for (bool causal : {false, true}) {
            const int64_t left = k / 2, right = k - 1 - k / 2;
            const AxisLimit raw = make_axis_limit(n, n - 1, left, right, s, shift, causal);
            const AxisLimit capped = make_axis_limit(n, n - 1, std::min(left, n - 1), std::min(right, n - 1),
                                                     std::min(s, n), shift, causal);
            for (int64_t i = 0; i < n; ++i) {
              int64_t lo1, hi1, lo2, hi2;
              axis_key_range(raw, i, lo1, hi1);
              axis_key_range(capped, i, lo2, hi2);
              INFO("n " << n << " k " << k << " s " << s << " shift " << shift << " causal " << causal
                        << " i " << i);
              REQUIRE(lo1 == lo2);
              REQUIRE(hi1 == hi2);
            }
          }
}

TEST_CASE("axis key ranges: span box, clipped window, shifted window", "[index][window]") {
  for (int64_t n : {1, 2, 5, 8, 13}) {
    for (int64_t win = 0; win < n; ++win) {
      for (int64_t span = 0; span < n; ++span) {
        int64_t last_lo = -1, last_hi = -1, max_off = 0;
        for (int64_t i = 0; i < n; ++i) {
          int64_t lo, hi, wlo, whi;
          axis_key_range(make_axis_limit(n, span, win, win, 1, false), i, lo, hi);
          CHECK(lo == std::max<int64_t>({0, i - win, i - span}));
          CHECK(hi == std::min<int64_t>({n - 1, i + win, i + span}));
          axis_key_range(make_axis_limit(n, span, win, win, 1, true), i, lo, hi);
          natten_window(n, 2 * win + 1, i, wlo, whi);
          CHECK(lo == std::max(wlo, i - span));
          CHECK(hi == std::min(whi, i + span));
          CHECK(lo <= i);
          CHECK(i <= hi);
          CHECK(lo >= last_lo);  // monotone: the kernels bound a tile's keys by its ends
          CHECK(hi >= last_hi);
          last_lo = lo;
          last_hi = hi;
          max_off = std::max({max_off, i - lo, hi - i});
        }
        CHECK(axis_max_offset(make_axis_limit(n, span, win, win, 1, true)) >= max_off);
        if (span == n - 1) CHECK(axis_max_offset(make_axis_limit(n, span, win, win, 1, true)) == max_off);
      }
    }
  }
  // Without a span, every query of a shifted window keeps min(2 win + 1, n) keys.
  for (int64_t i = 0; i < 10; ++i) {
    int64_t lo, hi;
    axis_key_range(make_axis_limit(10, 9, 2, 2, 1, true), i, lo, hi);
    CHECK(hi - lo + 1 == 5);
  }
}
