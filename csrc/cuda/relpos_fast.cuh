// The fast path's kernels of relpos_attention as the entry point calls them: one set per
// (element type: float16, bfloat16, float32 through TF32; head dim), each compiled in a translation unit of
// its own (cuda/fast/relpos_fast_<type>_d<D>.cu) so that a build compiles the six in parallel. The forward is
// relpos_fast_forward.cuh, the backward relpos_fast_backward.cuh and relpos_fast_offsets.cuh; which calls
// they take, relpos_plan.cuh.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "../core/relpos_params.h"
#include "../core/relpos_tensors.h"

namespace posattn::relpos::cuda_fast {

// Each launches its kernels in the layouts of the class of a device with `optin` bytes of opt-in
// shared memory per block (relpos_fast_common.cuh, smem_class_of).
template <typename T, int D>
struct FastKernels {
  // out and lse of a call the plan gave the fast forward (a grid of 1-3 axes; q_pos and rel
  // given or both null), with t.offset_add / t.offset_mul filled (relpos_fast_tables.cuh)
  static cudaError_t forward(const RelposParams& p, const RelposTensors<T>& t, size_t optin,
                             cudaStream_t stream);
  // d q, d k, d v, d q_pos of a call the plan gave the fast backward, with the same tables
  // and t.gout, t.rowd, t.lse (relpos_fast_backward.cuh); d rel, d bias, d sigma are the
  // offset kernel's
  static cudaError_t backward(const RelposParams& p, const RelposTensors<T>& t, size_t optin,
                              cudaStream_t stream);
  // d rel, d bias, d sigma of such a call where the plan gives them the fast offset kernel
  // (relpos_fast_offsets.cuh): through t.drel_acc / t.dbias_acc, into t.drel, t.dbias, t.dsig_part
  static cudaError_t offsets(const RelposParams& p, const RelposTensors<T>& t, size_t optin,
                             cudaStream_t stream);
  // the control forward kernel's attributes (which code the build has for the current device)
  static cudaError_t attributes(cudaFuncAttributes* attr);
};

// compiled in cuda/fast/*.cu, not where this header is included
extern template struct FastKernels<__half, 32>;
extern template struct FastKernels<__half, 64>;
extern template struct FastKernels<__half, 128>;
extern template struct FastKernels<__nv_bfloat16, 32>;
extern template struct FastKernels<__nv_bfloat16, 64>;
extern template struct FastKernels<__nv_bfloat16, 128>;
extern template struct FastKernels<float, 32>;  // (through TF32)
extern template struct FastKernels<float, 64>;
extern template struct FastKernels<float, 128>;

}  // namespace posattn::relpos::cuda_fast
