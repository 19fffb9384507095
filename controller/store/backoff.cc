#include "controller/store/backoff.h"

#include <algorithm>
#include <cmath>

namespace furnace::controller {

double BackoffDelay(const furnace::v1::BackoffSpec& spec, uint32_t restart) {
  if (restart == 0) return 0.0;
  const double multiplier = std::max(1.0, spec.multiplier());
  const double delay = spec.initial_s() * std::pow(multiplier, static_cast<double>(restart - 1));
  return std::min(delay, spec.max_s() > 0 ? spec.max_s() : delay);
}

}  // namespace furnace::controller
