// Restart backoff: the delay before restart number n (1-based) is
//   min(initial_s * multiplier^(n-1), max_s)
// No jitter: restarts are reproducible, and with one controller there is no herd to spread.
#pragma once

#include <cstdint>

#include "furnace/v1/job.pb.h"

namespace furnace::controller {

double BackoffDelay(const furnace::v1::BackoffSpec& spec, uint32_t restart);

}  // namespace furnace::controller
