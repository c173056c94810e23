// The CPU kernels of every operator, one table per CPU capability
// (cpu/kernels.inc, compiled by kernels_base.cpp, kernels_avx2.cpp and
// kernels_avx512.cpp); the operator entry points call them through
// cpu::typed<T>(cpu::kernels()), and relpos_attention's plan (which of its
// kernels runs a call) comes from cpu::plan_relpos.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "../core/apply_maps_layout.h"
#include "../core/relpos_plan.h"
#include "../core/relpos_tensors.h"
#include "capability.h"
#include "relpos_packed.h"
#include "relpos_problem.h"

namespace posattn {
namespace cpu {

namespace rk = relpos::cpu_kernels;

template <typename T>
struct TypedKernels {
  // relpos_attention: `window` picks the windowed kernels over the tiled ones (plan_relpos).
  void (*relpos_forward)(const rk::Problem&, const rk::SpanTables<T>*, const RelposTensors<T>&, bool window);
  void (*relpos_backward)(const rk::Problem&, const rk::SpanTables<T>*, const RelposTensors<T>&,
                          rk::BackwardSplit, bool window);
  // relpos_attention of a packed call: every sample's tasks in one pool (cpu/relpos_packed.h).
  void (*relpos_packed_forward)(const std::vector<rk::PackedSample<T>>&);
  void (*relpos_packed_backward)(const std::vector<rk::PackedSample<T>>&);
  // apply_maps: y = maps[index] x; gx += maps[index]^T gy; gmaps += gy x^T.
  void (*maps_forward)(const apply_maps::MapsShape&, const T* x, const T* maps, const int64_t* index, T* y);
  void (*maps_grad_x)(const apply_maps::MapsShape&, const T* gy, const T* maps, const int64_t* index, T* gx);
  void (*maps_grad_maps)(const apply_maps::MapsShape&, const T* gy, const T* x, const int64_t* index,
                         T* gmaps);
};

struct Kernels {
  Capability capability;
  // Why the windowed relpos kernels should not run a call (null: they should).
  // They need a box (span threshold or fixed window) and lines without query
  // strides; with `automatic`, also each head's box at most 1/2 of the keys (head
  // dim <= 16), 1/4 (<= 32) or 1/5 (larger) and at most 16384 offsets (beyond
  // that, the tiled kernel's GEMMs are faster), on grids whose last axis fills
  // >= 2/3 of this capability's vector lanes.
  const char* (*window_refusal)(const rk::Problem&, bool automatic);
  // Number of work units (query runs) the windowed kernels split a (b, h) into.
  int64_t (*window_units)(const rk::Problem&);
  TypedKernels<float> f32;
  TypedKernels<double> f64;
};

// The table of the active capability (active_capability()).
const Kernels& kernels();

// The capability of the table kernels() returns now, by name ("avx512",
// "avx2", "base"): torch.ops.posattn.cpu_capability().
std::string kernels_capability_name();

// Which relpos kernels run a call on this CPU: the windowed ones where `request`
// (POSATTN_CPU_KERNEL) asks for them or, by default, where window_refusal
// accepts the call; else the tiled ones.
relpos::CpuPlan plan_relpos(const rk::Problem& p, relpos::KernelRequest request);

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
