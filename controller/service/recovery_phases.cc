#include "controller/service/recovery_phases.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace furnace::controller {

namespace v1 = furnace::v1;

double FailureUnix(const v1::AttemptInfo& failed) {
  return failed.failed_unix() > 0 ? failed.failed_unix() : failed.ended_unix();
}

std::optional<v1::RecoveryPhases> RecoveryPhasesOf(const v1::AttemptInfo& failed,
                                                   const v1::AttemptInfo& next) {
  if (next.first_step_unix() <= 0 || failed.ended_unix() <= 0 || next.started_unix() <= 0) {
    return std::nullopt;
  }
  const auto span = [](double from, double to) { return std::max(0.0, to - from); };
  const double failed_at = FailureUnix(failed);
  const double ended = failed.ended_unix();
  const double recover_at = failed.recover_at_unix() > 0 ? failed.recover_at_unix() : ended;
  // Ranks still ending when the next attempt was placed (spares took their place): teardown was
  // not on the way; count it up to the placement.
  const double exited = failed.ranks_exited_unix() > 0
                            ? std::min(failed.ranks_exited_unix(), next.started_unix())
                            : next.started_unix();
  const double all_running =
      next.all_running_unix() > 0 ? next.all_running_unix() : next.started_unix();
  // Each rank-side point at least the one before it, so the phases follow each other.
  const double rendezvous = std::max(next.rendezvous_unix(), all_running);
  const double setup = std::max(next.setup_unix(), rendezvous);
  const double loaded = std::max(next.checkpoint_load_unix(), setup);
  const double first_step = std::max(next.first_step_unix(), loaded);

  v1::RecoveryPhases p;
  p.set_from_attempt(failed.attempt());
  p.set_detection_s(span(failed_at, ended));
  p.set_teardown_s(span(ended, exited));
  p.set_backoff_s(span(ended, recover_at));
  p.set_placement_s(span(std::max(exited, recover_at), next.started_unix()));
  p.set_start_s(span(next.started_unix(), all_running));
  p.set_rendezvous_s(span(all_running, rendezvous));
  p.set_setup_s(span(rendezvous, setup));
  p.set_checkpoint_load_s(span(setup, loaded));
  p.set_first_step_s(span(loaded, first_step));
  p.set_total_s(span(failed_at, first_step));
  std::string dominant;
  double longest = -1;
  for (const auto& [name, seconds] : RecoveryPhaseList(p)) {
    if (seconds > longest) {
      longest = seconds;
      dominant = name;
    }
  }
  p.set_dominant(dominant);
  return p;
}

std::vector<std::pair<std::string, double>> RecoveryPhaseList(const v1::RecoveryPhases& p) {
  return {{"detection", p.detection_s()},  {"teardown", p.teardown_s()},
          {"backoff", p.backoff_s()},      {"placement", p.placement_s()},
          {"start", p.start_s()},          {"rendezvous", p.rendezvous_s()},
          {"setup", p.setup_s()},          {"checkpoint_load", p.checkpoint_load_s()},
          {"first_step", p.first_step_s()}};
}

std::string RecoveryPhasesLine(const v1::RecoveryPhases& p) {
  std::string out = absl::StrFormat(
      "%.2f s from the failure of attempt %d to the first step:", p.total_s(), p.from_attempt());
  bool first = true;
  for (const auto& [name, seconds] : RecoveryPhaseList(p)) {
    absl::StrAppendFormat(&out, "%s %s %.2f s", first ? "" : ",", name, seconds);
    first = false;
  }
  absl::StrAppend(&out, " (longest: ", p.dominant(), ")");
  return out;
}

}  // namespace furnace::controller
