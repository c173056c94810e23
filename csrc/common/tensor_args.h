// How the operators' entry points turn optional tensor arguments into what the
// kernels take, one rule for every backend: an argument that was not given is
// an undefined tensor and a null pointer; a given one is made contiguous and
// passes its data pointer (also when it is empty, e.g. B = 0).
#pragma once

#include <torch/types.h>

namespace posattn {

inline at::Tensor opt_contig(const c10::optional<at::Tensor>& t) {
  return t.has_value() ? t->contiguous() : at::Tensor();
}

template <typename T>
T* ptr_or_null(const at::Tensor& t) {
  return t.defined() ? t.data_ptr<T>() : nullptr;
}

}  // namespace posattn
