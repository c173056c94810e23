// What the extension's CUDA entry points share (ATen on one side, the torch-free
// kernels of csrc/cuda/ on the other): the CUDA element type of an ATen scalar
// type, launch errors as exceptions, the launch-size check, and the device's
// shared-memory opt-in limit (read once per device).
#pragma once

#include <c10/cuda/CUDAException.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Exception.h>
#include <c10/util/Half.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <climits>
#include <cstddef>
#include <cstdint>

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

// A launcher's error as an exception (and a CUDA error on the device as one too).
inline void check_launch(cudaError_t err) {
  C10_CUDA_CHECK(err);
}

// Refuses (ValueError) a launch of more thread blocks than a launch allows.
inline void check_blocks(int64_t blocks, const char* op, const char* what,
                         const char* remedy = "split the batch") {
  TORCH_CHECK_VALUE(blocks <= INT_MAX, op, " (CUDA): ", what, " needs ", blocks,
                    " thread blocks, more than a launch allows (", INT_MAX, "); ", remedy);
}

// The current device's opt-in limit of dynamic shared memory per block
// (cudaDevAttrMaxSharedMemoryPerBlockOptin), read once per device.
inline size_t device_smem_optin() {
  constexpr int kMaxDevices = 64;
  static std::atomic<int> cache[kMaxDevices] = {};  // 0: not read yet
  int device = 0;
  C10_CUDA_CHECK(cudaGetDevice(&device));
  int optin = device < kMaxDevices ? cache[device].load(std::memory_order_relaxed) : 0;
  if (optin == 0) {
    C10_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
    if (device < kMaxDevices) cache[device].store(optin, std::memory_order_relaxed);
  }
  return static_cast<size_t>(optin);
}

}  // namespace posattn
