// Learning-rate schedules (MODEL.md "Loss and step"). Step s is 0-based: the LR used by the
// optimizer update that completes step s.
#pragma once

#include <cstdint>
#include <optional>

#include "absl/status/status.h"

namespace furnace::train {

struct LrSchedule {
  enum class Kind { kCosine, kConstant };
  Kind kind = Kind::kCosine;
  double lr = 3e-4;
  std::optional<double> min_lr = std::nullopt;  // cosine floor; default 0.1 * lr
  int64_t warmup_steps = 0;
  int64_t max_steps = 1;  // cosine reaches min_lr here and stays there after

  // lr * (s+1) / warmup while s < warmup; then constant lr, or cosine
  // min_lr + (lr - min_lr) * (1 + cos(pi * (s - warmup) / (max_steps - warmup))) / 2.
  double At(int64_t step) const;
  absl::Status Validate() const;
};

}  // namespace furnace::train
