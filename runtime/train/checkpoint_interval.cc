#include "runtime/train/checkpoint_interval.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "runtime/base/status.h"

namespace furnace::train {
namespace {

double Mean(const std::deque<double>& values) {
  if (values.empty()) return 0;
  return std::accumulate(values.begin(), values.end(), 0.0) / static_cast<double>(values.size());
}

void Push(std::deque<double>& window, double value, size_t size) {
  window.push_back(value);
  if (window.size() > size) window.pop_front();
}

}  // namespace

IntervalChoice YoungDalyInterval(const IntervalInputs& in, int64_t max_steps) {
  IntervalChoice c;
  if (!(in.stall_seconds > 0) || !(in.step_seconds > 0) || !(in.mtbf_seconds > 0)) return c;
  c.seconds = std::sqrt(2.0 * in.stall_seconds * in.mtbf_seconds);
  const double steps = std::round(c.seconds / in.step_seconds);
  const double cap = static_cast<double>(std::max<int64_t>(1, max_steps));
  c.steps = static_cast<int64_t>(std::clamp(steps, 1.0, cap));
  return c;
}

AutoCheckpointInterval::AutoCheckpointInterval(const IntervalInputs& hint, int64_t max_steps)
    : hint_(hint), max_steps_(std::max<int64_t>(1, max_steps)) {
  inputs_ = hint_;
  current_ = YoungDalyInterval(hint_, max_steps_);
  if (current_.steps == 0) current_.steps = 1;  // the probe: measure C at the first step
}

void AutoCheckpointInterval::ObserveStep(double step_seconds) {
  if (step_seconds > 0) Push(steps_, step_seconds, kStepWindow);
}

void AutoCheckpointInterval::ObserveStall(double stall_seconds) {
  if (stall_seconds > 0) Push(stalls_, stall_seconds, kStallWindow);
}

IntervalInputs AutoCheckpointInterval::Local() const {
  IntervalInputs in;
  in.stall_seconds = stalls_.empty() ? hint_.stall_seconds : Mean(stalls_);
  in.step_seconds = steps_.empty() ? hint_.step_seconds : Mean(steps_);
  in.mtbf_seconds = hint_.mtbf_seconds;
  return in;
}

bool AutoCheckpointInterval::Update(const IntervalInputs& agreed) {
  inputs_ = agreed;
  const IntervalChoice next = YoungDalyInterval(agreed, max_steps_);
  if (next.steps == 0) return false;  // still probing: the interval stays
  const double now = static_cast<double>(current_.steps);
  const bool differs = std::abs(static_cast<double>(next.steps) - now) > kIntervalHysteresis * now;
  const bool first = current_.seconds == 0;  // the probe's interval, not a Young/Daly one
  if (!first && !differs) {
    current_.seconds = next.seconds;  // the same steps; the seconds follow the measurements
    return false;
  }
  const bool changed = next.steps != current_.steps || first;
  current_ = next;
  return changed;
}

absl::StatusOr<IntervalInputs> AgreeIntervalInputs(comm::Communicator* world,
                                                   const IntervalInputs& mine) {
  if (world == nullptr || world->size() == 1) return mine;
  const double local[3] = {mine.stall_seconds, mine.step_seconds, mine.mtbf_seconds};
  std::vector<double> all(3 * static_cast<size_t>(world->size()));
  RETURN_IF_ERROR(world->AllGather(local, all.data(), sizeof(local)));
  IntervalInputs agreed;
  for (size_t r = 0; r < static_cast<size_t>(world->size()); ++r) {
    agreed.stall_seconds = std::max(agreed.stall_seconds, all[3 * r]);
    agreed.step_seconds = std::max(agreed.step_seconds, all[3 * r + 1]);
    agreed.mtbf_seconds = std::max(agreed.mtbf_seconds, all[3 * r + 2]);
  }
  return agreed;
}

}  // namespace furnace::train
