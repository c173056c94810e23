// CPU entry points of apply_maps: checks, outputs, and the kernels of this
// CPU's capability (cpu/kernels.h; the kernels are in cpu/apply_maps.inc).
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "../cpu/kernels.h"
#include "apply_maps_checks.h"

namespace posattn {
namespace apply_maps {
namespace {

void check_cpu(const at::Tensor& x) {
  TORCH_CHECK_TYPE(x.scalar_type() == at::kFloat || x.scalar_type() == at::kDouble,
                   "apply_maps (CPU): x and maps must be float32 or float64, got ", x.scalar_type());
}

at::Tensor apply_maps_cpu(const at::Tensor& x_in, const at::Tensor& maps_in, const at::Tensor& index_in) {
  const MapsShape s = check_apply_maps_inputs(x_in, maps_in, index_in);
  check_cpu(x_in);
  check_index_range(index_in, s.P);
  const at::Tensor x = x_in.contiguous(), maps = maps_in.contiguous(), index = index_in.contiguous();
  at::Tensor y = at::empty(x.sizes(), x.options());
  if (y.numel() == 0) return y;
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "apply_maps_cpu", [&] {
    cpu::typed<scalar_t>(cpu::kernels())
        .maps_forward(s, x.data_ptr<scalar_t>(), maps.data_ptr<scalar_t>(), index.data_ptr<int64_t>(),
                      y.data_ptr<scalar_t>());
  });
  return y;
}

std::tuple<at::Tensor, at::Tensor> apply_maps_backward_cpu(const at::Tensor& grad_y_in,
                                                           const at::Tensor& x_in, const at::Tensor& maps_in,
                                                           const at::Tensor& index_in, bool need_x,
                                                           bool need_maps) {
  const MapsShape s = check_apply_maps_inputs(x_in, maps_in, index_in);
  check_grad_y(grad_y_in, x_in);
  check_cpu(x_in);
  check_index_range(index_in, s.P);
  const at::Tensor x = x_in.contiguous(), maps = maps_in.contiguous(), index = index_in.contiguous();
  const at::Tensor gy = grad_y_in.contiguous();
  at::Tensor gx = need_x ? at::zeros(x.sizes(), x.options()) : at::empty({0}, x.options());
  at::Tensor gmaps = need_maps ? at::zeros(maps.sizes(), maps.options()) : at::empty({0}, x.options());
  if (x.numel() == 0) return {gx, gmaps};
  const cpu::Kernels& kernels = cpu::kernels();  // of this CPU's capability
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "apply_maps_backward_cpu", [&] {
    if (need_x)
      cpu::typed<scalar_t>(kernels).maps_grad_x(s, gy.data_ptr<scalar_t>(), maps.data_ptr<scalar_t>(),
                                                index.data_ptr<int64_t>(), gx.data_ptr<scalar_t>());
    if (need_maps)
      cpu::typed<scalar_t>(kernels).maps_grad_maps(s, gy.data_ptr<scalar_t>(), x.data_ptr<scalar_t>(),
                                                   index.data_ptr<int64_t>(), gmaps.data_ptr<scalar_t>());
  });
  return {gx, gmaps};
}

}  // namespace

TORCH_LIBRARY_IMPL(posattn, CPU, m) {
  m.impl("apply_maps", &apply_maps_cpu);
  m.impl("apply_maps_backward", &apply_maps_backward_cpu);
}

}  // namespace apply_maps
}  // namespace posattn
