// The ATen side of a relpos_attention call, shared by the CPU and CUDA entry
// points: the checked call (its RelposShape, contiguous tensors and
// RelposParams), the kernels' RelposTensors filled from it once, the element
// type, and the kernel request of POSATTN_CPU_KERNEL / POSATTN_CUDA_KERNEL.
#pragma once

#include <torch/types.h>

#include <cstdlib>
#include <string>

#include "../aten/tensor_args.h"
#include "../core/relpos_params.h"
#include "../core/relpos_plan.h"
#include "../core/relpos_tensors.h"
#include "relpos_checks.h"

namespace posattn {
namespace relpos {

// relpos_attention's schema arguments (csrc/ops.cpp) as every backend's entry points
// take them, written once: the forward takes HEAD then TAIL; the backward takes
// grad_out, grad_lse, HEAD, out, lse, TAIL; the plan HEAD, TAIL, backward.
#define POSATTN_RELPOS_HEAD_PARAMS                                                                      \
  const at::Tensor &q, const at::Tensor &k, const at::Tensor &v, const c10::optional<at::Tensor>&q_pos, \
      const c10::optional<at::Tensor>&rel, at::IntArrayRef grid, const c10::optional<at::Tensor>&sigma, \
      double threshold, c10::string_view span_mode, double scale, bool causal
#define POSATTN_RELPOS_TAIL_PARAMS                                                                      \
  const c10::optional<at::Tensor>&bias, at::OptionalIntArrayRef window, c10::string_view window_border, \
      at::OptionalIntArrayRef window_right, at::OptionalIntArrayRef window_stride,                      \
      at::OptionalIntArrayRef window_causal, const c10::optional<at::Tensor>&packed_offsets,            \
      const c10::optional<at::Tensor>&packed_shapes
#define POSATTN_RELPOS_ARGS                                                                           \
  q, k, v, q_pos, rel, grid, sigma, threshold, span_mode, scale, causal, bias, window, window_border, \
      window_right, window_stride, window_causal, packed_offsets, packed_shapes

// A call after check_relpos_inputs: its tensors contiguous (undefined where not given).
struct RelposCall {
  RelposShape shape;
  RelposParams params;
  at::Tensor q, k, v, q_pos, rel, bias, sigma;
  at::Tensor packed_offsets, packed_shapes;  // a packed call's (undefined otherwise)
};

inline RelposCall checked_call(POSATTN_RELPOS_HEAD_PARAMS, POSATTN_RELPOS_TAIL_PARAMS) {
  RelposCall c;
  c.shape = check_relpos_inputs(q, k, v, q_pos, rel, grid, sigma, threshold, std::string(span_mode), scale,
                                bias, window, std::string(window_border), window_right, window_stride,
                                window_causal, packed_offsets, packed_shapes);
  c.params = make_relpos_params(c.shape, threshold, scale, causal);
  c.q = q.contiguous();
  c.k = k.contiguous();
  c.v = v.contiguous();
  c.q_pos = opt_contig(q_pos);
  c.rel = opt_contig(rel);
  c.bias = opt_contig(bias);
  c.sigma = opt_contig(sigma);
  c.packed_offsets = opt_contig(packed_offsets);
  c.packed_shapes = opt_contig(packed_shapes);
  return c;
}

// The kernels' view of the call's inputs (T: the kernels' element type, the CUDA
// twin of the ATen one on CUDA); `sigma`: sigma as the kernels take it (float64 on
// CUDA), or undefined. The caller fills in the outputs and the backward's tensors.
template <typename T>
RelposTensors<T> relpos_inputs(const RelposCall& c, const at::Tensor& sigma = at::Tensor()) {
  RelposTensors<T> t;
  t.q = ptr_or_null<const T>(c.q);
  t.k = ptr_or_null<const T>(c.k);
  t.v = ptr_or_null<const T>(c.v);
  t.qpos = ptr_or_null<const T>(c.q_pos);
  t.rel = ptr_or_null<const T>(c.rel);
  t.bias = ptr_or_null<const T>(c.bias);
  t.sigma = ptr_or_null<const double>(sigma);
  t.packed_offsets = ptr_or_null<const int>(c.packed_offsets);
  t.packed_shapes = ptr_or_null<const int>(c.packed_shapes);
  return t;
}

inline DType relpos_dtype(at::ScalarType t) {
  switch (t) {
    case at::kDouble:
      return DType::kFloat64;
    case at::kFloat:
      return DType::kFloat32;
    case at::kHalf:
      return DType::kFloat16;
    default:
      return DType::kBFloat16;
  }
}

// The request of environment variable `name` (read on every call: a misspelt
// value is an error even where it would change nothing): "auto" (or empty), or
// the name of `first` or `second`.
inline KernelRequest kernel_request(const char* name, KernelRequest first, KernelRequest second) {
  const char* env = std::getenv(name);
  const std::string want = env == nullptr ? "" : env;
  if (want.empty() || want == "auto") return KernelRequest::kAuto;
  TORCH_CHECK_VALUE(want == request_name(first) || want == request_name(second), name, " must be 'auto', '",
                    request_name(first), "' or '", request_name(second), "', got '", want, "'");
  return want == request_name(first) ? first : second;
}

}  // namespace relpos
}  // namespace posattn
