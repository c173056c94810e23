// What the simulator's small test programs (warp_primitives.cu, fast_forward.cu)
// share on the host: a CUDA error check, the 16-bit types' conversions, and a
// device buffer filled from a host vector. (harness.cu, the launchers' harness,
// keeps its own file-based I/O.)
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

// A failed CUDA call prints where and why and exits with status 3.
#define CHECK_CUDA(call)                                                                         \
  do {                                                                                           \
    const cudaError_t e_ = (call);                                                               \
    if (e_ != cudaSuccess) {                                                                     \
      printf("FAIL cuda: %s at %s:%d: %s\n", #call, __FILE__, __LINE__, cudaGetErrorString(e_)); \
      exit(3);                                                                                   \
    }                                                                                            \
  } while (0)

namespace sim_host {

inline float to_float(__nv_bfloat16 x) {
  return __bfloat162float(x);
}
inline float to_float(__half x) {
  return __half2float(x);
}

// x rounded to nearest even in T (__nv_bfloat16 or __half)
template <typename T>
T from_float(float x);
template <>
inline __nv_bfloat16 from_float(float x) {
  return __float2bfloat16_rn(x);
}
template <>
inline __half from_float(float x) {
  return __float2half_rn(x);
}

// A device copy of a host vector, freed with the object; get() copies it back.
template <typename T>
struct Device {
  T* p = nullptr;
  size_t n;
  explicit Device(const std::vector<T>& h) : n(h.size()) {
    CHECK_CUDA(cudaMalloc(&p, n * sizeof(T)));
    CHECK_CUDA(cudaMemcpy(p, h.data(), n * sizeof(T), cudaMemcpyHostToDevice));
  }
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;
  std::vector<T> get() const {
    std::vector<T> h(n);
    CHECK_CUDA(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
  }
  ~Device() { cudaFree(p); }
};

}  // namespace sim_host
