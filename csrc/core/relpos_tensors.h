// The tensors of one relpos_attention call, filled once by the entry point
// (csrc/relpos/relpos_args.h) or the simulator harness and taken by every CPU and
// CUDA kernel (flash-attention's params struct; the sizes are in RelposParams):
// plain pointers, no ATen, copied by value into CUDA kernels. Contiguous; a
// tensor the call does not have (q_pos / rel / bias / sigma not given, a gradient
// not needed) is null. T is the kernels' element type (float, double; on CUDA
// also __half, __nv_bfloat16), Acc its accumulation type (acc_t<T>).
#pragma once

#include "acc_type.h"

namespace posattn {

template <typename T>
struct RelposTensors {
  using Acc = acc_t<T>;
  // inputs: q, k, q_pos (B, H, N, D), v (B, H, N, Dv), rel (H, U, D), bias (H, U)
  const T* __restrict__ q = nullptr;
  const T* __restrict__ k = nullptr;
  const T* __restrict__ v = nullptr;
  const T* __restrict__ qpos = nullptr;
  const T* __restrict__ rel = nullptr;
  const T* __restrict__ bias = nullptr;
  const double* __restrict__ sigma = nullptr;  // (H, G_in) in float64 (CUDA; the CPU kernels take SpanTables)
  // a packed call's samples (CUDA; the CPU entry point splits them itself): packed_offsets (S + 1)
  // and packed_shapes (S, G_in), int32, on the device
  const int* __restrict__ packed_offsets = nullptr;
  const int* __restrict__ packed_shapes = nullptr;
  // the fast kernels' schedule of a packed call: 2 S + 1 ints, the prefix sums of the samples' tiles
  // in their ranking and the ranking (filled by their launchers, relpos_packed.cuh:
  // launch_packed_schedule)
  int* __restrict__ packed_tiles = nullptr;
  // the forward's outputs, which the backward reads: out (B, H, N, Dv), lse (B, H, N)
  T* __restrict__ out = nullptr;
  Acc* __restrict__ lse = nullptr;
  // the backward's inputs: grad_out (B, H, N, Dv) and either the row term
  // rowd = dO . out - d lse (CUDA, computed by the entry point) or d lse itself
  // (CPU, null when not given: the kernels compute the row term)
  const T* __restrict__ gout = nullptr;
  const Acc* __restrict__ rowd = nullptr;
  const Acc* __restrict__ glse = nullptr;
  // the backward's outputs, shaped as their inputs. On the CPU, dk / dv and
  // drel / dbias are the per-part and per-task buffers of the backward's split
  // (cpu/relpos_problem.h, BackwardSplit), reduced by the entry point.
  T* __restrict__ dq = nullptr;
  T* __restrict__ dk = nullptr;
  T* __restrict__ dv = nullptr;
  T* __restrict__ dqpos = nullptr;
  T* __restrict__ drel = nullptr;
  T* __restrict__ dbias = nullptr;
  // d sigma's partial sums (float64; (blocks or tasks, G) per head, summed by the entry point)
  double* __restrict__ dsig_part = nullptr;
  // CUDA's fast path: the terms of a logit that depend only on its offset, (H, U) in
  // float32: added (bias, minus the span's quad with span add) and multiplied (the
  // span's exp(-quad) with span multiply); null where the call has none
  const float* __restrict__ offset_add = nullptr;
  const float* __restrict__ offset_mul = nullptr;
  // CUDA's fast offset kernel: d rel and d bias in float32 before their rounding to T
  float* __restrict__ drel_acc = nullptr;
  float* __restrict__ dbias_acc = nullptr;
  // CUDA's fast offset kernel: its ticket counter, a done flag per work item and (grids of 2-3
  // axes) its order's table (relpos_fast_offsets.cuh: fast_offset_order_ints), zeroed and
  // filled by its launcher
  int* __restrict__ offset_order = nullptr;
};

}  // namespace posattn
