#include "apply_maps_checks.h"

#include "../aten/shape_str.h"

namespace posattn {
namespace apply_maps {

MapsShape check_apply_maps_inputs(const at::Tensor& x, const at::Tensor& maps, const at::Tensor& index) {
  TORCH_CHECK_VALUE(x.dim() == 4, "apply_maps: x must have shape (B, H, N, D), got ", shape_str(x.sizes()));
  TORCH_CHECK_VALUE(maps.dim() == 5, "apply_maps: maps must have shape (P, H, A, m, m), got ",
                    shape_str(maps.sizes()));
  TORCH_CHECK_TYPE(at::isFloatingType(x.scalar_type()), "apply_maps: x must be a floating-point tensor, got ",
                   x.scalar_type());
  TORCH_CHECK_TYPE(maps.scalar_type() == x.scalar_type(), "apply_maps: maps has dtype ", maps.scalar_type(),
                   " but x has dtype ", x.scalar_type(), "; they must match");
  TORCH_CHECK_TYPE(index.scalar_type() == at::kLong, "apply_maps: index must be int64, got ",
                   index.scalar_type());
  TORCH_CHECK_VALUE(maps.device() == x.device() && index.device() == x.device(), "apply_maps: x (",
                    x.device(), "), maps (", maps.device(), ") and index (", index.device(),
                    ") must be on one device");
  MapsShape s;
  s.B = x.size(0);
  s.H = x.size(1);
  s.N = x.size(2);
  s.D = x.size(3);
  s.P = maps.size(0);
  s.A = maps.size(2);
  s.m = maps.size(3);
  TORCH_CHECK_VALUE(maps.size(1) == s.H, "apply_maps: maps has ", maps.size(1), " heads but x has ", s.H,
                    " (maps must be (P, H, A, m, m))");
  TORCH_CHECK_VALUE(maps.size(4) == s.m, "apply_maps: maps must hold square m x m blocks, got ",
                    shape_str(maps.sizes()));
  TORCH_CHECK_VALUE(s.P >= 1 && s.A >= 1 && s.m >= 1, "apply_maps: maps must have P, A, m >= 1, got ",
                    shape_str(maps.sizes()));
  TORCH_CHECK_VALUE(s.A * s.m == s.D, "apply_maps: A * m = ", s.A, " * ", s.m, " = ", s.A * s.m,
                    " must equal the head dim D = ", s.D, " of x");
  if (index.dim() == 2) {
    TORCH_CHECK_VALUE(index.size(0) == s.N && index.size(1) == s.A, "apply_maps: index must be (N, A) = (",
                      s.N, ", ", s.A, ") or (B, N, A), got ", shape_str(index.sizes()));
  } else if (index.dim() == 3) {
    TORCH_CHECK_VALUE(index.size(0) == s.B && index.size(1) == s.N && index.size(2) == s.A,
                      "apply_maps: index must be (N, A) or (B, N, A) = (", s.B, ", ", s.N, ", ", s.A,
                      "), got ", shape_str(index.sizes()));
    s.batched_index = true;
  } else {
    TORCH_CHECK_VALUE(false, "apply_maps: index must be (N, A) or (B, N, A), got ", shape_str(index.sizes()));
  }
  return s;
}

void check_index_range(const at::Tensor& index, int64_t P) {
  if (index.numel() == 0) return;
  const auto [lo, hi] = at::aminmax(index);
  const int64_t lo_v = lo.item<int64_t>(), hi_v = hi.item<int64_t>();
  TORCH_CHECK_VALUE(lo_v >= 0 && hi_v < P, "apply_maps: index values must be in [0, P) = [0, ", P,
                    "), got values in [", lo_v, ", ", hi_v, "]");
}

void check_grad_y(const at::Tensor& grad_y, const at::Tensor& x) {
  TORCH_CHECK_VALUE(grad_y.sizes() == x.sizes(), "apply_maps_backward: grad_y must have the shape of x ",
                    shape_str(x.sizes()), ", got ", shape_str(grad_y.sizes()));
  TORCH_CHECK_TYPE(grad_y.scalar_type() == x.scalar_type(), "apply_maps_backward: grad_y has dtype ",
                   grad_y.scalar_type(), " but x has ", x.scalar_type());
  TORCH_CHECK_VALUE(grad_y.device() == x.device(), "apply_maps_backward: grad_y must be on ", x.device());
}

}  // namespace apply_maps
}  // namespace posattn
