#include "runtime/tensor/tensor.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace furnace::tensor {

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("(", absl::StrJoin(shape, ", "), ")");
}

}  // namespace furnace::tensor
