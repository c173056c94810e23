// The CUDA plan of a relpos_attention call (core/relpos_plan.h): which kernels run
// its forward or backward, computed from its RelposParams and the device's
// limits alone (torch-free), so that the entry points (relpos/relpos_cuda.cu), the
// simulator harness (tests/cuda_sim/harness.cu) and torch.ops.posattn.relpos_plan
// follow one rule. The fast kernels (FlashAttention-2-class, relpos_fast_forward.cuh,
// relpos_fast_backward.cuh) take float16 / bfloat16 calls, and float32 ones through TF32
// where allowed, with D == Dv in {32, 64, 128} (q_pos optional; windows and span thresholds
// included) on grids of 1-3 axes, on sm_80+, in the layouts of the device's class of shared
// memory per block (relpos_fast_common.cuh, smem_class_of: 227, 163 or 99 KiB) where the call's
// fits (the backward's d q, d k, d v, d q_pos wherever the forward's does: in float32 at D = 128 with a
// term per offset in two halves of the gradients' columns, on 2-3-D grids its operands in chunks); d rel, d
// bias, d sigma of such calls come from the fast offset kernel (relpos_fast_offsets.cuh) where its layout
// fits (on sm_90: all of them). The general kernels take every other call (float64, float32 without TF32,
// other head dims, more axes) and what the fast ones do not.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <climits>
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>

#include "../core/relpos_params.h"
#include "../core/relpos_plan.h"
#include "relpos_fast_backward.cuh"
#include "relpos_fast_forward.cuh"
#include "relpos_fast_offsets.cuh"
#include "relpos_general.cuh"

