#include "runtime/train/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "absl/strings/str_cat.h"

namespace furnace::train {

double LrSchedule::At(int64_t step) const {
  if (step < warmup_steps) {
    return lr * static_cast<double>(step + 1) / static_cast<double>(warmup_steps);
  }
  if (kind == Kind::kConstant) return lr;
  const double floor = min_lr.value_or(0.1 * lr);
  const int64_t span = max_steps - warmup_steps;
  if (span <= 0) return floor;
  const double progress =
      std::clamp(static_cast<double>(step - warmup_steps) / static_cast<double>(span), 0.0, 1.0);
  return floor + 0.5 * (lr - floor) * (1.0 + std::cos(std::numbers::pi * progress));
}

absl::Status LrSchedule::Validate() const {
  if (!(lr >= 0) || !std::isfinite(lr)) {
    return absl::InvalidArgumentError(absl::StrCat("lr ", lr, " must be finite and >= 0"));
  }
  if (min_lr && (!(*min_lr >= 0) || *min_lr > lr)) {
    return absl::InvalidArgumentError(
        absl::StrCat("min_lr ", *min_lr, " must be in [0, lr=", lr, "]"));
  }
  if (warmup_steps < 0) {
    return absl::InvalidArgumentError(absl::StrCat("warmup ", warmup_steps, " must be >= 0"));
  }
  if (kind == Kind::kCosine && max_steps < warmup_steps) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_steps ", max_steps, " must be >= warmup ", warmup_steps));
  }
  return absl::OkStatus();
}

}  // namespace furnace::train
