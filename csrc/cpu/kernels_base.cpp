// The CPU kernels for every x86-64 CPU (and other CPUs): built with the
// extension's flags (setup.py; -march=x86-64-v2 by default).
#include "kernels_prelude.h"

#define POSATTN_CPU_CAPABILITY base
#include "kernels.inc"
