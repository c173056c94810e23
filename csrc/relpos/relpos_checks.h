// Argument validation for relpos_attention, shared by every backend.
#pragma once

#include <torch/types.h>

#include <string>

#include "../core/relpos_shape.h"

namespace posattn {

SpanMode parse_span_mode(const std::string& span_mode);

// The dtype of the saved log-sum-exp: the accumulation type (float32 for
// float16 / bfloat16 / float32 inputs, float64 for float64), so that the
// backward's probabilities sum to one whatever the input precision.
inline at::ScalarType lse_dtype(at::ScalarType q) {
  return q == at::kDouble ? at::kDouble : at::kFloat;
}

// Checks shapes, dtypes, devices and scalar arguments; throws ValueError /
// TypeError naming the argument. A packed call (packed_offsets and packed_shapes given) has B = 1
// and `grid` is its max_grid, the extent of the offset tables, not its tokens' grid. Does not read tensor
// values (see check_sigma_values_cpu, or the CUDA kernels' device-side check, for that), so it is safe for
// every device.
RelposShape check_relpos_inputs(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                const c10::optional<at::Tensor>& q_pos, const c10::optional<at::Tensor>& rel,
                                at::IntArrayRef grid, const c10::optional<at::Tensor>& sigma,
                                double threshold, const std::string& span_mode, double scale,
                                const c10::optional<at::Tensor>& bias, at::OptionalIntArrayRef window,
                                const std::string& window_border, at::OptionalIntArrayRef window_right,
                                at::OptionalIntArrayRef window_stride, at::OptionalIntArrayRef window_causal,
                                const c10::optional<at::Tensor>& packed_offsets,
                                const c10::optional<at::Tensor>& packed_shapes);

// Checks the values of a CPU packed call's offsets and shapes (s: its checked shape): the
// samples tile the tokens from 0 in order, each with a grid of at most max_grid (s.grid).
void check_packed_values_cpu(const RelposShape& s, const at::Tensor& offsets, const at::Tensor& shapes);

// Checks that a CPU sigma tensor holds only positive finite values.
void check_sigma_values_cpu(const at::Tensor& sigma);

// Extra checks for the backward's own tensors (grad_out, grad_lse, out, lse).
void check_relpos_backward_inputs(const RelposShape& s, const at::Tensor& q, const at::Tensor& grad_out,
                                  const c10::optional<at::Tensor>& grad_lse, const at::Tensor& out,
                                  const at::Tensor& lse);

}  // namespace posattn
