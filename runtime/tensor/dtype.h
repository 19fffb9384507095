// Element types of stored tensors. The model computes in fp32; bf16 and fp8 e4m3 exist so a memory
// planner can store activations compressed (kernels/cast.h converts).
#pragma once

#include <cstdint>

namespace furnace::tensor {

enum class DType { kF32, kBF16, kFP8E4M3, kI32 };

constexpr int64_t ElementSize(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return 4;
    case DType::kBF16:
      return 2;
    case DType::kFP8E4M3:
      return 1;
    case DType::kI32:
      return 4;
  }
  return 0;
}

constexpr const char* DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "f32";
    case DType::kBF16:
      return "bf16";
    case DType::kFP8E4M3:
      return "fp8e4m3";
    case DType::kI32:
      return "i32";
  }
  return "?";
}

}  // namespace furnace::tensor
