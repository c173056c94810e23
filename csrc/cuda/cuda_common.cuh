// What every torch-free CUDA kernel of posattn shares: the accumulation type of
// an element type, conversions between them, a device-side assertion and the
// dynamic shared-memory opt-in of a launch.
//
// The files of csrc/cuda/ need only the CUDA toolkit and the project's own
// headers (no ATen, no c10): the extension's glue (csrc/relpos/*_cuda.cu,
// csrc/apply_maps/apply_maps_cuda.cu) and the simulator harness
// (tests/cuda_sim/harness.cu) compile the very same kernels and launchers.
// Element types are the CUDA ones: float, double, __half, __nv_bfloat16.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cassert>
#include <cstddef>

#include "../core/acc_type.h"

namespace posattn {
namespace cuda {

using posattn::acc_t;  // core/acc_type.h

// Element -> accumulation type and back. Explicit for the 16-bit types: the
// extension is built with __CUDA_NO_HALF_CONVERSIONS__ (as torch's nvcc flags
// say), so __half and __nv_bfloat16 have no implicit conversions.
template <typename Acc, typename T>
__device__ __forceinline__ Acc to_acc(T x) {
  return static_cast<Acc>(x);
}
template <>
__device__ __forceinline__ float to_acc<float, __half>(__half x) {
  return __half2float(x);
}
template <>
__device__ __forceinline__ float to_acc<float, __nv_bfloat16>(__nv_bfloat16 x) {
  return __bfloat162float(x);
}

template <typename T, typename Acc>
__device__ __forceinline__ T from_acc(Acc x) {
  return static_cast<T>(x);
}
template <>
__device__ __forceinline__ __half from_acc<__half, float>(float x) {
  return __float2half(x);
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_acc<__nv_bfloat16, float>(float x) {
  return __float2bfloat16(x);
}

// Opts a kernel into more than the default 48 KiB of dynamic shared memory.
// The device's opt-in limit is checked by the caller (the extension's glue,
// with an error naming the sizes): the simulator does not enforce it.
template <typename Kernel>
cudaError_t allow_smem(Kernel kernel, size_t bytes) {
  if (bytes <= 48 * 1024) return cudaSuccess;
  return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
}

// Launches kernel<<<blocks, threads, smem, stream>>>(args...) after opting it into its
// shared memory; the launch's error (the kernel's own errors arrive at the next sync).
template <typename Kernel, typename... Args>
cudaError_t launch(Kernel kernel, int64_t blocks, int threads, size_t smem, cudaStream_t stream,
                   Args... args) {
  cudaError_t err = allow_smem(kernel, smem);
  if (err != cudaSuccess) return err;
  kernel<<<static_cast<unsigned int>(blocks), threads, smem, stream>>>(args...);
  return cudaGetLastError();
}

// dst[i] = src[i] rounded to T, for i < n (float32 accumulators to the inputs' dtype)
template <typename T>
__global__ void round_to_kernel(const float* __restrict__ src, T* __restrict__ dst, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    dst[i] = from_acc<T>(src[i]);
}
template <typename T>
cudaError_t launch_round_to(const float* src, T* dst, int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  const int64_t blocks = (n + 255) / 256 < 4096 ? (n + 255) / 256 : 4096;
  return launch(round_to_kernel<T>, blocks, 256, 0, stream, src, dst, n);
}

}  // namespace cuda
}  // namespace posattn

// A device-side assertion with a message (what c10's CUDA_KERNEL_ASSERT_MSG
// does): no host synchronisation, so an op stays capturable in a CUDA graph;
// the launch's next synchronisation reports a device-side assert.
// POSATTN_DEVICE_ASSERT_PRINTS (the simulator harness only: GPGPU-Sim crashes in
// __assertfail and in __trap, and in printf's %s) prints the message instead and
// lets the kernel go on: `msg` is a string literal without '%'.
#if defined(POSATTN_DEVICE_ASSERT_PRINTS)
#include <cstdio>
#define POSATTN_DEVICE_ASSERT(cond, msg)                               \
  do {                                                                 \
    if (!(cond)) printf("posattn device assertion failed: " msg "\n"); \
  } while (0)
#else
#define POSATTN_DEVICE_ASSERT(cond, msg)                                                      \
  do {                                                                                        \
    if (!(cond)) __assert_fail(msg, __FILE__, static_cast<unsigned int>(__LINE__), __func__); \
  } while (0)
#endif
