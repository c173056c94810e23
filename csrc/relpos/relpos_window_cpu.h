// The windowed (neighbourhood) CPU kernels of relpos_attention, used when the
// span threshold leaves each query a small box of keys. Every query attends
// to the same box of offsets around itself (clipped at the grid's borders),
// so the work is organised by offset instead of by key: for a run of queries
// along the grid's last axis and one offset, the keys are the same run
// shifted, and q.k, the span and the softmax are vector operations along the
// run. Only the kept pairs are computed; nothing is a union of boxes.
#pragma once

#include "relpos_cpu_problem.h"

namespace posattn {
namespace relpos_cpu {

// True when the windowed kernels should run: a box is set (span threshold or
// fixed window) and every head's box holds at most 1/2 of the keys (head dim <= 16), 1/4 (<= 32) or
// 1/5 (larger) and at most 16384 offsets (beyond that, the tiled kernel's
// GEMMs are faster), on grids whose last axis fills >= 2/3 of its lanes. The environment variable POSATTN_CPU_KERNEL =
// tiled | window | auto (default) overrides the choice when a box is set.
bool use_window(const Problem& p);

template <typename T>
void window_forward(const Problem& p, const SpanTables<T>* st, const ForwardPtrs<T>& args);

// Same outputs and accumulator layout as the tiled backward (see BackwardSplit).
template <typename T>
void window_backward(const Problem& p, const SpanTables<T>* st, const BackwardPtrs<T>& args,
                     BackwardSplit split);

// Number of work units (query runs) the windowed kernels split a (b, h) into.
int64_t window_units(const Problem& p);

}  // namespace relpos_cpu
}  // namespace posattn
