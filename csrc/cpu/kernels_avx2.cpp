// The CPU kernels for x86-64-v3 CPUs (AVX2, FMA, BMI2: Haswell, Zen and later),
// run where capability.h finds them.
#include "capability.h"

#if POSATTN_CPU_DISPATCH
#include "kernels_prelude.h"

#pragma GCC push_options
#pragma GCC target("avx,avx2,fma,bmi,bmi2,f16c,lzcnt,movbe,xsave")
#define POSATTN_CPU_CAPABILITY avx2
#define POSATTN_CPU_VEC_BYTES 32
#include "kernels.inc"
#pragma GCC pop_options
#endif
