// Runtime CPU dispatch of the CPU kernels, in the manner of ATen's
// cpu_capability: the extension is built for a portable baseline (setup.py:
// -march=x86-64-v2 unless POSATTN_CPU_ARCH says otherwise), and the kernels
// are compiled once more for AVX2 (x86-64-v3) and once for AVX-512
// (x86-64-v4) CPUs (cpu/kernels_*.cpp). Each call runs the widest set the CPU
// supports, so a wheel built on one x86-64 machine runs on another, within a
// few percent of a -march=native build where the CPU has AVX2 or AVX-512.
//
// POSATTN_CPU_CAPABILITY=base|avx2|avx512 (read on every call, any case) picks
// a lower set, e.g. to compare them; a set the CPU lacks is an error. The sets
// agree to rounding, not bitwise: AVX2 and AVX-512 fuse multiply-adds, and the
// choice between the windowed and tiled relpos kernels depends on the width.
#pragma once

#include <string>

// The AVX2 / AVX-512 builds need GCC >= 12 on x86-64 (`#pragma GCC target`,
// __builtin_cpu_supports("x86-64-v3")); with other compilers or CPUs only the
// baseline build exists, and cpu_capability() says "base".
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 12 && defined(__x86_64__)
#define POSATTN_CPU_DISPATCH 1
#else
#define POSATTN_CPU_DISPATCH 0
#endif

namespace posattn {
namespace cpu {

enum class Capability : int { base = 0, avx2 = 1, avx512 = 2 };

const char* capability_name(Capability c);

// The widest set this CPU (and its OS: the AVX state must be enabled) runs
// and this build holds kernels for.
Capability supported_capability();

// The set a call runs: supported_capability(), or POSATTN_CPU_CAPABILITY's
// (ValueError if it names no set, or one this CPU or build lacks).
Capability active_capability();

}  // namespace cpu
}  // namespace posattn
