#include "capability.h"

#include <c10/util/Exception.h>

#include <cctype>
#include <cstdlib>
#include <string>

namespace posattn {
namespace cpu {

const char* capability_name(Capability c) {
  switch (c) {
    case Capability::avx512:
      return "avx512";
    case Capability::avx2:
      return "avx2";
    default:
      return "base";
  }
}

namespace {

Capability detect() {
#if POSATTN_CPU_DISPATCH
  // libgcc checks the CPUID bits and that the OS saves the AVX / AVX-512
  // register state (XGETBV), i.e. what the x86-64-v3 / -v4 levels require.
  __builtin_cpu_init();
  if (__builtin_cpu_supports("x86-64-v4")) return Capability::avx512;
  if (__builtin_cpu_supports("x86-64-v3")) return Capability::avx2;
#endif
  return Capability::base;
}

}  // namespace

Capability supported_capability() {
  static const Capability c = detect();
  return c;
}

Capability active_capability() {
  const Capability best = supported_capability();
  const char* env = std::getenv("POSATTN_CPU_CAPABILITY");
  if (env == nullptr || *env == '\0') return best;
  std::string want;
  for (const char* c = env; *c; ++c)
    if (*c != ' ') want += static_cast<char>(std::tolower(static_cast<unsigned char>(*c)));
  Capability c;
  if (want == "base") {
    c = Capability::base;
  } else if (want == "avx2") {
    c = Capability::avx2;
  } else if (want == "avx512") {
    c = Capability::avx512;
  } else {
    TORCH_CHECK_VALUE(false,
                      "POSATTN_CPU_CAPABILITY must be 'base', 'avx2' or 'avx512' (or unset: the widest "
                      "this CPU runs, here '",
                      capability_name(best), "'), got '", want, "'");
  }
  TORCH_CHECK_VALUE(static_cast<int>(c) <= static_cast<int>(best), "POSATTN_CPU_CAPABILITY='", want,
                    "': this CPU (or this build) runs at most '", capability_name(best), "'");
  return c;
}

std::string active_capability_name() {
  return capability_name(active_capability());
}

}  // namespace cpu
}  // namespace posattn