namespace posattn {
namespace relpos {

// What the plan needs to know of the device (filled once per call by the entry
// point: relpos_cuda.cu, cuda_device(); by the harness for the device it emulates).
struct CudaDevice {
  size_t smem_optin = 0;      // cudaDevAttrMaxSharedMemoryPerBlockOptin
  bool tensor_cores = false;  // the build has sm_80+ code for this device (the fast kernels need it)
  bool allow_tf32 = false;    // torch.backends.cuda.matmul.allow_tf32: float32 on the fast kernels
};

// Calls fn(T{}) with the CUDA element type of dt.
template <typename Fn>
void by_cuda_type(DType dt, Fn fn) {
  switch (dt) {
    case DType::kFloat64:
      return fn(double{});
    case DType::kFloat32:
      return fn(float{});
    case DType::kFloat16:
      return fn(__half{});
    default:
      return fn(__nv_bfloat16{});
  }
}

// Calls fn(CT{}, std::integral_constant<int, D>{}) for the fast kernels' element
// type (float16, bfloat16 or float32) and head dim (32, 64 or 128; checked before).
template <typename Fn>
void by_fast_type_and_dim(DType dt, int64_t D, Fn fn) {
  auto by_dim = [&](auto ct_tag) {
    if (D == 32)
      fn(ct_tag, std::integral_constant<int, 32>{});
    else if (D == 64)
      fn(ct_tag, std::integral_constant<int, 64>{});
    else
      fn(ct_tag, std::integral_constant<int, 128>{});
  };
  if (dt == DType::kFloat16)
    by_dim(__half{});
  else if (dt == DType::kFloat32)
    by_dim(float{});
  else
    by_dim(__nv_bfloat16{});
}

namespace plan_detail {

// Why the fast forward and backward do not take a packed call with a span: through TF32 or at D = 128
// (cuda_fast::packed_span_fits) they take it with a table per sample on the max grid's offsets
// (wide_tables_fit), S U floats per head, only where that is at most q's size.
inline std::string packed_span_refusal(const RelposParams& p) {
  return "packed calls (packed=) with a span through TF32 or at D = 128 take the fast kernels where each "
         "head's tables of the samples' terms, samples x U = " +
         std::to_string(p.packed_samples) + " x " + std::to_string(p.U) +
         " floats (U the offsets of max_grid), are at most q's tokens x D = " + std::to_string(p.N) + " x " +
         std::to_string(p.D) + " (fewer samples per call, or a smaller max_grid)";
}
// Why the fast forward or backward of a packed call with a span does not take it
// (cuda_fast::packed_wide_fits).
inline std::string packed_wide_refusal(const char* kernel, int D, int ndim) {
  return std::string("packed calls (packed=) with a span at D = ") + std::to_string(D) + " on " +
         std::to_string(ndim) + "-D grids take the general " + kernel +
         " at this element type (its fast instance with the samples' tables would spill registers)";
}
// Why the fast offset kernel does not take one (cuda_fast::packed_span_fits).
inline std::string packed_span_offsets_refusal() {
  return "packed calls (packed=) with a span take the fast offset kernel (d rel, d bias, d sigma) at "
         "float16 / bfloat16 and D <= 64 only (its instances elsewhere would spill registers)";
}

inline std::string blocks_error(int64_t blocks, const char* what, const char* remedy) {
  return "relpos_attention (CUDA): " + std::string(what) + " needs " + std::to_string(blocks) +
         " thread blocks, more than a launch allows (" + std::to_string(INT_MAX) + "); " + remedy;
}

// What every fast kernel needs of a call (empty: the call has it): the types, head dims, axes
// and sizes they take, aligned inputs, a device with the tensor cores they use.
inline std::string fast_call_refusal(const RelposParams& p, DType dt, bool aligned16, const CudaDevice& dev) {
  if (dt == DType::kFloat32 && !dev.allow_tf32)
    return "float32 goes through TF32 tensor cores only where torch.backends.cuda.matmul.allow_tf32 is True";
  if (dt == DType::kFloat64) return "it takes float16, bfloat16 and (with TF32 allowed) float32 only";
  if (p.D != p.Dv || (p.D != 32 && p.D != 64 && p.D != 128)) return "it needs D == Dv in {32, 64, 128}";
  if (p.g.ndim > 3) return "it takes grids of at most 3 axes (size-1 axes aside)";
  if (p.B > 65535 || p.H > 65535) return "it takes at most 65535 batch elements and heads";
  if (p.N >= (int64_t{1} << 30) - cuda_fast::kBlockN || p.U > (p.g.ndim == 1 ? INT_MAX : int64_t{1} << 26))
    return "the grid is too large for its 32-bit offset rows";
  if (!aligned16) return "an input is not 16-byte aligned";
  if (!dev.tensor_cores)
    return "this build has no sm_80+ code for the device (compute capability 8.0 or newer is needed)";
  return std::string();
}

// The class of the device's fast layouts (relpos_fast_common.cuh), or why it has none.
inline std::string smem_class_refusal(const CudaDevice& dev, int* sc) {
  *sc = cuda_fast::smem_class_of(dev.smem_optin);
  if (*sc >= 0) return "";
  return "the device has " + std::to_string(dev.smem_optin) +
         " bytes of opt-in shared memory per block, less than its smallest layouts' class (" +
         std::to_string(cuda_fast::smem_budget(cuda_fast::kSmemClasses - 1)) + ")";
}

inline std::string lacks_layout(const char* what, int64_t D, int ndim, int sc) {
  return std::string(what) + " has no layout within " + cuda_fast::smem_class_name(sc) +
         " of shared memory per block for D = " + std::to_string(D) + " on a grid of " +
         std::to_string(ndim < 1 ? 1 : ndim) + " axes";
}

// Why the fast forward cannot take the call (empty: it can); `smem`: its shared memory; `layout`:
// its shape in the device's class.
inline std::string fast_refusal(const RelposParams& p, DType dt, bool aligned16, const CudaDevice& dev,
                                size_t* smem, std::string* layout) {
  std::string why = fast_call_refusal(p, dt, aligned16, dev);
  int sc = -1;
  if (why.empty()) why = smem_class_refusal(dev, &sc);
  if (!why.empty()) return why;
  by_fast_type_and_dim(dt, p.D, [&](auto ct_tag, auto d_tag) {
    using CT = decltype(ct_tag);
    constexpr int D = decltype(d_tag)::value;
    const int ndim = p.g.ndim == 3 ? 3 : p.g.ndim == 2 ? 2 : 1;
    if (p.packed_samples > 0 && p.has_sigma && !cuda_fast::packed_span_fits<CT, D>()) {
      if (!cuda_fast::packed_wide_fits<CT, D>(false, ndim)) {
        why = packed_wide_refusal("forward", D, ndim);
        return;
      }
      if (!cuda_fast::wide_tables_fit(p)) {
        why = packed_span_refusal(p);
        return;
      }
    }
    const bool pos = cuda_fast::has_offset_terms(p);
    const cuda_fast::FwdLayoutInfo l = cuda_fast::fast_forward_layout<CT, D>(p.g.ndim, pos, sc);
    *smem = l.bytes;
    if (l.bytes == 0) {
      why = lacks_layout("its forward", D, p.g.ndim, sc);
      return;
    }
    const cuda_fast::FwdShape& f = l.shape;
    *layout = (f.kvc > 0 ? "K and V in turn through one buffer of " + std::to_string(f.kvc) + " columns"
                         : "K, V in " + std::to_string(f.kv_stages) + " stage(s)") +
              (pos ? ", the offset tile in " + std::to_string(f.rel_stages) + " stage(s) of " +
                         std::to_string(f.dc) + " columns" + (f.qpos_smem ? ", q_pos in shared memory" : "") +
                         (f.qpos_global ? ", q_pos's fragments per chunk from the tensor" : "")
                   : std::string()) +
              (f.q_global ? ", Q's fragments from the tensor" : "") + " (" + std::to_string(l.bytes) +
              " bytes)";
  });
  return why;
}

// Why the fast backward cannot take a call the fast forward takes (empty: it can); `smem`:
// the larger of its kernels' shared memory; `layout`: their shape in the device's class.
inline std::string fast_backward_refusal(const RelposParams& p, DType dt, const CudaDevice& dev, size_t* smem,
                                         std::string* layout) {
  std::string why;
  const int sc = cuda_fast::smem_class_of(dev.smem_optin);  // (fast_refusal checked it)
  by_fast_type_and_dim(dt, p.D, [&](auto ct_tag, auto d_tag) {
    using CT = decltype(ct_tag);
    constexpr int D = decltype(d_tag)::value;
    const int ndim = p.g.ndim == 3 ? 3 : p.g.ndim == 2 ? 2 : 1;
    if (p.packed_samples > 0 && p.has_sigma && !cuda_fast::packed_span_fits<CT, D>() &&
        !cuda_fast::packed_wide_fits<CT, D>(true, ndim)) {
      why = packed_wide_refusal("backward", D, ndim);
      return;
    }
    const bool pos = cuda_fast::has_offset_terms(p);
    const cuda_fast::BwdLayoutInfo l = cuda_fast::fast_backward_layout<CT, D>(p.g.ndim, pos, sc);
    if (l.bytes == 0) {
      why = lacks_layout("its backward", D, p.g.ndim, sc);
      return;
    }
    // (a packed call's key-major kernel at D = 128: + its sample's grid, packed_grid_in_smem)
    const size_t grid = p.packed_samples > 0 && cuda_fast::packed_grid_in_smem(D, true, sizeof(CT), pos)
                            ? cuda_fast::kGridSmemBytes
                            : 0;
    *smem = std::max(*smem, std::max(l.kernel_bytes[0], l.kernel_bytes[1] + grid));
    for (int k = 0; k < 2; ++k)
      *layout += std::string(k == 0 ? "d q: " : "; d k, d v: ") + "the streamed box in " +
                 std::to_string(l.stages[k]) + " stage(s)" +
                 (pos ? ", the offset tile in " + std::to_string(l.rel_stages[k]) + " stage(s) of " +
                            std::to_string(l.dc[k]) + " columns" +
                            (l.alias[k] ? (k == 0 ? ", dS' in" : ", P and dS' in") +
                                              std::string(" the positional buffers")
                                        : std::string()) +
                            (l.qpos_regs[k] ? ", q_pos in registers" : "")
                      : std::string()) +
                 (l.split[k] ? ", P and dS' exchanged in turn" : "") +
                 (l.ops[k] ? ", the operands in chunks of " + std::to_string(l.dc[k]) + " columns" : "") +
                 (l.halves[k] > 1 ? ", the gradients in two halves of their columns" : "") + " (" +
                 std::to_string(l.kernel_bytes[k] + (k == 1 ? grid : 0)) + " bytes)";
  });
  return why;
}

// Why the fast offset kernel cannot compute d rel, d bias, d sigma of a call the fast
// kernels take (fast_call_refusal; empty: it can); `smem`: its shared memory; `ints`: its ordering ints
// (fast_offset_order_ints: a ticket, a flag per block, the order's table); `layout`: its shape.
inline std::string fast_offsets_refusal(const RelposParams& p, DType dt, const CudaDevice& dev, size_t* smem,
                                        int64_t* ints, std::string* layout) {
  int sc = -1;
  std::string why = smem_class_refusal(dev, &sc);
  if (!why.empty()) return why;
  by_fast_type_and_dim(dt, p.D, [&](auto ct_tag, auto d_tag) {
    using CT = decltype(ct_tag);
    constexpr int D = decltype(d_tag)::value;
    if (p.packed_samples > 0 && p.has_sigma && !cuda_fast::packed_span_fits<CT, D>()) {
      why = packed_span_offsets_refusal();
      return;
    }
    const cuda_fast::OffLayoutInfo l = cuda_fast::fast_offsets_layout<CT, D>(p.g.ndim, sc);
    const int ndim = p.g.ndim == 3 ? 3 : p.g.ndim == 2 ? 2 : 1;
    if (p.packed_samples > 0 && p.has_sigma && l.bytes != 0 &&
        !cuda_fast::packed_span_offsets_fit<CT, D>(ndim, l.shape.acc_regs, l.shape.qpos_chunks)) {
      why = std::string(
                "packed calls (packed=) with a span at D = 64 on 3-D grids take the general "
                "kernels' d rel, d bias, d sigma within ") +
            cuda_fast::smem_class_name(sc) +
            " (the fast offset kernel's instance of that shape would spill registers)";
      return;
    }
    *smem = l.bytes;
    *ints = cuda_fast::fast_offset_order_ints<CT, D>(p, sc);
    if (*ints >= INT_MAX) {
      why =
          "the fast offset kernel needs more thread blocks (with their ordering flags) than a launch allows";
      return;
    }
    if (l.bytes == 0) {  // (offsets_shape)
      why = lacks_layout("the fast offset kernel", D, p.g.ndim, sc);
      return;
    }
    *layout = std::to_string(l.shape.da) + " columns of d rel a block" +
              (l.shape.acc_regs ? " (its accumulators in registers)" : "") + ", inputs in chunks of " +
              std::to_string(l.shape.dc) + " columns" + (l.shape.qpos_chunks ? " (q_pos's too)" : "") +
              (l.shape.x_parts > 1 ? ", X in " + std::to_string(l.shape.x_parts) + " parts" : "") + " (" +
              std::to_string(l.bytes) + " bytes)";
  });
  return why;
}

// The general kernels' shared memory past the 48 KiB every device gives: an error (else empty).
inline std::string general_smem_error(size_t bytes, const RelposParams& p, const CudaDevice& dev) {
  if (bytes <= 48 * 1024 || bytes <= dev.smem_optin) return "";
  return "relpos_attention (CUDA): head dims D = " + std::to_string(p.D) + ", Dv = " + std::to_string(p.Dv) +
         " need " + std::to_string(bytes) + " bytes of shared memory per block, more than the device's " +
         std::to_string(dev.smem_optin);
}

}  // namespace plan_detail

// The kernels of a forward (backward = false) or backward call with element type dt: the
// fast ones where they take the call (aligned16: every input is 16-byte aligned) and
// `request` is auto or fast (fast: an error where the fast forward cannot take it; a backward
// whose fast kernels do not fit runs the general d q, d k, d v, as auto's does), else the
// general ones; in a backward, d rel, d bias and d sigma from the fast offset kernel where
// the fast kernels take the call (after the fast backward or the general one) and its shared
// memory fits, else from the general one. plan.error says why a call cannot run at all (too
// many blocks, too much shared memory, a refused request).
inline CudaPlan plan_cuda(const RelposParams& p, DType dt, bool backward, bool aligned16,
                          KernelRequest request, const CudaDevice& dev) {
  using namespace plan_detail;
  using Kernels = CudaPlan::Kernels;
  CudaPlan plan;
  plan.has_offsets = backward && cuda_fast::has_offset_terms(p);
  plan.smem_optin = dev.smem_optin;
  const int sc = cuda_fast::smem_class_of(dev.smem_optin);
  if (sc >= 0) plan.layout_class = cuda_fast::smem_class_name(sc);
  // d rel, d bias, d sigma from the fast offset kernel where the call is one the fast kernels
  // take and the kernel fits (after the fast backward, or after the general one where that
  // does not fit: it needs the inputs, lse and rowd only); else the general one, saying why
  const auto offsets = [&]() {
    std::string why = request == KernelRequest::kGeneral ? "POSATTN_CUDA_KERNEL=general"
                                                         : fast_call_refusal(p, dt, aligned16, dev);
    size_t osmem = 0;
    int64_t order_ints = 0;
    std::string layout;
    if (why.empty()) why = fast_offsets_refusal(p, dt, dev, &osmem, &order_ints, &layout);
    if (!why.empty()) {
      plan.offsets_reason = "the general path computes them (not the fast offset kernel: " + why + ")";
      return;
    }
    plan.offsets = Kernels::kFast;
    plan.offsets_reason = "the fast offset kernel takes it";
    plan.offsets_layout = layout;
    plan.dsig_partials = cuda_fast::fast_offset_tiles(p).count;
    plan.offset_order = order_ints;
    plan.smem = std::max(plan.smem, osmem);
  };
  std::string not_fast = "POSATTN_CUDA_KERNEL=general";  // why the fast kernels do not take the call
  if (request != KernelRequest::kGeneral) {
    size_t smem = 0;
    std::string fwd_layout, bwd_layout;
    not_fast = fast_refusal(p, dt, aligned16, dev, &smem, &fwd_layout);
    if (request == KernelRequest::kFast && !not_fast.empty()) {
      plan.error =
          "relpos_attention: POSATTN_CUDA_KERNEL=fast, but the fast kernels cannot take this call: " +
          not_fast;
      return plan;
    }
    if (not_fast.empty() && backward) not_fast = fast_backward_refusal(p, dt, dev, &smem, &bwd_layout);
    if (not_fast.empty()) {
      plan.path = Kernels::kFast;
      (backward ? plan.backward_layout : plan.forward_layout) = backward ? bwd_layout : fwd_layout;
      plan.path_reason =
          request == KernelRequest::kFast ? "POSATTN_CUDA_KERNEL=fast" : "the fast kernels take it";
      plan.smem = smem;
    }
  }
  if (plan.path == Kernels::kGeneral) {
    plan.path_reason =
        request == KernelRequest::kGeneral ? not_fast : "the fast kernels cannot take it: " + not_fast;
    if (cuda_general::token_blocks(p) > INT_MAX) {
      plan.error = blocks_error(cuda_general::token_blocks(p), backward ? "the backward" : "the forward",
                                "split the batch");
      return plan;
    }
    by_cuda_type(dt, [&](auto t_tag) {
      using T = decltype(t_tag);
      plan.smem = backward
                      ? std::max(cuda_general::backward_dq_smem<T>(p), cuda_general::backward_dkv_smem<T>(p))
                      : cuda_general::forward_smem<T>(p);
    });
    plan.error = general_smem_error(plan.smem, p, dev);
    if (!plan.error.empty()) return plan;
  }
  if (plan.has_offsets) offsets();
  if (plan.has_offsets && plan.offsets == Kernels::kGeneral) {
    if (cuda_general::offset_blocks(p) > INT_MAX) {
      plan.error = blocks_error(cuda_general::offset_blocks(p), "the backward (d rel, d bias, d sigma)",
                                "use fewer heads");
      return plan;
    }
    size_t osmem = 0;
    by_cuda_type(dt, [&](auto t_tag) { osmem = cuda_general::backward_offset_smem<decltype(t_tag)>(p); });
    plan.error = general_smem_error(osmem, p, dev);
    plan.smem = std::max(plan.smem, osmem);
  }
  if (backward && plan.dsig_partials == 0) plan.dsig_partials = cuda_general::offset_blocks_per_head(p);
  return plan;
}

}  // namespace relpos
}  // namespace posattn
