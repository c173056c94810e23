// What the extension's CUDA glue shares (ATen on one side, the torch-free
// kernels of csrc/cuda/ on the other): the CUDA element type of an ATen scalar
// type, typed device pointers of tensors, launch errors as exceptions, and the
// device's shared-memory opt-in limit as a clear error.
#pragma once

#include <c10/cuda/CUDAException.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Exception.h>
#include <c10/util/Half.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <torch/types.h>

#include <cstddef>

namespace posattn {

// The CUDA type the kernels take for an ATen element type (same bits).
template <typename S>
struct CudaType {
  using type = S;
};
template <>
struct CudaType<c10::Half> {
  using type = __half;
};
template <>
struct CudaType<c10::BFloat16> {
  using type = __nv_bfloat16;
};

// t's data as T (the tensor's bits; null for an undefined tensor).
template <typename T>
T* cuda_ptr(const at::Tensor& t) {
  static_assert(sizeof(T) == 2 || sizeof(T) == 4 || sizeof(T) == 8, "an element type");
  if (!t.defined()) return nullptr;
  TORCH_INTERNAL_ASSERT(static_cast<size_t>(t.element_size()) == sizeof(T),
                        "cuda_ptr: element size mismatch");
  return reinterpret_cast<T*>(t.data_ptr());
}

// A launcher's error as an exception (and a CUDA error on the device as one too).
inline void check_launch(cudaError_t err) {
  C10_CUDA_CHECK(err);
}

// Refuses (ValueError) a launch whose dynamic shared memory exceeds the
// current device's opt-in limit; `what` names the call and its sizes.
inline void check_smem_fits(size_t bytes, const std::string& what) {
  if (bytes <= 48 * 1024) return;
  int device = 0, optin = 0;
  C10_CUDA_CHECK(cudaGetDevice(&device));
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  TORCH_CHECK_VALUE(bytes <= static_cast<size_t>(optin), what, " need ", bytes,
                    " bytes of shared memory per block, more than the device's ", optin);
}

}  // namespace posattn
