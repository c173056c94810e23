// The tiled tensor-core kernels of relpos_attention on CUDA (ATen glue): which
// calls they take (choose_cuda_kernel and its refusals), and their launches. The
// kernels and launchers live, torch-free, in csrc/cuda/relpos_tiled_forward.cuh
// and csrc/cuda/relpos_tiled_backward.cuh (they also run on the simulated GPU:
// tests/cuda_sim/).
#include <ATen/Context.h>
#include <c10/core/ScalarType.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAStream.h>

#include <climits>
#include <cstdlib>
#include <string>
#include <type_traits>

#include "../common/cuda_glue.cuh"
#include "../cuda/relpos_tiled_backward.cuh"
#include "../cuda/relpos_tiled_forward.cuh"
#include "../cuda/relpos_tiled_offsets.cuh"
#include "relpos_tiled_cuda.h"

namespace posattn {
namespace tiled {
namespace {

// Calls fn(CT{}, std::integral_constant<int, D>{}) for the tiled kernels' input
// type and head dim (the caller has checked D in {32, 64, 128} and the dtype).
template <typename Fn>
void by_type_and_dim(c10::ScalarType dtype, int64_t D, Fn fn) {
  auto by_dim = [&](auto ct_tag) {
    if (D == 32)
      fn(ct_tag, std::integral_constant<int, 32>{});
    else if (D == 64)
      fn(ct_tag, std::integral_constant<int, 64>{});
    else
      fn(ct_tag, std::integral_constant<int, 128>{});
  };
  if (dtype == c10::kHalf)
    by_dim(__half{});
  else if (dtype == c10::kFloat)
    by_dim(float{});
  else
    by_dim(__nv_bfloat16{});
}

// The tiling of a call, with a launch's block limit checked.
TiledArgs checked_tiled_args(const RelposParams& p) {
  const TiledArgs a = make_tiled_args(p);
  TORCH_CHECK_VALUE(a.blocks <= INT_MAX, "relpos_attention (CUDA): ", a.blocks,
                    " thread blocks needed, more than a launch allows; split the batch");
  return a;
}

// Why code compiled for (CT, D) cannot run on the current device, or empty: it
// must have been compiled for sm_80+ (bf16 tensor cores; a build JIT-compiled
// from older PTX would trap) and `need` bytes of shared memory must fit the
// device's opt-in limit.
std::string device_refusal(const cudaFuncAttributes& attr, size_t need, int D, const char* what) {
  if (attr.ptxVersion < 80 || attr.binaryVersion < 80)
    return "this build has no sm_80+ code for the device (compute capability 8.0 or newer is needed)";
  int device = 0, optin = 0;
  C10_CUDA_CHECK(cudaGetDevice(&device));
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  if (need > static_cast<size_t>(optin))
    return std::string(what) + " needs " + std::to_string(need) +
           " bytes of shared memory per block for D = " + std::to_string(D) + ", more than the device's " +
           std::to_string(optin);
  return "";
}

bool aligned16(const at::Tensor& t) {
  return !t.defined() || reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0;
}

template <typename CT, int D>
std::string kernel_refusal(int G) {
  cudaFuncAttributes attr;
  check_launch(forward_attributes<CT, D>(&attr));
  return device_refusal(attr, Layout<CT, D>::bytes(G), D, "it");
}

template <typename CT, int D>
std::string backward_refusal(int G) {
  for (bool key_major : {true, false}) {
    cudaFuncAttributes attr;
    check_launch(backward_attributes<CT, D>(key_major, &attr));
    const std::string why = device_refusal(attr, BwdLayout<CT, D>::bytes(G), D, "its backward");
    if (!why.empty()) return why;
  }
  return "";
}

template <typename CT, int D>
std::string offsets_refusal(const TiledArgs& a) {
  cudaFuncAttributes attr;
  check_launch(offsets_attributes<CT, D>(&attr));
  const OffsetGrid og = make_offset_grid(a);
  if (a.p.H * og.count > INT_MAX) return "its offset kernel needs more thread blocks than a launch allows";
  return device_refusal(attr, OffsetLayout<CT, D>::bytes(a.p.g.ndim, og.rows), D, "its offset kernel");
}

// The inputs of the tiled backward kernels (the gradients' pointers left null).
template <typename CT>
BwdTensors<CT> backward_inputs(const at::Tensor& gout, const at::Tensor& rowd, const at::Tensor& q,
                               const at::Tensor& k, const at::Tensor& v, const at::Tensor& q_pos,
                               const at::Tensor& rel, const at::Tensor& sigma, const at::Tensor& bias,
                               const at::Tensor& lse) {
  BwdTensors<CT> t{};
  t.gout = cuda_ptr<const CT>(gout);
  t.q = cuda_ptr<const CT>(q);
  t.k = cuda_ptr<const CT>(k);
  t.v = cuda_ptr<const CT>(v);
  t.qpos = cuda_ptr<const CT>(q_pos);
  t.rel = cuda_ptr<const CT>(rel);
  t.bias = cuda_ptr<const CT>(bias);
  t.rowd = cuda_ptr<const float>(rowd);
  t.lse = cuda_ptr<const float>(lse);
  t.sigma = cuda_ptr<const double>(sigma);
  return t;
}

// Why the tiled kernel cannot take a call, or empty if it can.
std::string tiled_refusal(const RelposParams& p, at::ScalarType dtype,
                          std::initializer_list<at::Tensor> tensors) {
  if (dtype == at::kFloat && !at::globalContext().allowTF32CuBLAS())
    return "float32 goes through TF32 tensor cores only where torch.backends.cuda.matmul.allow_tf32 is True";
  if (dtype != at::kHalf && dtype != at::kBFloat16 && dtype != at::kFloat)
    return "it takes float16, bfloat16 and (with TF32 allowed) float32 only";
  if (p.D != p.Dv || (p.D != 32 && p.D != 64 && p.D != 128)) return "it needs D == Dv in {32, 64, 128}";
  if (p.N > INT_MAX / 2 || p.U > INT_MAX / 2) return "the grid is too large for its 32-bit slot indices";
  for (const at::Tensor& t : tensors)
    if (!aligned16(t)) return "an input is not 16-byte aligned";
  std::string why;
  by_type_and_dim(dtype, p.D, [&](auto ct_tag, auto d_tag) {
    why = kernel_refusal<decltype(ct_tag), decltype(d_tag)::value>(p.g.ndim);
  });
  return why;
}

}  // namespace
}  // namespace tiled

using namespace tiled;

CudaKernel choose_cuda_kernel(const RelposParams& p, at::ScalarType dtype,
                              std::initializer_list<at::Tensor> tensors, bool backward) {
  const char* env = std::getenv("POSATTN_CUDA_KERNEL");
  const std::string want = env == nullptr ? "auto" : env;
  TORCH_CHECK_VALUE(want == "auto" || want == "general" || want == "tiled",
                    "POSATTN_CUDA_KERNEL must be auto, general or tiled, got \"", want, "\"");
  if (want == "general") return CudaKernel::kGeneral;
  std::string why = tiled_refusal(p, dtype, tensors);
  if (why.empty() && backward) why = tiled_backward_refusal(p, dtype);
  TORCH_CHECK_VALUE(
      want != "tiled" || why.empty(),
      "relpos_attention: POSATTN_CUDA_KERNEL=tiled, but the tiled kernel cannot take this call: ", why);
  return why.empty() ? CudaKernel::kTiled : CudaKernel::kGeneral;
}

std::string tiled_backward_refusal(const RelposParams& p, at::ScalarType dtype) {
  std::string why;
  by_type_and_dim(dtype, p.D, [&](auto ct_tag, auto d_tag) {
    why = backward_refusal<decltype(ct_tag), decltype(d_tag)::value>(p.g.ndim);
  });
  return why;
}

std::string tiled_offsets_refusal(const RelposParams& p, at::ScalarType dtype) {
  const TiledArgs a = make_tiled_args(p);
  std::string why;
  by_type_and_dim(dtype, p.D, [&](auto ct_tag, auto d_tag) {
    why = offsets_refusal<decltype(ct_tag), decltype(d_tag)::value>(a);
  });
  return why;
}

int64_t tiled_offset_partials(const RelposParams& p) {
  return make_offset_grid(make_tiled_args(p)).count;
}

void relpos_tiled_forward(const RelposParams& p, const at::Tensor& q, const at::Tensor& k,
                          const at::Tensor& v, const at::Tensor& q_pos, const at::Tensor& rel,
                          const at::Tensor& sigma, const at::Tensor& bias, at::Tensor& out, at::Tensor& lse) {
  const TiledArgs a = checked_tiled_args(p);
  auto stream = c10::cuda::getCurrentCUDAStream();
  by_type_and_dim(q.scalar_type(), p.D, [&](auto ct_tag, auto d_tag) {
    using CT = decltype(ct_tag);
    FwdTensors<CT> t;
    t.q = cuda_ptr<const CT>(q);
    t.k = cuda_ptr<const CT>(k);
    t.v = cuda_ptr<const CT>(v);
    t.qpos = cuda_ptr<const CT>(q_pos);
    t.rel = cuda_ptr<const CT>(rel);
    t.bias = cuda_ptr<const CT>(bias);
    t.sigma = cuda_ptr<const double>(sigma);
    t.out = cuda_ptr<CT>(out);
    t.lse = cuda_ptr<float>(lse);
    check_launch(launch_forward<CT, decltype(d_tag)::value>(a, t, stream));
  });
}

void relpos_tiled_backward(const RelposParams& p, const at::Tensor& gout, const at::Tensor& rowd,
                           const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           const at::Tensor& q_pos, const at::Tensor& rel, const at::Tensor& sigma,
                           const at::Tensor& bias, const at::Tensor& lse, at::Tensor& dq, at::Tensor& dk,
                           at::Tensor& dv, at::Tensor& dqpos) {
  const TiledArgs a = checked_tiled_args(p);
  auto stream = c10::cuda::getCurrentCUDAStream();
  by_type_and_dim(q.scalar_type(), p.D, [&](auto ct_tag, auto d_tag) {
    using CT = decltype(ct_tag);
    auto out = [](at::Tensor& x) { return x.numel() > 0 ? cuda_ptr<CT>(x) : nullptr; };
    BwdTensors<CT> t = backward_inputs<CT>(gout, rowd, q, k, v, q_pos, rel, sigma, bias, lse);
    t.dq = out(dq);
    t.dk = out(dk);
    t.dv = out(dv);
    t.dqpos = out(dqpos);
    check_launch(launch_backward<CT, decltype(d_tag)::value>(a, t, stream));
  });
}

void relpos_tiled_backward_offsets(const RelposParams& p, const at::Tensor& gout, const at::Tensor& rowd,
                                   const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                   const at::Tensor& q_pos, const at::Tensor& rel, const at::Tensor& sigma,
                                   const at::Tensor& bias, const at::Tensor& lse, at::Tensor& drel,
                                   at::Tensor& dbias, at::Tensor& dsig_part) {
  const TiledArgs a = make_tiled_args(p);
  auto stream = c10::cuda::getCurrentCUDAStream();
  const auto f32 = q.options().dtype(at::kFloat);
  // float32 accumulators, zeroed by the launcher (one set of rows per launch: no atomics)
  at::Tensor drel_acc = at::empty({p.has_pos ? p.H * p.U * p.D : 0}, f32);
  at::Tensor dbias_acc = at::empty({p.has_bias ? p.H * p.U : 0}, f32);
  by_type_and_dim(q.scalar_type(), p.D, [&](auto ct_tag, auto d_tag) {
    using CT = decltype(ct_tag);
    OffsetTensors<CT> t;
    t.in = backward_inputs<CT>(gout, rowd, q, k, v, q_pos, rel, sigma, bias, lse);
    t.drel_acc = p.has_pos ? cuda_ptr<float>(drel_acc) : nullptr;
    t.dbias_acc = p.has_bias ? cuda_ptr<float>(dbias_acc) : nullptr;
    t.dsig_part = p.has_sigma ? cuda_ptr<double>(dsig_part) : nullptr;
    check_launch(launch_backward_offsets<CT, decltype(d_tag)::value>(
        a, t, p.has_pos ? cuda_ptr<CT>(drel) : nullptr, p.has_bias ? cuda_ptr<CT>(dbias) : nullptr, stream));
  });
}

}  // namespace posattn
