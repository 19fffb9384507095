// TensorView: a non-owning view of a contiguous row-major tensor (data pointer, shape, dtype, the
// kind of device the bytes live on). Ownership stays with whoever allocated the bytes (a
// DeviceArena Buffer, a HostPool buffer, the model's flat parameter array); a view must not
// outlive it. Shapes are written in comments next to every view as in llm.c: `// (B, T, C)`.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/device/device.h"
#include "runtime/tensor/dtype.h"

namespace furnace::tensor {

inline int64_t NumElements(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// "(2, 8, 16)"
std::string ShapeString(const std::vector<int64_t>& shape);

struct TensorView {
  void* data = nullptr;
  std::vector<int64_t> shape;
  DType dtype = DType::kF32;
  device::Kind device = device::Kind::kCpu;

  int64_t numel() const { return NumElements(shape); }
  int64_t bytes() const { return numel() * ElementSize(dtype); }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data);
  }
};

}  // namespace furnace::tensor
