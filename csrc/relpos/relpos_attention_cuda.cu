// The CUDA entry points of relpos_attention and its backward (ATen glue): the
// argument checks, allocation, dtype dispatch, stream and device guard, and the
// choice between the tiled tensor-core kernels (relpos_tiled_cuda.cu) and the
// general path, whose kernels and launchers live, torch-free, in
// csrc/cuda/relpos_general.cuh (they also run on the simulated GPU:
// tests/cuda_sim/). The backward is deterministic: no atomics anywhere.
#include <ATen/Dispatch.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <algorithm>
#include <climits>
#include <string>

#include "../common/cuda_glue.cuh"
#include "../common/tensor_args.h"
#include "../cuda/relpos_general.cuh"
#include "relpos_checks.h"
#include "relpos_params.h"
#include "relpos_tiled_cuda.h"

namespace posattn {
namespace {

// Grid sizes and dynamic shared memory within the device's limits, with an
// error naming the sizes that exceed them.
void check_blocks(int64_t blocks, const char* what, const char* remedy = "split the batch") {
  TORCH_CHECK_VALUE(blocks <= INT_MAX, "relpos_attention (CUDA): ", what, " needs ", blocks,
                    " thread blocks, more than a launch allows (", INT_MAX, "); ", remedy);
}

void check_smem(size_t bytes, const RelposShape& s) {
  check_smem_fits(bytes, "relpos_attention (CUDA): head dims D = " + std::to_string(s.D) +
                             ", Dv = " + std::to_string(s.Dv));
}

// The inputs of a call as the general kernels take them (the outputs are filled by the caller).
template <typename T>
general::Tensors<T> input_ptrs(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                               const at::Tensor& qp, const at::Tensor& rl, const at::Tensor& bs,
                               const at::Tensor& sg) {
  general::Tensors<T> t;
  t.q = cuda_ptr<const T>(q);
  t.k = cuda_ptr<const T>(k);
  t.v = cuda_ptr<const T>(v);
  t.qpos = cuda_ptr<const T>(qp);
  t.rel = cuda_ptr<const T>(rl);
  t.bias = cuda_ptr<const T>(bs);
  t.sigma = cuda_ptr<const double>(sg);
  return t;
}

// sigma as double for the kernels (a small (H, G) tensor; no host sync).
at::Tensor sigma_double(const at::Tensor& sg) {
  return sg.defined() ? sg.to(at::kDouble).contiguous() : at::Tensor();
}

std::tuple<at::Tensor, at::Tensor> relpos_attention_cuda(
    const at::Tensor& q_in, const at::Tensor& k_in, const at::Tensor& v_in,
    const c10::optional<at::Tensor>& q_pos, const c10::optional<at::Tensor>& rel, at::IntArrayRef grid,
    const c10::optional<at::Tensor>& sigma, double threshold, c10::string_view span_mode, double scale,
    bool causal, const c10::optional<at::Tensor>& bias, at::OptionalIntArrayRef window,
    c10::string_view window_border, at::OptionalIntArrayRef window_right,
    at::OptionalIntArrayRef window_stride, at::OptionalIntArrayRef window_causal) {
  const RelposShape shape = check_relpos_inputs(
      q_in, k_in, v_in, q_pos, rel, grid, sigma, threshold, std::string(span_mode), scale, bias, window,
      std::string(window_border), window_right, window_stride, window_causal);
  TORCH_CHECK_VALUE(q_in.is_cuda(), "relpos_attention (CUDA): q must be a CUDA tensor");
  const c10::cuda::CUDAGuard guard(q_in.device());
  const at::Tensor q = q_in.contiguous(), k = k_in.contiguous(), v = v_in.contiguous();
  const at::Tensor qp = opt_contig(q_pos), rl = opt_contig(rel), bs = opt_contig(bias);
  const at::Tensor sg = sigma_double(opt_contig(sigma));
  at::Tensor out = at::empty({shape.B, shape.H, shape.N, shape.Dv}, q.options());
  at::Tensor lse = at::empty({shape.B, shape.H, shape.N}, q.options().dtype(lse_dtype(q.scalar_type())));
  if (shape.B == 0 || shape.H == 0) return {out, lse};
  const RelposParams p = make_relpos_params(shape, threshold, scale, causal);
  if (choose_cuda_kernel(p, q.scalar_type(), {q, k, v, qp, rl}) == CudaKernel::kTiled) {
    relpos_tiled_forward(p, q, k, v, qp, rl, sg, bs, out, lse);
    return {out, lse};
  }
  check_blocks(general::token_blocks(p), "the forward");
  auto stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, q.scalar_type(), "relpos_attention_cuda", [&] {
    using T = typename CudaType<scalar_t>::type;
    check_smem(general::forward_smem<T>(p), shape);
    general::Tensors<T> t = input_ptrs<T>(q, k, v, qp, rl, bs, sg);
    t.out = cuda_ptr<T>(out);
    t.lse = cuda_ptr<cuda::acc_t<T>>(lse);
    check_launch(general::launch_forward<T>(p, t, stream));
  });
  return {out, lse};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>
relpos_attention_backward_cuda(const at::Tensor& grad_out_in, const c10::optional<at::Tensor>& grad_lse,
                               const at::Tensor& q_in, const at::Tensor& k_in, const at::Tensor& v_in,
                               const c10::optional<at::Tensor>& q_pos, const c10::optional<at::Tensor>& rel,
                               at::IntArrayRef grid, const c10::optional<at::Tensor>& sigma, double threshold,
                               c10::string_view span_mode, double scale, bool causal,
                               const at::Tensor& out_in, const at::Tensor& lse_in,
                               const c10::optional<at::Tensor>& bias, at::OptionalIntArrayRef window,
                               c10::string_view window_border, at::OptionalIntArrayRef window_right,
                               at::OptionalIntArrayRef window_stride, at::OptionalIntArrayRef window_causal) {
  const RelposShape shape = check_relpos_inputs(
      q_in, k_in, v_in, q_pos, rel, grid, sigma, threshold, std::string(span_mode), scale, bias, window,
      std::string(window_border), window_right, window_stride, window_causal);
  check_relpos_backward_inputs(shape, q_in, grad_out_in, grad_lse, out_in, lse_in);
  TORCH_CHECK_VALUE(q_in.is_cuda(), "relpos_attention_backward (CUDA): q must be a CUDA tensor");
  const c10::cuda::CUDAGuard guard(q_in.device());
  const at::Tensor q = q_in.contiguous(), k = k_in.contiguous(), v = v_in.contiguous();
  const at::Tensor qp = opt_contig(q_pos), rl = opt_contig(rel), bs = opt_contig(bias);
  const at::Tensor sg = sigma_double(opt_contig(sigma));
  const at::Tensor gout = grad_out_in.contiguous();
  const auto acc_dtype = lse_dtype(q.scalar_type());
  const at::Tensor lse = lse_in.to(acc_dtype).contiguous();
  // D_i = dO_i . out_i - d lse_i, the softmax backward's row term
  at::Tensor rowd = (gout.to(acc_dtype) * out_in.to(acc_dtype)).sum(-1);
  if (grad_lse.has_value()) rowd = rowd - grad_lse->to(acc_dtype);
  rowd = rowd.contiguous();
  at::Tensor dq = at::empty_like(q);
  at::Tensor dk = at::empty_like(k);
  at::Tensor dv = at::empty_like(v);
  at::Tensor dqpos = shape.has_pos ? at::empty_like(q) : at::empty({0}, q.options());
  at::Tensor drel = shape.has_pos ? at::empty_like(rl) : at::empty({0}, q.options());
  at::Tensor dbias = shape.has_bias ? at::empty_like(bs) : at::empty({0}, q.options());
  const RelposParams p = make_relpos_params(shape, threshold, scale, causal);
  const bool offsets = shape.has_pos || shape.has_bias || shape.has_sigma;  // d rel, d bias, d sigma
  const bool run = shape.B > 0 && shape.H > 0;
  // d q, d k, d v, d q_pos: the tiled kernels where they apply (as in the forward); d rel,
  // d bias, d sigma: the tiled offset kernel where it also fits the device
  const bool tiled = run && choose_cuda_kernel(p, q.scalar_type(), {q, k, v, qp, rl, gout},
                                               /*backward=*/true) == CudaKernel::kTiled;
  const bool tiled_offsets = tiled && offsets && tiled_offsets_refusal(p, q.scalar_type()).empty();
  const int64_t partials = tiled_offsets ? tiled_offset_partials(p) : general::offset_blocks_per_head(p);
  at::Tensor dsig_part =
      shape.has_sigma ? at::zeros({shape.H, partials, p.G_in}, q.options().dtype(at::kDouble)) : at::Tensor();
  if (run) {
    check_blocks(general::token_blocks(p), "the backward");
    if (offsets && !tiled_offsets)  // the general offset kernel runs
      check_blocks(general::offset_blocks(p), "the backward (d rel, d bias, d sigma)", "use fewer heads");
    auto stream = c10::cuda::getCurrentCUDAStream();
    if (tiled) relpos_tiled_backward(p, gout, rowd, q, k, v, qp, rl, sg, bs, lse, dq, dk, dv, dqpos);
    if (tiled_offsets)
      relpos_tiled_backward_offsets(p, gout, rowd, q, k, v, qp, rl, sg, bs, lse, drel, dbias, dsig_part);
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, q.scalar_type(),
                                    "relpos_attention_backward_cuda", [&] {
                                      using T = typename CudaType<scalar_t>::type;
                                      general::Tensors<T> t = input_ptrs<T>(q, k, v, qp, rl, bs, sg);
                                      t.gout = cuda_ptr<const T>(gout);
                                      t.rowd = cuda_ptr<const cuda::acc_t<T>>(rowd);
                                      t.lse = cuda_ptr<cuda::acc_t<T>>(lse);
                                      t.dq = cuda_ptr<T>(dq);
                                      t.dk = cuda_ptr<T>(dk);
                                      t.dv = cuda_ptr<T>(dv);
                                      t.dqpos = shape.has_pos ? cuda_ptr<T>(dqpos) : nullptr;
                                      t.drel = shape.has_pos ? cuda_ptr<T>(drel) : nullptr;
                                      t.dbias = shape.has_bias ? cuda_ptr<T>(dbias) : nullptr;
                                      t.dsig_part = shape.has_sigma ? cuda_ptr<double>(dsig_part) : nullptr;
                                      if (!tiled) {
                                        check_smem(general::backward_dq_smem<T>(p), shape);
                                        check_smem(general::backward_dkv_smem<T>(p), shape);
                                        check_launch(general::launch_backward_dq<T>(p, t, stream));
                                        check_launch(general::launch_backward_dkv<T>(p, t, stream));
                                      }
                                      if (offsets && !tiled_offsets) {
                                        check_smem(general::backward_offset_smem<T>(p), shape);
                                        check_launch(general::launch_backward_offset<T>(p, t, stream));
                                      }
                                    });
  } else {
    dq.zero_();
    dk.zero_();
    dv.zero_();
    if (shape.has_pos) {
      dqpos.zero_();
      drel.zero_();
    }
    if (shape.has_bias) dbias.zero_();
  }
  // d sigma in sigma's own dtype (float32 is allowed with half inputs: it is a
  // sum over every pair of terms in 1 / sigma^3, which overflows float16).
  at::Tensor dsigma =
      shape.has_sigma ? dsig_part.sum(1).to(sigma->scalar_type()) : at::empty({0}, q.options());
  return {dq, dk, dv, dqpos, drel, dsigma, dbias};
}

}  // namespace

TORCH_LIBRARY_IMPL(posattn, CUDA, m) {
  m.impl("relpos_attention", &relpos_attention_cuda);
  m.impl("relpos_attention_backward", &relpos_attention_backward_cuda);
}

}  // namespace posattn
