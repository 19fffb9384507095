#include "worker/fault_schedule.h"

#include <algorithm>
#include <cmath>

#include "spdlog/spdlog.h"

namespace furnace::worker {
namespace {

// splitmix64: a full-period mix of a 64-bit state (Steele, Lea, Flood 2014).
uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace

uint64_t FaultAfterSteps(uint32_t mean_steps, uint64_t seed, uint32_t attempt) {
  if (mean_steps <= 1) return 1;
  // U in (0, 1): the top 53 bits, offset by half a unit so that neither end is reached.
  const uint64_t bits = SplitMix64(SplitMix64(seed) ^ (0xfa017ull + attempt)) >> 11;
  const double u = (static_cast<double>(bits) + 0.5) / 9007199254740992.0;
  const double p = 1.0 / mean_steps;
  // Inverse CDF of the geometric distribution on {1, 2, ...}.
  const double k = std::ceil(std::log(u) / std::log1p(-p));
  return static_cast<uint64_t>(std::max(1.0, k));
}

std::optional<int> MaybeInjectRandomFault(const furnace::v1::RankTask& task, uint64_t computed,
                                          uint64_t done, Progress& progress) {
  const furnace::v1::FaultSpec& fault = task.spec().fault();
  if (fault.mean_steps() == 0 || fault.mode().empty()) return std::nullopt;
  const uint64_t after =
      FaultAfterSteps(fault.mean_steps(), task.spec().train().seed(), task.attempt());
  if (computed != after) return std::nullopt;
  // The same failure as fault.at_step at this step (MaybeInjectFault checks rank and attempt).
  furnace::v1::RankTask now = task;
  now.mutable_spec()->mutable_fault()->set_at_step(static_cast<uint32_t>(done));
  now.mutable_spec()->mutable_fault()->set_mean_steps(0);
  if (static_cast<int64_t>(task.rank()) == fault.rank()) {
    spdlog::info("fault.mean_steps {}: failing after {} steps computed in attempt {}",
                 fault.mean_steps(), computed, task.attempt());
  }
  return MaybeInjectFault(now, done, progress);
}

}  // namespace furnace::worker
