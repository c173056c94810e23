// How the operators' entry points turn optional tensor arguments into what the
// kernels take, one rule for every backend: an argument that was not given (or a
// gradient the call does not compute) is an undefined tensor and a null pointer;
// a given one is made contiguous and passes its data pointer (also when it is
// empty, e.g. B = 0).
#pragma once

#include <torch/types.h>

#include <cstdint>

namespace posattn {

inline at::Tensor opt_contig(const c10::optional<at::Tensor>& t) {
  return t.has_value() ? t->contiguous() : at::Tensor();
}

// t's data as T (the tensor's bits: T may be the CUDA twin of its ATen type, e.g.
// __half for at::Half); null for an undefined tensor.
template <typename T>
T* ptr_or_null(const at::Tensor& t) {
  static_assert(sizeof(T) == 2 || sizeof(T) == 4 || sizeof(T) == 8, "an element type");
  if (!t.defined()) return nullptr;
  TORCH_INTERNAL_ASSERT(static_cast<size_t>(t.element_size()) == sizeof(T),
                        "ptr_or_null: element size mismatch");
  return reinterpret_cast<T*>(t.data_ptr());
}

// An output the call computes (like `like`), or an undefined tensor (a null pointer) when it does not.
inline at::Tensor empty_if(bool needed, const at::Tensor& like) {
  return needed ? at::empty_like(like) : at::Tensor();
}

// What the op returns for a gradient it did not compute: an empty (0,) tensor.
inline at::Tensor or_empty(const at::Tensor& t, const at::Tensor& q) {
  return t.defined() ? t : at::empty({0}, q.options());
}

}  // namespace posattn
