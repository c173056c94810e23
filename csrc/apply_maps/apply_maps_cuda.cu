// The CUDA entry points of apply_maps and its backward (ATen glue): checks,
// allocation, dtype dispatch, stream and device guard. The kernels and their
// launchers live, torch-free, in csrc/cuda/apply_maps.cuh (they also run on the
// simulated GPU: tests/cuda_sim/).
//
// d maps: by default the kernel's atomics (the order varies from run to run).
// Under torch.use_deterministic_algorithms(True) it is computed instead as the
// (B, H, N, A, m, m) outer products reduced by index_put_ with accumulate, which
// PyTorch sums in a fixed order (more memory: m times x).
#include <ATen/Context.h>
#include <ATen/Dispatch.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <climits>

#include "../aten/cuda_glue.cuh"
#include "../aten/tensor_args.h"
#include "../cuda/apply_maps.cuh"
#include "apply_maps_checks.h"

namespace posattn {
namespace apply_maps {
namespace {

void check_cuda(const at::Tensor& x) {
  TORCH_CHECK_VALUE(x.is_cuda(), "apply_maps (CUDA): x must be a CUDA tensor");
}

int64_t checked_blocks(const MapsShape& s) {
  const int64_t blocks = num_blocks(s);
  check_blocks(blocks, "apply_maps", "the call");
  // the block's map offsets (A int64) live in shared memory
  TORCH_CHECK_VALUE(s.A * static_cast<int64_t>(sizeof(int64_t)) <= static_cast<int64_t>(kStageBytes),
                    "apply_maps (CUDA): A = ", s.A, " blocks per token is more than the kernels take (",
                    kStageBytes / sizeof(int64_t), ")");
  return blocks;
}

// The index range check without a host synchronisation, for the paths that
// launch no kernel reading the index (a device-side assertion, as in the kernels).
void assert_index_range_async(const at::Tensor& index, int64_t P) {
  if (index.numel() > 0)
    at::_assert_async(((index >= 0) & (index < P)).all(), "apply_maps: index values must be in [0, P)");
}

// The deterministic d maps: every token's outer products, summed into the maps
// by index_put_ with accumulate (a fixed order under deterministic algorithms).
at::Tensor grad_maps_deterministic(const MapsShape& s, const at::Tensor& gy, const at::Tensor& x,
                                   const at::Tensor& index, const at::Tensor& maps) {
  const auto acc = x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  const at::Tensor g = gy.to(acc).view({s.B, s.H, s.N, s.A, s.m, 1});
  const at::Tensor xv = x.to(acc).view({s.B, s.H, s.N, s.A, 1, s.m});
  const at::Tensor outer = g * xv;  // (B, H, N, A, m, m)
  const at::Tensor p = (s.batched_index ? index.view({s.B, 1, s.N, s.A}) : index.view({1, 1, s.N, s.A}))
                           .expand({s.B, s.H, s.N, s.A});
  const at::TensorOptions lo = index.options();
  const at::Tensor hh = at::arange(s.H, lo).view({1, s.H, 1, 1}).expand({s.B, s.H, s.N, s.A});
  const at::Tensor aa = at::arange(s.A, lo).view({1, 1, 1, s.A}).expand({s.B, s.H, s.N, s.A});
  at::Tensor out = at::zeros(maps.sizes(), maps.options().dtype(acc));
  out.index_put_({p, hh, aa}, outer, /*accumulate=*/true);
  return out.to(maps.scalar_type());
}

at::Tensor apply_maps_cuda(const at::Tensor& x_in, const at::Tensor& maps_in, const at::Tensor& index_in) {
  const MapsShape s = check_apply_maps_inputs(x_in, maps_in, index_in);
  check_cuda(x_in);
  const c10::cuda::CUDAGuard guard(x_in.device());
  const at::Tensor x = x_in.contiguous(), maps = maps_in.contiguous(), index = index_in.contiguous();
  at::Tensor y = at::empty(x.sizes(), x.options());
  if (y.numel() == 0) {
    assert_index_range_async(index, s.P);
    return y;
  }
  checked_blocks(s);
  auto stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "apply_maps_cuda", [&] {
    using T = typename CudaType<scalar_t>::type;
    check_launch(launch_apply<T>(s, ptr_or_null<const T>(x), ptr_or_null<const T>(maps),
                                 index.data_ptr<int64_t>(), ptr_or_null<T>(y), /*transpose=*/false, stream));
  });
  return y;
}

std::tuple<at::Tensor, at::Tensor> apply_maps_backward_cuda(const at::Tensor& grad_y_in,
                                                            const at::Tensor& x_in, const at::Tensor& maps_in,
                                                            const at::Tensor& index_in, bool need_x,
                                                            bool need_maps) {
  const MapsShape s = check_apply_maps_inputs(x_in, maps_in, index_in);
  check_grad_y(grad_y_in, x_in);
  check_cuda(x_in);
  const c10::cuda::CUDAGuard guard(x_in.device());
  const at::Tensor x = x_in.contiguous(), maps = maps_in.contiguous(), index = index_in.contiguous();
  const at::Tensor gy = grad_y_in.contiguous();
  at::Tensor gx = need_x ? at::empty(x.sizes(), x.options()) : at::empty({0}, x.options());
  if (x.numel() == 0) {
    assert_index_range_async(index, s.P);
    return {need_x ? gx.zero_() : gx,
            need_maps ? at::zeros(maps.sizes(), maps.options()) : at::empty({0}, x.options())};
  }
  at::Tensor gmaps = at::empty({0}, x.options());
  const bool deterministic = at::globalContext().deterministicAlgorithms();
  auto stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "apply_maps_backward_cuda", [&] {
    using T = typename CudaType<scalar_t>::type;
    using Acc = acc_t<T>;
    if (need_x || (need_maps && !deterministic)) checked_blocks(s);  // the launches below
    if (need_x)
      check_launch(launch_apply<T>(s, ptr_or_null<const T>(gy), ptr_or_null<const T>(maps),
                                   index.data_ptr<int64_t>(), ptr_or_null<T>(gx), /*transpose=*/true,
                                   stream));
    if (need_maps && deterministic) {
      if (!need_x) assert_index_range_async(index, s.P);  // index_put_ would wrap negative values
      gmaps = grad_maps_deterministic(s, gy, x, index, maps);
    } else if (need_maps) {
      // float32 / float64 accumulate in place; half types through one buffer of the accumulation type
      at::Tensor acc = at::zeros(maps.sizes(), maps.options().dtype(c10::CppTypeToScalarType<Acc>::value));
      check_launch(launch_grad_maps<T>(s, ptr_or_null<const T>(gy), ptr_or_null<const T>(x),
                                       index.data_ptr<int64_t>(), ptr_or_null<Acc>(acc), stream));
      gmaps = acc.scalar_type() == maps.scalar_type() ? acc : acc.to(maps.scalar_type());
    }
  });
  return {gx, gmaps};
}

}  // namespace

TORCH_LIBRARY_IMPL(posattn, CUDA, m) {
  m.impl("apply_maps", &apply_maps_cuda);
  m.impl("apply_maps_backward", &apply_maps_backward_cuda);
}

}  // namespace apply_maps
}  // namespace posattn
