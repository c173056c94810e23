// A head's span and key limits as the CUDA kernels of relpos_attention use them
// (the general path in relpos_general.cuh; the fast kernels' KeyRanges use its span rule):
// filled by every thread of a block from sigma, with sigma checked on the device.
#pragma once

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <limits>

#include "../core/grid_index.h"
#include "../core/relpos_params.h"
#include "cuda_common.cuh"

namespace posattn {

template <typename Acc>
struct SpanHead {
  Acc inv_sigma[kMaxGridDims];  // 1 / sigma_d (0 without a span), clamped to Acc's range
  Acc inv_n[kMaxGridDims];      // 1 / max(n_d - 1, 1): offsets are normalised by the axis length
  AxisLimit lim[kMaxGridDims];  // which keys a query keeps along each axis
  int64_t reach[kMaxGridDims];  // the largest |k_d - q_d| of a kept pair
};

// A device-side assertion, no host synchronisation (the op stays capturable in a
// CUDA graph); the message is the CPU kernel's.
__device__ inline void check_head_sigma(const RelposParams& p, int64_t h, const double* __restrict__ sigma) {
  if (!p.has_sigma) return;
  for (int64_t a = 0; a < p.G_in; ++a) {
    const double sg = sigma[h * p.G_in + a];
    POSATTN_DEVICE_ASSERT(sg > 0.0 && isfinite(sg),
                          "relpos_attention: sigma must be positive and finite everywhere");
  }
}

template <typename Acc>
__device__ void load_span_head(const RelposParams& p, int64_t h, const double* __restrict__ sigma,
                               SpanHead<Acc>& hd) {
  check_head_sigma(p, h, sigma);
  for (int d = 0; d < p.g.ndim; ++d) {
    AxisLimit& lim = hd.lim[d];
    lim = window_limit(p, d, p.g.n[d] - 1);
    hd.inv_sigma[d] = 0;
    hd.inv_n[d] = Acc(1) / static_cast<Acc>(p.g.n[d] > 1 ? p.g.n[d] - 1 : 1);
    if (p.has_sigma) {
      const double sg = sigma[h * p.G_in + p.g.axis[d]];
      // clamped: 1 / a subnormal sigma overflows Acc, and 0 * inf would make a query's own logit NaN
      hd.inv_sigma[d] =
          static_cast<Acc>(fmin(1.0 / sg, sizeof(Acc) == sizeof(float) ? double(FLT_MAX) : DBL_MAX));
      if (p.threshold > 0.0 && sg > 0.0) lim.span = span_half_width(sg, p.threshold, p.g.n[d]);
    }
    hd.reach[d] = axis_max_offset(lim);
  }
}

}  // namespace posattn
