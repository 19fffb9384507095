// What every benchmark here reports about a series of measurements (step times, tokens/s): the
// median, a {median, min, max} JSON summary, and the monotonic clock the times are read from.
// Free functions, no state: any thread.
#pragma once

#include <vector>

#include "nlohmann/json.hpp"

namespace furnace::bench {

// Seconds on std::chrono::steady_clock (differences only).
double Now();

// The median (the mean of the middle two for an even count); 0 for an empty series.
double Median(std::vector<double> v);

// {"median", "min", "max"} of a non-empty series.
nlohmann::json Summary(const std::vector<double>& v);

}  // namespace furnace::bench
