#include "runtime/moe/trial.h"

#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "nlohmann/json.hpp"
#include "runtime/base/status.h"

namespace furnace::moe {
namespace {

std::string Ms(double seconds) { return absl::StrFormat("%.3g ms", seconds * 1e3); }

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// Every rank's `seconds` (negative: its run failed), on every rank.
absl::StatusOr<std::vector<double>> AllSeconds(comm::Communicator* world, double seconds) {
  if (world == nullptr || world->size() == 1) return std::vector<double>{seconds};
  std::vector<double> all(static_cast<size_t>(world->size()));
  RETURN_IF_ERROR(world->AllGather(&seconds, all.data(), sizeof(double)));
  return all;
}

}  // namespace

absl::StatusOr<Choice> MeasureSchedules(const Choice& predicted, const LayerShape& shape,
                                        comm::Communicator* world, const LayerRun& run,
                                        const TrialOptions& options) {
  const std::vector<Schedule> candidates = TrialCandidates(predicted, shape, options);
  if (candidates.size() < 2) return predicted;
  const int n = static_cast<int>(candidates.size());
  std::vector<std::vector<double>> times(candidates.size());
  const int min_rounds = std::max(1, options.reps);
  const int max_rounds = std::max(min_rounds, options.max_reps);
  // The timed rounds' slowest times, summed: the same on every rank, so every rank runs as many.
  double elapsed = 0;
  int rounds = 0;
  for (int round = -1;
       round < 0 || (rounds < max_rounds && (rounds < min_rounds || elapsed < options.seconds));
       ++round) {  // round -1: the untimed warm-up
    for (int j = 0; j < n; ++j) {
      const int c = (std::max(round, 0) + j) % n;
      if (world != nullptr) RETURN_IF_ERROR(world->Barrier());
      absl::StatusOr<double> seconds = run(candidates[c]);
      // Every rank learns whether every rank's run ended well: a rank that failed before the
      // layer's first collective (its buffers, their upload) would otherwise leave its peers
      // waiting in the next one until the communicator's timeout.
      ASSIGN_OR_RETURN(const std::vector<double> all,
                       AllSeconds(world, seconds.ok() ? std::max(*seconds, 0.0) : -1.0));
      const std::string what =
          absl::StrCat("moe.schedule auto: the trial of ", ScheduleName(candidates[c]));
      if (!seconds.ok()) {
        return absl::Status(seconds.status().code(),
                            absl::StrCat(what, ": ", seconds.status().message()));
      }
      for (size_t r = 0; r < all.size(); ++r) {
        if (all[r] < 0) return absl::AbortedError(absl::StrCat(what, " failed on rank ", r));
      }
      const double slowest = *std::max_element(all.begin(), all.end());
      if (round >= 0) {
        times[c].push_back(slowest);
        elapsed += slowest;
      }
    }
    if (round >= 0) ++rounds;
  }
  Choice out = predicted;
  out.measured_s.assign(std::size(kAllSchedules), 0.0);
  for (int c = 0; c < n; ++c) {
    out.measured_s[static_cast<size_t>(candidates[c])] = Median(times[c]);
  }
  const auto measured = [&out](Schedule s) { return out.measured_s[static_cast<size_t>(s)]; };
  const auto predicted_s = [&predicted](Schedule s) {
    return predicted.all[static_cast<size_t>(s)].total_s();
  };
  // Deepspeed first, then the others in the order of their predictions: each replaces the
  // incumbent only when measured at least `margin` faster, so a difference within the noise goes
  // to the baseline, and between Parm schedules to the model's order.
  std::vector<Schedule> order(candidates.begin() + 1, candidates.end());
  std::stable_sort(order.begin(), order.end(),
                   [&](Schedule a, Schedule b) { return predicted_s(a) < predicted_s(b); });
  Schedule pick = Schedule::kDeepspeed;
  for (Schedule s : order) {
    if (measured(s) < (1 - options.margin) * measured(pick)) pick = s;
  }
  Schedule fastest = pick;
  for (Schedule s : candidates) {
    if (measured(s) < measured(fastest)) fastest = s;
  }
  std::string tail = absl::StrCat(" (slowest rank, median of ", rounds, "; predicted");
  for (size_t i = 0; i < predicted.all.size(); ++i) {
    const Schedule s = predicted.all[i].schedule;
    absl::StrAppend(&tail, i == 0 ? " " : ", ", ScheduleName(s), " ",
                    Ms(predicted.all[i].total_s()), measured(s) > 0 ? "" : " not tried");
  }
  absl::StrAppend(&tail, ")");
  out.schedule = pick;
  const std::string margin = absl::StrFormat("%.0f%%", 100 * options.margin);
  const std::string gain =
      absl::StrFormat("%.0f%%", 100 * (1 - measured(fastest) / measured(pick)));
  if (pick == Schedule::kDeepspeed && fastest != pick) {
    out.reason = absl::StrCat("deepspeed: ", ScheduleName(fastest), " measured only ", gain,
                              " faster (", Ms(measured(fastest)), " vs ", Ms(measured(pick)),
                              " fwd+bwd), under the ", margin, " a Parm schedule must gain", tail);
    return out;
  }
  std::string versus;
  for (Schedule s : candidates) {
    if (s == pick) continue;
    absl::StrAppend(&versus, versus.empty() ? " vs " : ", ", ScheduleName(s), " ", Ms(measured(s)));
  }
  out.reason =
      absl::StrCat(ScheduleName(pick), ": measured ", Ms(measured(pick)), " fwd+bwd", versus);
  if (fastest != pick) {
    absl::StrAppend(&out.reason, "; ", ScheduleName(fastest), " measured only ", gain,
                    " faster, under the ", margin, " it must gain over one predicted faster");
  }
  absl::StrAppend(&out.reason, tail);
  return out;
}

std::string TrialToJson(const Choice& measured) {
  nlohmann::json j = {{"schedule", ScheduleName(measured.schedule)},
                      {"reason", measured.reason},
                      {"measured_s", measured.measured_s}};
  return j.dump(1);
}

absl::StatusOr<Choice> TrialFromJson(const Choice& predicted, std::string_view text) {
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError("moe trial: not a JSON object");
  }
  const auto schedule = j.find("schedule");
  const auto reason = j.find("reason");
  const auto measured = j.find("measured_s");
  if (schedule == j.end() || !schedule->is_string() || reason == j.end() || !reason->is_string() ||
      measured == j.end() || !measured->is_array() ||
      measured->size() != std::size(kAllSchedules)) {
    return absl::InvalidArgumentError(
        "moe trial: needs \"schedule\" and \"reason\" (strings) and \"measured_s\" (3 numbers)");
  }
  const std::optional<Schedule> s = ParseSchedule(schedule->get<std::string>());
  if (!s.has_value()) {
    return absl::InvalidArgumentError(
        absl::StrCat("moe trial: unknown schedule '", schedule->get<std::string>(), "'"));
  }
  Choice out = predicted;
  out.schedule = *s;
  out.reason = reason->get<std::string>();
  out.measured_s.clear();
  for (const nlohmann::json& v : *measured) {
    if (!v.is_number())
      return absl::InvalidArgumentError("moe trial: measured_s holds a non-number");
    out.measured_s.push_back(v.get<double>());
  }
  return out;
}

}  // namespace furnace::moe
