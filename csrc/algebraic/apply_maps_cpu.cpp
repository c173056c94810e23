// CPU kernels of apply_maps: y_block = maps[index] @ x_block per token, head and axis.
//
// With an index shared by the batch, a task takes one (head, token) and applies
// each of its maps to the token in every batch element, so a map is read from
// memory once per forward instead of once per batch element. Nothing of size
// (B, N, H, m, m) is formed. dmaps is accumulated per (head, axis) task: each
// task owns the maps of its (head, axis), so there are no races.
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "../common/cpu_vec.h"
#include "apply_maps_checks.h"

namespace posattn {
namespace algebraic {
namespace {

// y = M x and the transpose product x = M^T y for one m-block.
template <typename T>
inline void matvec(const T* M, const T* x, T* y, int64_t m) {
  for (int64_t i = 0; i < m; ++i) y[i] = cpu::dot(M + i * m, x, m);
}
template <typename T>
inline void matvec_t_add(const T* M, const T* y, T* x, int64_t m) {
  for (int64_t i = 0; i < m; ++i) {
    const T yi = y[i];
    const T* row = M + i * m;
    for (int64_t j = 0; j < m; ++j) x[j] += yi * row[j];
  }
}

// Calls fn(M, offset) for every (batch, head, token, block): M is the block's
// map, offset the block's position in x / y. Tasks are (head, token) when the
// index is shared by the batch (the batch loop runs inside, reusing M), else
// (batch, head, token).
template <typename T, typename Fn>
void for_each_block(const MapsShape& s, const T* maps, const int64_t* index, Fn fn) {
  const int64_t outer = s.batched_index ? s.B : 1, inner_b = s.batched_index ? 1 : s.B;
  at::parallel_for(0, outer * s.H * s.N, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t n = t % s.N, h = (t / s.N) % s.H, b0 = t / (s.N * s.H);
      for (int64_t a = 0; a < s.A; ++a) {
        const T* M = maps + map_offset(s, index[index_offset(s, b0, n, a)], h, a);
        for (int64_t bi = 0; bi < inner_b; ++bi) fn(M, x_offset(s, b0 + bi, h, n, a));
      }
    }
  });
}

template <typename T>
void forward_kernel(const MapsShape& s, const T* x, const T* maps, const int64_t* index, T* y) {
  for_each_block(s, maps, index, [&](const T* M, int64_t off) { matvec(M, x + off, y + off, s.m); });
}

template <typename T>
void grad_x_kernel(const MapsShape& s, const T* gy, const T* maps, const int64_t* index, T* gx) {
  for_each_block(s, maps, index, [&](const T* M, int64_t off) { matvec_t_add(M, gy + off, gx + off, s.m); });
}

template <typename T>
void grad_maps_kernel(const MapsShape& s, const T* gy, const T* x, const int64_t* index, T* gmaps) {
  // dM[index[b, n, a], h, a] += gy_block (outer) x_block, summed over b and n.
  at::parallel_for(0, s.H * s.A, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t h = t / s.A, a = t % s.A;
      for (int64_t b = 0; b < s.B; ++b) {
        for (int64_t n = 0; n < s.N; ++n) {
          T* dM = gmaps + map_offset(s, index[index_offset(s, b, n, a)], h, a);
          const T* gyb = gy + x_offset(s, b, h, n, a);
          const T* xb = x + x_offset(s, b, h, n, a);
          for (int64_t i = 0; i < s.m; ++i) {
            const T gi = gyb[i];
            T* row = dM + i * s.m;
            for (int64_t j = 0; j < s.m; ++j) row[j] += gi * xb[j];
          }
        }
      }
    }
  });
}

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
    forward_kernel<scalar_t>(s, x.data_ptr<scalar_t>(), maps.data_ptr<scalar_t>(), index.data_ptr<int64_t>(),
                             y.data_ptr<scalar_t>());
  });
  return y;
}

std::tuple<at::Tensor, at::Tensor> apply_maps_backward_cpu(const at::Tensor& grad_y_in, const at::Tensor& x_in,
                                                           const at::Tensor& maps_in, const at::Tensor& index_in,
                                                           bool need_x, bool need_maps) {
  const MapsShape s = check_apply_maps_inputs(x_in, maps_in, index_in);
  check_grad_y(grad_y_in, x_in);
  check_cpu(x_in);
  check_index_range(index_in, s.P);
  const at::Tensor x = x_in.contiguous(), maps = maps_in.contiguous(), index = index_in.contiguous();
  const at::Tensor gy = grad_y_in.contiguous();
  at::Tensor gx = need_x ? at::zeros(x.sizes(), x.options()) : at::empty({0}, x.options());
  at::Tensor gmaps = need_maps ? at::zeros(maps.sizes(), maps.options()) : at::empty({0}, x.options());
  if (x.numel() == 0) return {gx, gmaps};
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "apply_maps_backward_cpu", [&] {
    if (need_x)
      grad_x_kernel<scalar_t>(s, gy.data_ptr<scalar_t>(), maps.data_ptr<scalar_t>(), index.data_ptr<int64_t>(),
                              gx.data_ptr<scalar_t>());
    if (need_maps)
      grad_maps_kernel<scalar_t>(s, gy.data_ptr<scalar_t>(), x.data_ptr<scalar_t>(), index.data_ptr<int64_t>(),
                                 gmaps.data_ptr<scalar_t>());
  });
  return {gx, gmaps};
}

}  // namespace

TORCH_LIBRARY_IMPL(posattn, CPU, m) {
  m.impl("apply_maps", &apply_maps_cpu);
  m.impl("apply_maps_backward", &apply_maps_backward_cpu);
}

}  // namespace algebraic
}  // namespace posattn
