// The tiled tensor-core kernels of relpos_attention on CUDA (glue in
// relpos_tiled_cuda.cu, kernels in csrc/cuda/relpos_tiled_forward.cuh and
// relpos_tiled_backward.cuh, relpos_tiled_offsets.cuh): float16 / bfloat16 (and
// float32 through TF32 where torch.backends.cuda.matmul.allow_tf32 is set) with
// D == Dv in {32, 64, 128} on sm_80+, forward and backward (d q, d k, d v, d q_pos,
// and d rel, d bias, d sigma where the offset kernel's shared memory fits the
// device); the general path (relpos_attention_cuda.cu) takes every other call.
#pragma once

#include <torch/types.h>

#include <string>

#include "relpos_params.h"

namespace posattn {

// Which CUDA kernels run a call (forward, and d q, d k, d v, d q_pos of the backward):
// POSATTN_CUDA_KERNEL=auto (default: the tiled kernel where it applies), general, or tiled (a ValueError
// naming the reason if it does not apply). Any other value is a ValueError. Where the tiled backward
// runs, d rel, d bias and d sigma come from the tiled offset kernel if its shared memory fits the
// device, else from the general one, whatever the variable says (tiled_offsets_refusal).
enum class CudaKernel { kGeneral, kTiled };

// `tensors` are the call's contiguous q, k, v, q_pos, rel (and grad_out for the
// backward; undefined when not given). `backward`: the choice for the backward,
// which also needs the tiled backward kernels to fit the device.
CudaKernel choose_cuda_kernel(const RelposParams& p, at::ScalarType dtype,
                              std::initializer_list<at::Tensor> tensors, bool backward = false);

// Why the tiled backward kernels cannot run on this device (empty: they can).
std::string tiled_backward_refusal(const RelposParams& p, at::ScalarType dtype);

// Why the tiled offset kernel (d rel, d bias, d sigma) cannot run on this device
// (empty: it can); the general path's offset kernel takes those calls.
std::string tiled_offsets_refusal(const RelposParams& p, at::ScalarType dtype);

// The d sigma partials per head of the tiled offset kernel (one per tile offset).
int64_t tiled_offset_partials(const RelposParams& p);

// d rel (H, U, D) and d bias (H, U) in q's dtype (preallocated; empty without q_pos /
// bias) and the d sigma partials (H, tiled_offset_partials(p), G_in) in float64,
// from the same inputs as relpos_tiled_backward.
void relpos_tiled_backward_offsets(const RelposParams& p, const at::Tensor& gout, const at::Tensor& rowd,
                                   const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                   const at::Tensor& q_pos, const at::Tensor& rel, const at::Tensor& sigma,
                                   const at::Tensor& bias, const at::Tensor& lse, at::Tensor& drel,
                                   at::Tensor& dbias, at::Tensor& dsig_part);

// d q, d k, d v, d q_pos (q's dtype, preallocated; dqpos empty without q_pos) from the
// tiled forward's float32 lse and rowd = dO . out - d lse (float32).
void relpos_tiled_backward(const RelposParams& p, const at::Tensor& gout, const at::Tensor& rowd,
                           const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           const at::Tensor& q_pos, const at::Tensor& rel, const at::Tensor& sigma,
                           const at::Tensor& bias, const at::Tensor& lse, at::Tensor& dq, at::Tensor& dk,
                           at::Tensor& dv, at::Tensor& dqpos);

// out (B, H, N, Dv) in q's dtype, lse (B, H, N) float32; sigma as float64 (or undefined).
void relpos_tiled_forward(const RelposParams& p, const at::Tensor& q, const at::Tensor& k,
                          const at::Tensor& v, const at::Tensor& q_pos, const at::Tensor& rel,
                          const at::Tensor& sigma, const at::Tensor& bias, at::Tensor& out, at::Tensor& lse);

}  // namespace posattn
