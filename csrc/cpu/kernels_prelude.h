// Every header the kernel builds (kernels.inc) use but cpu/vec.h, included by
// kernels_<capability>.cpp before its `#pragma GCC target`: their code (std,
// ATen, the shared index math) is then compiled for the baseline in every
// build, so that no AVX-512 copy of an inline function shared with other files
// can take the baseline copy's place at link time. (Only cpu/vec.h, whose code
// depends on the vector width, is compiled per capability, in a namespace of
// its own.)
#pragma once

#include <ATen/Parallel.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <atomic>
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

#include "../core/apply_maps_layout.h"
#include "blas.h"
#include "../core/grid_index.h"
#include "relpos_problem.h"
#include "relpos_tile.h"
#include "../core/relpos_tiling.h"
#include "kernels.h"
