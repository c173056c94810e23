// The CPU kernels for x86-64-v4 CPUs (AVX-512 F/BW/CD/DQ/VL: Skylake-SP, Zen 4
// and later), run where capability.h finds them.
#include "capability.h"

#if POSATTN_CPU_DISPATCH
#include "kernels_prelude.h"

#pragma GCC push_options
#pragma GCC target( \
    "avx,avx2,fma,bmi,bmi2,f16c,lzcnt,movbe,xsave,avx512f,avx512bw,avx512cd,avx512dq,avx512vl,prefer-vector-width=256")
#define POSATTN_CPU_CAPABILITY avx512
#define POSATTN_CPU_VEC_BYTES 64
#include "kernels.inc"
#pragma GCC pop_options
#endif
