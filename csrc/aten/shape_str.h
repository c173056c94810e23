// "(2, 3, 4)": a tensor shape for error messages, shared by the argument checks.
#pragma once

#include <c10/util/ArrayRef.h>

#include <sstream>
#include <string>

namespace posattn {

inline std::string shape_str(c10::IntArrayRef s) {
  std::ostringstream os;
  os << "(";
  for (size_t i = 0; i < s.size(); ++i) os << (i ? ", " : "") << s[i];
  os << ")";
  return os.str();
}

}  // namespace posattn
