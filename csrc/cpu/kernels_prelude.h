// Every header the kernel builds (kernels.inc) use but cpu_vec.h, included by
// kernels_<capability>.cpp before its `#pragma GCC target`: their code (std,
// ATen, the shared index math) is then compiled for the baseline in every
// build, so that no AVX-512 copy of an inline function shared with other files
// can take the baseline copy's place at link time. (Only cpu_vec.h, whose code
// depends on the vector width, is compiled per capability, in a namespace of
// its own.)
#pragma once

#include <ATen/Parallel.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

#include "../algebraic/apply_maps_layout.h"
#include "../common/cpu_blas.h"
#include "../common/grid_index.h"
#include "../relpos/relpos_cpu_problem.h"
#include "../relpos/relpos_cpu_tile.h"
#include "../relpos/relpos_tiling.h"
#include "kernels.h"
