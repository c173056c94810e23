// The CPU entry points of packed relpos_attention calls (posattn.PackedGrids), called by
// relpos_cpu.cpp for a call whose packed_offsets / packed_shapes are given.
#pragma once

#include <torch/types.h>

#include <string>
#include <tuple>

#include "relpos_args.h"

namespace posattn {
namespace relpos {

std::tuple<at::Tensor, at::Tensor> packed_forward_cpu(const RelposCall& c);

// (dq, dk, dv, dq_pos, drel, dsigma, dbias), undefined where the call lacks the input.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>
packed_backward_cpu(const RelposCall& c, const at::Tensor& grad_out, const at::Tensor& grad_lse,
                    const at::Tensor& out, const at::Tensor& lse);

std::string packed_plan_cpu(const RelposCall& c);

}  // namespace relpos
}  // namespace posattn
