// Packed calls on the CPU (posattn.PackedGrids): each sample is a Problem of its own grid
// whose tensors point at its first token (tok_stride = the call's T) and at its own offset
// tables, and the kernels' tasks of every sample run in one pool, the heaviest first, pulled
// by the threads in turn (cpu/kernels.inc: packed_forward, packed_backward). Every task writes its own
// outputs or partial sums, so the result does not depend on which thread ran what
// (relpos/relpos_packed_cpu.cpp reduces the partials in sample order).
#pragma once

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <vector>

#include "relpos_problem.h"

namespace posattn {
namespace relpos {
namespace cpu_kernels {

template <typename T>
struct PackedSample {
  Problem p;            // the sample's own grid, B = 1, tok_stride = the call's T
  SpanTables<T> st;     // filled when the call has sigma
  RelposTensors<T> t;   // at the sample's first token; rel / bias: its own (H, U) tables
  BackwardSplit split;  // the backward's tasks (and the windowed forward's)
  bool window = false;  // the windowed kernels (else the tiled ones)
  double cost = 0.0;    // estimated work of the whole sample (for the order only)

  int64_t forward_tasks() const { return window ? split.tasks(p.H) : p.B * p.H * p.ntiles; }
  int64_t backward_tasks() const { return split.tasks(p.H); }
};

// (sample, task) pairs of every sample, the tasks of the most expensive samples first (so that
// the big ones do not start last), each sample's tasks in their own order.
struct PackedTask {
  int64_t sample, task;
};

template <typename T, typename CountFn>
std::vector<PackedTask> packed_tasks(const std::vector<PackedSample<T>>& samples, CountFn count) {
  std::vector<int64_t> order(samples.size());
  std::iota(order.begin(), order.end(), int64_t{0});
  auto per_task = [&](int64_t s) { return samples[s].cost / std::max<int64_t>(1, count(samples[s])); };
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return per_task(a) > per_task(b); });
  std::vector<PackedTask> tasks;
  for (const int64_t s : order)
    for (int64_t i = 0; i < count(samples[s]); ++i) tasks.push_back({s, i});
  return tasks;
}

}  // namespace cpu_kernels
}  // namespace relpos
}  // namespace posattn
