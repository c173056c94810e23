// The CPU kernels of every operator, one table per CPU capability
// (cpu/kernels.inc, compiled by kernels_base.cpp, kernels_avx2.cpp and
// kernels_avx512.cpp); the operator entry points call cpu_kernels<T>().
#pragma once

#include <cstdint>
#include <string>

#include "../algebraic/apply_maps_layout.h"
#include "../relpos/relpos_cpu_problem.h"
#include "capability.h"

namespace posattn {
namespace cpu {

template <typename T>
struct TypedKernels {
  // relpos_attention: `window` picks the windowed kernels (use_window) over the tiled ones.
  void (*relpos_forward)(const relpos_cpu::Problem&, const relpos_cpu::SpanTables<T>*,
                         const relpos_cpu::ForwardPtrs<T>&, bool window);
  void (*relpos_backward)(const relpos_cpu::Problem&, const relpos_cpu::SpanTables<T>*,
                          const relpos_cpu::BackwardPtrs<T>&, relpos_cpu::BackwardSplit, bool window);
  // apply_maps: y = maps[index] x; gx += maps[index]^T gy; gmaps += gy x^T.
  void (*maps_forward)(const algebraic::MapsShape&, const T* x, const T* maps, const int64_t* index, T* y);
  void (*maps_grad_x)(const algebraic::MapsShape&, const T* gy, const T* maps, const int64_t* index, T* gx);
  void (*maps_grad_maps)(const algebraic::MapsShape&, const T* gy, const T* x, const int64_t* index,
                         T* gmaps);
};

struct Kernels {
  Capability capability;
  // True when the windowed relpos kernels should run: a box is set (span
  // threshold or fixed window) and every head's box holds at most 1/2 of the
  // keys (head dim <= 16), 1/4 (<= 32) or 1/5 (larger) and at most 16384
  // offsets (beyond that, the tiled kernel's GEMMs are faster), on grids whose
  // last axis fills >= 2/3 of its vector lanes. POSATTN_CPU_KERNEL = tiled |
  // window | auto (default) overrides the choice when a box is set.
  bool (*use_window)(const relpos_cpu::Problem&);
  // Number of work units (query runs) the windowed kernels split a (b, h) into.
  int64_t (*window_units)(const relpos_cpu::Problem&);
  TypedKernels<float> f32;
  TypedKernels<double> f64;
};

// The table of the active capability (active_capability()).
const Kernels& kernels();

// The capability of the table kernels() returns now, by name ("avx512",
// "avx2", "base"): torch.ops.posattn.cpu_capability().
std::string kernels_capability_name();

template <typename T>
const TypedKernels<T>& typed(const Kernels& k);
template <>
inline const TypedKernels<float>& typed<float>(const Kernels& k) {
  return k.f32;
}
template <>
inline const TypedKernels<double>& typed<double>(const Kernels& k) {
  return k.f64;
}

}  // namespace cpu

// The table of each build (cpu/kernels_<capability>.cpp).
namespace dispatch {
namespace base {
const cpu::Kernels& kernels();
}
#if POSATTN_CPU_DISPATCH
namespace avx2 {
const cpu::Kernels& kernels();
}
namespace avx512 {
const cpu::Kernels& kernels();
}
#endif
}  // namespace dispatch
}  // namespace posattn
