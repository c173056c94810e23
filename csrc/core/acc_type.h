// The accumulation type of an element type, shared by the CPU and CUDA kernels.
#pragma once

namespace posattn {

// float for float / __half / __nv_bfloat16, double for double (as
// at::acc_type<T, true>): the type of relpos_attention's lse and of the sums.
template <typename T>
struct AccOf {
  using type = float;
};
template <>
struct AccOf<double> {
  using type = double;
};
template <typename T>
using acc_t = typename AccOf<T>::type;

}  // namespace posattn
