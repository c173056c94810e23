// The CUDA entry points of relpos_attention, its backward and its plan (ATen
// glue): the checked call, its plan (cuda/relpos_plan.cuh: which kernels run it),
// the outputs, the RelposTensors the kernels take, the stream and device guard,
// and the launches: the fast kernels (cuda/relpos_fast.cuh, one translation unit
// per element type and head dim in cuda/fast/) or the general ones
// (cuda/relpos_general.cuh). The kernels are torch-free and also run on the
// simulated GPU (tests/cuda_sim/). The backward is deterministic: no atomics.
#include <ATen/Context.h>
#include <ATen/Dispatch.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <atomic>
#include <cstdlib>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "../aten/cuda_glue.cuh"
#include "../cuda/relpos_fast.cuh"
#include "../cuda/relpos_fast_tables.cuh"
#include "../cuda/relpos_general.cuh"
#include "../cuda/relpos_plan.cuh"
#include "relpos_args.h"

namespace posattn {
namespace relpos {
namespace {

// Whether this build has sm_80+ code for the current device (the fast kernels
// trap below it), read once per device from a fast kernel's attributes.
bool tensor_core_code() {
  constexpr int kMaxDevices = 64;
  static std::atomic<int> cache[kMaxDevices] = {};  // 0: not read yet, 1: no, 2: yes
  int device = 0;
  C10_CUDA_CHECK(cudaGetDevice(&device));
  int known = device < kMaxDevices ? cache[device].load(std::memory_order_relaxed) : 0;
  if (known == 0) {
    cudaFuncAttributes attr;
    check_launch(cuda_fast::FastKernels<__half, 32>::attributes(&attr));
    known = attr.ptxVersion >= 80 && attr.binaryVersion >= 80 ? 2 : 1;
    if (device < kMaxDevices) cache[device].store(known, std::memory_order_relaxed);
  }
  return known == 2;
}

// The device's opt-in shared memory per block, or less where POSATTN_CUDA_SMEM_OPTIN says so: the
// plan then chooses the kernels and layouts a device with that limit runs (an A100's 166912, an
// RTX's 101376), so that one GPU measures and tests what the smaller ones get.
size_t planned_smem_optin() {
  const size_t optin = device_smem_optin();
  const char* env = std::getenv("POSATTN_CUDA_SMEM_OPTIN");
  if (env == nullptr || *env == '\0') return optin;
  char* end = nullptr;
  const unsigned long long v = std::strtoull(env, &end, 10);
  TORCH_CHECK_VALUE(*env >= '0' && *env <= '9' && *end == '\0' && v > 0 && v <= optin,
                    "POSATTN_CUDA_SMEM_OPTIN must be a number of bytes from 1 to the device's opt-in shared "
                    "memory per block (",
                    optin, "), got '", env, "'");
  return static_cast<size_t>(v);
}

// The current device as the plan sees it.
CudaDevice cuda_device() {
  CudaDevice dev;
  dev.smem_optin = planned_smem_optin();
  dev.tensor_cores = tensor_core_code();
  dev.allow_tf32 = at::globalContext().allowTF32CuBLAS();
  return dev;
}

bool aligned16(std::initializer_list<at::Tensor> tensors) {
  for (const at::Tensor& t : tensors)
    if (t.defined() && reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 != 0) return false;
  return true;
}

// The plan of a checked call on the current device; `gout`: the backward's grad_out.
CudaPlan plan_call(const RelposCall& c, bool backward, const at::Tensor& gout = at::Tensor()) {
  const char* env = std::getenv("POSATTN_CUDA_KERNEL");
  TORCH_CHECK_VALUE(env == nullptr || std::string(env) != "tiled",
                    "POSATTN_CUDA_KERNEL=tiled: the tiled CUDA kernels were removed on 2026-11-29 (the fast "
                    "ones take their calls); use 'auto', 'fast' or 'general'");
  const KernelRequest request =
      kernel_request("POSATTN_CUDA_KERNEL", KernelRequest::kGeneral, KernelRequest::kFast);
  return plan_cuda(c.params, relpos_dtype(c.q.scalar_type()), backward,
                   aligned16({c.q, c.k, c.v, c.q_pos, c.rel, gout}), request, cuda_device());
}

// sigma as double for the kernels (a small (H, G) tensor; no host sync).
at::Tensor sigma_double(const at::Tensor& sg) {
  return sg.defined() ? sg.to(at::kDouble).contiguous() : at::Tensor();
}

// Calls fn(std::integral_constant<int, D>{}) for the call's head dim (32, 64 or 128: the plan's fast path).
template <typename Fn>
void by_fast_dim(int64_t D, Fn fn) {
  if (D == 32)
    fn(std::integral_constant<int, 32>{});
  else if (D == 64)
    fn(std::integral_constant<int, 64>{});
  else
    fn(std::integral_constant<int, 128>{});
}

// The fast kernels' forward or backward (d q, d k, d v, d q_pos, unless `offsets_only`; with
// `offsets`, d rel, d bias, d sigma too): the per-offset terms (bias, span) as float32 tables,
// then the kernels.
// The layouts follow the device's shared memory the plan was made for (plan.smem_optin).
template <typename T>
void launch_fast(const RelposCall& c, const CudaPlan& plan, RelposTensors<T> t, bool backward, bool offsets,
                 cudaStream_t stream, bool offsets_only = false) {
  const RelposParams& p = c.params;
  const auto table = [&](bool has) {
    return has ? at::empty({p.H, cuda_fast::offset_table_len<T>(p)}, c.q.options().dtype(at::kFloat))
               : at::Tensor();
  };
  const at::Tensor add = table(cuda_fast::has_offset_add(p)), mul = table(cuda_fast::has_offset_mul(p));
  t.offset_add = ptr_or_null<float>(add);
  t.offset_mul = ptr_or_null<float>(mul);
  // a packed call's schedule (its samples ranked by their tiles and the prefix sums of those, filled by
  // the launchers)
  const at::Tensor tiles =
      p.packed_samples > 0 ? at::empty({cuda_packed::packed_schedule_ints(p)}, c.q.options().dtype(at::kInt))
                           : at::Tensor();
  t.packed_tiles = ptr_or_null<int>(tiles);
  check_launch(
      cuda_fast::launch_offset_tables<T>(p, t, ptr_or_null<float>(add), ptr_or_null<float>(mul), stream));
  by_fast_dim(p.D, [&](auto d) {
    using K = cuda_fast::FastKernels<T, decltype(d)::value>;
    const size_t optin = plan.smem_optin;
    if (!offsets_only)
      check_launch(backward ? K::backward(p, t, optin, stream) : K::forward(p, t, optin, stream));
    if (backward && offsets) check_launch(K::offsets(p, t, optin, stream));
  });
  // (the tables' memory goes back to the caching allocator on this stream, after the kernels)
}

template <typename T>
void launch_forward(const RelposCall& c, const CudaPlan& plan, RelposTensors<T> t, cudaStream_t stream) {
  if constexpr (!std::is_same<T, double>::value) {  // (float32: through TF32)
    if (plan.path == CudaPlan::Kernels::kFast) return launch_fast(c, plan, t, false, false, stream);
  }
  check_launch(cuda_general::launch_forward<T>(c.params, t, stream));
}

template <typename T>
void launch_backward(const RelposCall& c, const CudaPlan& plan, const RelposTensors<T>& t,
                     cudaStream_t stream) {
  using Kernels = CudaPlan::Kernels;
  const RelposParams& p = c.params;
  if constexpr (!std::is_same<T, double>::value) {  // (float32: through TF32)
    const bool fast_offsets = plan.has_offsets && plan.offsets == Kernels::kFast;
    if (plan.path == Kernels::kFast)
      launch_fast(c, plan, t, true, fast_offsets, stream);
    else if (fast_offsets)  // (beside the general d q, d k, d v below: other outputs)
      launch_fast(c, plan, t, true, true, stream, /*offsets_only=*/true);
  }
  if (plan.path == Kernels::kGeneral) {
    check_launch(cuda_general::launch_backward_dq<T>(p, t, stream));
    check_launch(cuda_general::launch_backward_dkv<T>(p, t, stream));
  }
  if (plan.has_offsets && plan.offsets == Kernels::kGeneral)
    check_launch(cuda_general::launch_backward_offset<T>(p, t, stream));
}

std::tuple<at::Tensor, at::Tensor> relpos_attention_cuda(POSATTN_RELPOS_HEAD_PARAMS,
                                                         POSATTN_RELPOS_TAIL_PARAMS) {
  const RelposCall c = checked_call(POSATTN_RELPOS_ARGS);
  TORCH_CHECK_VALUE(q.is_cuda(), "relpos_attention (CUDA): q must be a CUDA tensor");
  const c10::cuda::CUDAGuard guard(q.device());
  const RelposShape& s = c.shape;
  at::Tensor out = at::empty({s.B, s.H, s.N, s.Dv}, c.q.options());
  at::Tensor lse = at::empty({s.B, s.H, s.N}, c.q.options().dtype(lse_dtype(c.q.scalar_type())));
  if (s.B == 0 || s.H == 0) return {out, lse};
  const CudaPlan plan = plan_call(c, /*backward=*/false);
  TORCH_CHECK_VALUE(plan.error.empty(), plan.error);
  const at::Tensor sg = sigma_double(c.sigma);
  auto stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, c.q.scalar_type(), "relpos_attention_cuda", [&] {
    using T = typename CudaType<scalar_t>::type;
    RelposTensors<T> t = relpos_inputs<T>(c, sg);
    t.out = ptr_or_null<T>(out);
    t.lse = ptr_or_null<acc_t<T>>(lse);
    launch_forward(c, plan, t, stream);
  });
  return {out, lse};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>
relpos_attention_backward_cuda(const at::Tensor& grad_out, const c10::optional<at::Tensor>& grad_lse,
                               POSATTN_RELPOS_HEAD_PARAMS, const at::Tensor& out, const at::Tensor& lse,
                               POSATTN_RELPOS_TAIL_PARAMS) {
  const RelposCall c = checked_call(POSATTN_RELPOS_ARGS);
  const RelposShape& s = c.shape;
  check_relpos_backward_inputs(s, q, grad_out, grad_lse, out, lse);
  TORCH_CHECK_VALUE(q.is_cuda(), "relpos_attention_backward (CUDA): q must be a CUDA tensor");
  const c10::cuda::CUDAGuard guard(q.device());
  const at::Tensor gout = grad_out.contiguous();
  at::Tensor dq = at::empty_like(c.q), dk = at::empty_like(c.k), dv = at::empty_like(c.v);
  at::Tensor dqpos = empty_if(s.has_pos, c.q), drel = empty_if(s.has_pos, c.rel);
  at::Tensor dbias = empty_if(s.has_bias, c.bias);
  at::Tensor dsigma;
  if (s.B == 0 || s.H == 0) {
    for (at::Tensor* g : {&dq, &dk, &dv, &dqpos, &drel, &dbias})
      if (g->defined()) g->zero_();
    if (s.has_sigma) dsigma = at::zeros_like(*sigma);
  } else {
    const CudaPlan plan = plan_call(c, /*backward=*/true, gout);
    TORCH_CHECK_VALUE(plan.error.empty(), plan.error);
    const auto acc = lse_dtype(c.q.scalar_type());
    const at::Tensor lse_c = lse.to(acc).contiguous();
    // D_i = dO_i . out_i - d lse_i, the softmax backward's row term
    at::Tensor rowd = (gout.to(acc) * out.to(acc)).sum(-1);
    if (grad_lse.has_value()) rowd = rowd - grad_lse->to(acc);
    rowd = rowd.contiguous();
    // the fast offset kernel's float32 accumulators (zeroed by its launcher)
    const bool offset_acc = plan.has_offsets && plan.offsets != CudaPlan::Kernels::kGeneral;
    const auto f32 = c.q.options().dtype(at::kFloat);
    const at::Tensor drel_acc = offset_acc && s.has_pos ? at::empty({c.rel.numel()}, f32) : at::Tensor();
    const at::Tensor dbias_acc = offset_acc && s.has_bias ? at::empty({c.bias.numel()}, f32) : at::Tensor();
    const at::Tensor dsig_part =
        s.has_sigma ? at::zeros({s.H, plan.dsig_partials, c.params.G_in}, c.q.options().dtype(at::kDouble))
                    : at::Tensor();
    // the fast offset kernel's ticket and done flags (zeroed by its launcher)
    const at::Tensor offset_order =
        plan.offset_order > 0 ? at::empty({plan.offset_order}, c.q.options().dtype(at::kInt)) : at::Tensor();
    const at::Tensor sg = sigma_double(c.sigma);
    auto stream = c10::cuda::getCurrentCUDAStream();
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, c.q.scalar_type(),
                                    "relpos_attention_backward_cuda", [&] {
                                      using T = typename CudaType<scalar_t>::type;
                                      RelposTensors<T> t = relpos_inputs<T>(c, sg);
                                      t.gout = ptr_or_null<const T>(gout);
                                      t.rowd = ptr_or_null<const acc_t<T>>(rowd);
                                      t.lse = ptr_or_null<acc_t<T>>(lse_c);
                                      t.dq = ptr_or_null<T>(dq);
                                      t.dk = ptr_or_null<T>(dk);
                                      t.dv = ptr_or_null<T>(dv);
                                      t.dqpos = ptr_or_null<T>(dqpos);
                                      t.drel = ptr_or_null<T>(drel);
                                      t.dbias = ptr_or_null<T>(dbias);
                                      t.dsig_part = ptr_or_null<double>(dsig_part);
                                      t.drel_acc = ptr_or_null<float>(drel_acc);
                                      t.dbias_acc = ptr_or_null<float>(dbias_acc);
                                      t.offset_order = ptr_or_null<int>(offset_order);
                                      launch_backward(c, plan, t, stream);
                                    });
    // d sigma in sigma's own dtype (float32 is allowed with half inputs: it is a
    // sum over every pair of terms in 1 / sigma^3, which overflows float16).
    if (s.has_sigma) dsigma = dsig_part.sum(1).to(sigma->scalar_type());
  }
  return {dq, dk, dv, or_empty(dqpos, c.q), or_empty(drel, c.q), or_empty(dsigma, c.q), or_empty(dbias, c.q)};
}

std::string relpos_plan_cuda(POSATTN_RELPOS_HEAD_PARAMS, POSATTN_RELPOS_TAIL_PARAMS, bool backward) {
  const RelposCall c = checked_call(POSATTN_RELPOS_ARGS);
  TORCH_CHECK_VALUE(q.is_cuda(), "relpos_plan (CUDA): q must be a CUDA tensor");
  const c10::cuda::CUDAGuard guard(q.device());
  return describe(plan_call(c, backward), backward);
}

}  // namespace

TORCH_LIBRARY_IMPL(posattn, CUDA, m) {
  m.impl("relpos_attention", &relpos_attention_cuda);
  m.impl("relpos_attention_backward", &relpos_attention_backward_cuda);
  m.impl("relpos_plan", &relpos_plan_cuda);
}

}  // namespace relpos
}  // namespace posattn
