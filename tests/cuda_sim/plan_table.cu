// Prints which kernels the CUDA plan (csrc/cuda/relpos_plan.cuh) gives each class of fast call on
// each class of device, as the extension would make it there: a host program (no CUDA call; built
// with nvcc, run on the CPU), read by tests/cuda_sim/test_plan_table.py and
// benchmarks/plan_table.py. One line per (dtype, D, axes, terms, device), tab-separated:
//   dtype D axes terms smem_optin forward backward offsets forward_smem backward_smem
// terms: plain (no term per offset), pos (q_pos and rel), span (a bias and a span, multiply, with
// a threshold); forward / backward: fast or general (the backward's d q, d k, d v, d q_pos);
// offsets: fast, general or none (d rel, d bias, d sigma); *_smem: the plan's largest shared
// memory per block of the forward's and the backward's launches. The grids: 1-D 300 tokens, 2-D 20 x 20,
// 3-D 9 x 9 x 9; B = 2, H = 4.
#include <cstdio>
#include <string>
#include <vector>

#include "core/relpos_params.h"
#include "cuda/relpos_plan.cuh"

namespace rp = posattn::relpos;

int main() {
  struct Type {
    const char* name;
    rp::DType dt;
  };
  const Type types[] = {
      {"f16", rp::DType::kFloat16}, {"bf16", rp::DType::kBFloat16}, {"f32", rp::DType::kFloat32}};
  const size_t devices[] = {232448, 166912, 101376};
  const char* terms[] = {"plain", "pos", "span"};
  for (const Type& ty : types)
    for (int D : {32, 64, 128})
      for (int axes = 1; axes <= 3; ++axes)
        for (int term = 0; term < 3; ++term)
          for (size_t optin : devices) {
            posattn::RelposShape s;
            s.B = 2, s.H = 4, s.D = s.Dv = D;
            s.grid = axes == 1   ? std::vector<int64_t>{300}
                     : axes == 2 ? std::vector<int64_t>{20, 20}
                                 : std::vector<int64_t>{9, 9, 9};
            s.N = 1;
            for (int64_t n : s.grid) s.N *= n;
            s.has_pos = term == 1;
            s.has_bias = s.has_sigma = term == 2;
            s.mode = posattn::SpanMode::kMultiply;
            const posattn::RelposParams p =
                posattn::make_relpos_params(s, term == 2 ? 0.05 : 0.0, 1.0 / 8, false);
            rp::CudaDevice dev;
            dev.smem_optin = optin;
            dev.tensor_cores = true;
            dev.allow_tf32 = true;
            const rp::CudaPlan f = rp::plan_cuda(p, ty.dt, false, true, rp::KernelRequest::kAuto, dev);
            const rp::CudaPlan b = rp::plan_cuda(p, ty.dt, true, true, rp::KernelRequest::kAuto, dev);
            if (!f.error.empty() || !b.error.empty()) {
              std::fprintf(stderr, "plan_table: the plan refuses %s D = %d on %d axes: %s%s\n", ty.name, D,
                           axes, f.error.c_str(), b.error.c_str());
              return 1;
            }
            const bool ff = f.path == rp::CudaPlan::Kernels::kFast,
                       bf = b.path == rp::CudaPlan::Kernels::kFast;
            const bool of = b.has_offsets && b.offsets == rp::CudaPlan::Kernels::kFast;
            std::printf("%s\t%d\t%d\t%s\t%zu\t%s\t%s\t%s\t%zu\t%zu\n", ty.name, D, axes, terms[term], optin,
                        ff ? "fast" : "general", bf ? "fast" : "general",
                        !b.has_offsets ? "none"
                        : of           ? "fast"
                                       : "general",
                        f.smem, b.smem);
          }
  return 0;
}
