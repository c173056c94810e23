// Which kernels run a relpos_attention call, and why: the plan of a call, computed
// once by one function per backend (cpu/relpos_plan.h for the CPU kernels,
// cuda/relpos_plan.cuh for the CUDA ones) from its RelposParams, and followed by
// the entry points, the simulator harness (tests/cuda_sim/harness.cu) and
// torch.ops.posattn.relpos_plan (posattn.ops.relpos_plan), which reports it.
// Plain data, no ATen.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace posattn {
namespace relpos {

// The element type of a call's tensors.
enum class DType { kFloat64, kFloat32, kFloat16, kBFloat16 };

// What the user asked for: POSATTN_CPU_KERNEL (auto | tiled | window) or
// POSATTN_CUDA_KERNEL (auto | general | fast). An unknown value is an error
// of the entry point (relpos/relpos_args.h, kernel_request), never a request.
enum class KernelRequest { kAuto, kGeneral, kTiled, kWindow, kFast };

// The CPU plan: the tiled (GEMM) kernels or the windowed ones, forward and
// backward alike, compiled for `isa`.
struct CpuPlan {
  bool window = false;
  std::string isa;     // "avx512", "avx2" or "base" (cpu/capability.h)
  std::string reason;  // why this kernel (the window kernel's refusal, or the request)
};

// The CUDA plan of a forward or a backward.
struct CudaPlan {
  // kFast: FlashAttention-2-class kernels (cuda/relpos_fast_forward.cuh, relpos_fast_backward.cuh,
  // relpos_fast_offsets.cuh); kGeneral: cuda/relpos_general.cuh
  enum class Kernels { kGeneral, kFast };
  Kernels path = Kernels::kGeneral;  // forward; d q, d k, d v, d q_pos of the backward
  std::string path_reason;           // why that path (the fast kernels' refusal, or the request)
  // backward only, when the call has q_pos, bias or sigma: which kernel computes d rel,
  // d bias and d sigma, and its d sigma partial sums per head
  bool has_offsets = false;
  Kernels offsets = Kernels::kGeneral;
  std::string offsets_reason;
  int64_t dsig_partials = 0;
  int64_t offset_order = 0;  // the fast offset kernel's ordering ints (RelposTensors::offset_order)
  size_t smem = 0;           // the largest dynamic shared memory per block among its launches
  // the device it was made for: its opt-in shared memory per block, the class of fast layouts
  // that follows from it (its name; empty: below the smallest), and the layout each fast kernel
  // family runs in (empty where it does not run)
  size_t smem_optin = 0;
  std::string layout_class;
  std::string forward_layout, backward_layout, offsets_layout;
  std::string error;  // not empty: the call cannot run on this device (a ValueError with this text)
};

inline const char* kernels_name(CudaPlan::Kernels k) {
  return k == CudaPlan::Kernels::kFast ? "fast" : "general";
}

inline const char* request_name(KernelRequest r) {
  switch (r) {
    case KernelRequest::kGeneral:
      return "general";
    case KernelRequest::kTiled:
      return "tiled";
    case KernelRequest::kWindow:
      return "window";
    case KernelRequest::kFast:
      return "fast";
    default:
      return "auto";
  }
}

// "key: value" lines, as torch.ops.posattn.relpos_plan returns them (posattn.ops.relpos_plan
// reads them into a dict).
inline std::string describe(const CpuPlan& p) {
  const char* kernel = p.window ? "window" : "tiled";
  return std::string("device: cpu\nisa: ") + p.isa + "\nforward: " + kernel + "\nbackward: " + kernel +
         "\nreason: " + p.reason + "\n";
}

inline std::string describe(const CudaPlan& p, bool backward) {
  std::string s = "device: cuda\n";
  s += std::string(backward ? "backward: " : "forward: ") + kernels_name(p.path) + "\n";
  s += "reason: " + p.path_reason + "\n";
  if (backward && p.has_offsets) {
    s += std::string("offsets: ") + kernels_name(p.offsets) + "\n";
    s += "offsets_reason: " + p.offsets_reason + "\n";
  }
  s += "smem: " + std::to_string(p.smem) + "\n";
  s += "smem_optin: " + std::to_string(p.smem_optin) + "\n";
  if (!p.layout_class.empty()) s += "layout_class: " + p.layout_class + "\n";
  if (!p.forward_layout.empty()) s += "forward_layout: " + p.forward_layout + "\n";
  if (!p.backward_layout.empty()) s += "backward_layout: " + p.backward_layout + "\n";
  if (!p.offsets_layout.empty()) s += "offsets_layout: " + p.offsets_layout + "\n";
  if (!p.error.empty()) s += "error: " + p.error + "\n";
  return s;
}

}  // namespace relpos
}  // namespace posattn
