#include "kernels.h"

#include <string>

namespace posattn {
namespace cpu {

const Kernels& kernels() {
  switch (active_capability()) {
#if POSATTN_CPU_DISPATCH
    case Capability::avx512:
      return dispatch::avx512::kernels();
    case Capability::avx2:
      return dispatch::avx2::kernels();
#endif
    default:
      return dispatch::base::kernels();
  }
}

std::string kernels_capability_name() {
  return capability_name(kernels().capability);
}

relpos::CpuPlan plan_relpos(const rk::Problem& p, relpos::KernelRequest request) {
  using relpos::KernelRequest;
  const Kernels& k = kernels();
  relpos::CpuPlan plan;
  plan.isa = capability_name(k.capability);
  const char* refusal = k.window_refusal(p, request == KernelRequest::kAuto);
  plan.window = refusal == nullptr && request != KernelRequest::kTiled;
  if (request == KernelRequest::kTiled)
    plan.reason = "POSATTN_CPU_KERNEL=tiled";
  else if (refusal != nullptr)
    plan.reason = std::string("the windowed kernels decline it: ") + refusal;
  else
    plan.reason = request == KernelRequest::kWindow
                      ? "POSATTN_CPU_KERNEL=window"
                      : "a small box of keys per query: the windowed kernels are faster";
  return plan;
}

}  // namespace cpu
}  // namespace posattn
