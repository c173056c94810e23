// Operator schemas of the posattn library. Backends register their kernels
// with TORCH_LIBRARY_IMPL in their own files (csrc/<op>/*_cpu.cpp, *_cuda.cu).
#include <Python.h>
#include <torch/library.h>

#include "cpu/kernels.h"

extern "C" {
// `import posattn._C` loads this shared object, which runs the registrations
// below; the module itself has no Python-visible members.
PyObject* PyInit__C(void) {
  static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_C", nullptr, -1, nullptr};
  return PyModule_Create(&module_def);
}
}

TORCH_LIBRARY(posattn, m) {
  // Positional self-attention with relative embeddings and a learned bias per
  // head and offset on an n-D grid, an optional Gaussian span and a fixed
  // window: `window` cells before each window's centre per axis, `window_right`
  // after (default: as many), `window_stride` queries per window, `window_causal`
  // 0 / 1 per axis (NATTEN's vocabulary; see posattn/ops/_relpos.py for the full contract).
  // Packed samples of different grids (posattn.PackedGrids): packed_offsets (S + 1,) and
  // packed_shapes (S, G), int32; q is then (1, H, T, D) and `grid` the max_grid of the
  // offset tables. Returns (out (B, H, N, Dv), lse (B, H, N)).
  m.def(
      "relpos_attention(Tensor q, Tensor k, Tensor v, Tensor? q_pos, Tensor? rel, int[] grid, "
      "Tensor? sigma, float threshold, str span_mode, float scale, bool causal, "
      "Tensor? bias=None, int[]? window=None, str window_border=\"clip\", int[]? window_right=None, "
      "int[]? window_stride=None, int[]? window_causal=None, Tensor? packed_offsets=None, "
      "Tensor? packed_shapes=None) -> (Tensor, Tensor)");
  // Gradients of relpos_attention, recomputed from the saved lse. Returns
  // (dq, dk, dv, dq_pos, drel, dsigma, dbias); the last four are empty (shape
  // (0,)) when the matching input was not given.
  m.def(
      "relpos_attention_backward(Tensor grad_out, Tensor? grad_lse, Tensor q, Tensor k, "
      "Tensor v, Tensor? q_pos, Tensor? rel, int[] grid, Tensor? sigma, float threshold, "
      "str span_mode, float scale, bool causal, Tensor out, Tensor lse, Tensor? bias=None, "
      "int[]? window=None, str window_border=\"clip\", int[]? window_right=None, int[]? window_stride=None, "
      "int[]? window_causal=None, Tensor? packed_offsets=None, Tensor? packed_shapes=None) -> (Tensor, "
      "Tensor, "
      "Tensor, Tensor, Tensor, Tensor, Tensor)");
  // Which kernels would run relpos_attention's forward (or its backward) with these
  // arguments on their device, and why: "key: value" lines (core/relpos_plan.h,
  // describe; posattn.ops.relpos_plan reads them into a dict). Checks the arguments
  // as the operator does; computes nothing.
  m.def(
      "relpos_plan(Tensor q, Tensor k, Tensor v, Tensor? q_pos, Tensor? rel, int[] grid, "
      "Tensor? sigma, float threshold, str span_mode, float scale, bool causal, "
      "Tensor? bias=None, int[]? window=None, str window_border=\"clip\", int[]? window_right=None, "
      "int[]? window_stride=None, int[]? window_causal=None, Tensor? packed_offsets=None, "
      "Tensor? packed_shapes=None, bool backward=False) -> str");
  // The instruction set the CPU kernels run on this machine: "avx512", "avx2"
  // or "base" (cpu/capability.h; POSATTN_CPU_CAPABILITY picks a lower one).
  m.def("cpu_capability() -> str", &posattn::cpu::kernels_capability_name);
  // Orthogonal-power (algebraic) encodings: y[b, h, n, a*m:(a+1)*m] =
  // maps[index[(b,) n, a], h, a] @ x[b, h, n, a*m:(a+1)*m]; x (B, H, N, D), maps
  // (P, H, A, m, m) with A*m == D, index int64 (N, A) or (B, N, A).
  m.def("apply_maps(Tensor x, Tensor maps, Tensor index) -> Tensor");
  // Gradients of apply_maps: (grad_x, grad_maps); a gradient not asked for is
  // empty (shape (0,)).
  m.def(
      "apply_maps_backward(Tensor grad_y, Tensor x, Tensor maps, Tensor index, bool need_x, "
      "bool need_maps) -> (Tensor, Tensor)");
}
