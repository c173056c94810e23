// Argument validation for apply_maps, shared by every backend.
#pragma once

#include <torch/types.h>

#include "../core/apply_maps_layout.h"

namespace posattn {
namespace apply_maps {

// Shapes, dtypes and devices (no values read); throws ValueError / TypeError
// naming the argument.
MapsShape check_apply_maps_inputs(const at::Tensor& x, const at::Tensor& maps, const at::Tensor& index);

// Every index value in [0, P): reads the values on the host (the CPU kernels;
// the CUDA kernels check on the device instead, without a synchronisation).
void check_index_range(const at::Tensor& index, int64_t P);

// grad_y must have x's shape, dtype and device.
void check_grad_y(const at::Tensor& grad_y, const at::Tensor& x);

}  // namespace apply_maps
}  // namespace posattn
