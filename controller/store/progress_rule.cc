#include "controller/store/progress_rule.h"

#include <algorithm>
#include <string>

namespace furnace::controller {

uint64_t AttemptStep(const furnace::v1::AttemptInfo& attempt) {
  if (attempt.ranks_size() == 0) return 0;
  uint64_t step = UINT64_MAX;
  for (const auto& r : attempt.ranks()) step = std::min<uint64_t>(step, r.step());
  return step;
}

namespace {

// best_before[i]: the highest step of the first `n` attempts before i.
std::vector<uint64_t> BestBefore(const std::vector<furnace::v1::AttemptInfo>& attempts, size_t n) {
  std::vector<uint64_t> best_before(n, 0);
  uint64_t best = 0;
  for (size_t i = 0; i < n; ++i) {
    best_before[i] = best;
    best = std::max(best, AttemptStep(attempts[i]));
  }
  return best_before;
}

}  // namespace

NoProgress AttemptsWithoutProgress(const std::vector<furnace::v1::AttemptInfo>& attempts) {
  const std::vector<uint64_t> best_before = BestBefore(attempts, attempts.size());
  NoProgress out;
  if (attempts.empty()) return out;
  const furnace::v1::AttemptInfo& newest = attempts.back();
  const std::string newest_layout = newest.parallel().SerializeAsString();
  for (size_t i = attempts.size(); i-- > 0;) {
    const auto& a = attempts[i];
    if (a.state() == furnace::v1::ATTEMPT_STATE_INTERRUPTED) continue;
    if (a.state() != furnace::v1::ATTEMPT_STATE_FAILED || AttemptStep(a) > best_before[i]) break;
    if (a.memory_policy() != newest.memory_policy() ||
        a.parallel().SerializeAsString() != newest_layout) {
      break;
    }
    if (out.attempts == 0) out.step = best_before[i];
    ++out.attempts;
  }
  return out;
}

std::set<std::string> SuspectWorkers(const std::vector<furnace::v1::AttemptInfo>& attempts) {
  using furnace::v1::AttemptInfo;
  const auto ended = [](const AttemptInfo& a) {
    return a.state() == furnace::v1::ATTEMPT_STATE_FAILED ||
           a.state() == furnace::v1::ATTEMPT_STATE_INTERRUPTED;
  };
  std::set<std::string> out;
  size_t newest = attempts.size();
  while (newest > 0 && !ended(attempts[newest - 1])) --newest;  // past a running or pending one
  if (newest == 0) return out;
  if (!attempts[newest - 1].culprit_worker().empty()) {
    out.insert(attempts[newest - 1].culprit_worker());
  }
  const std::vector<uint64_t> best_before = BestBefore(attempts, newest);  // the same rule
  for (size_t i = newest; i-- > 0;) {
    const AttemptInfo& a = attempts[i];
    if (a.state() == furnace::v1::ATTEMPT_STATE_INTERRUPTED) continue;
    if (a.state() != furnace::v1::ATTEMPT_STATE_FAILED || AttemptStep(a) > best_before[i]) break;
    if (!a.culprit_worker().empty()) out.insert(a.culprit_worker());
  }
  return out;
}

}  // namespace furnace::controller
