#include "kernels.h"

namespace posattn {
namespace cpu {

const Kernels& kernels() {
  switch (active_capability()) {
#if POSATTN_CPU_DISPATCH
    case Capability::avx512:
      return dispatch::avx512::kernels();
    case Capability::avx2:
      return dispatch::avx2::kernels();
#endif
    default:
      return dispatch::base::kernels();
  }
}

std::string kernels_capability_name() {
  return capability_name(kernels().capability);
}

}  // namespace cpu
}  // namespace posattn
