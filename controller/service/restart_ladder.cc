// The restart ladder's worker rules (recovery.cc's file comment lists every rung): suspects and
// exclusions, how an excluded worker becomes usable again, the health check's verdict (who never
// arrived), and giving up when no allowed layout fits the workers left.
#include <ctime>
#include <map>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "controller/service/job_lifecycle.h"
#include "controller/store/job_state.h"

namespace furnace::controller {

namespace v1 = furnace::v1;

namespace {

// How an excluded worker becomes usable again, in words.
std::string UsableAgain(const Job::Exclusion& ex) {
  return absl::StrCat("usable again when its agent ",
                      ex.lost ? "registers again" : "restarts (registers as a new process)",
                      ", or at ", UnixClock(ex.until_unix));
}

}  // namespace

std::string UnixClock(double unix_s) {
  const time_t t = static_cast<time_t>(unix_s);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char text[32];
  std::strftime(text, sizeof text, "%H:%M:%S UTC", &tm);
  return text;
}

uint32_t JobLifecycle::HealthyWorkers(const Job& job, const PlacementScan::OfKind& kind,
                                      std::string* left_out) const {
  // Busy ones count too (they free up), and, after a controller restart, ones known from the
  // store that have not registered yet: within the re-attach grace they are not lost, so a job
  // does not shrink only because its workers have not re-attached yet.
  uint32_t healthy = kind.usable;
  std::map<std::string, std::string> out;  // worker id -> why it is left out, in id order
  for (const auto& [id, ex] : job.excluded_workers) {
    const Worker* w = workers_.Find(id);
    if (w == nullptr || w->info.device_kind() != job.spec.resources().device()) continue;
    out[id] = absl::StrCat(id, " excluded (", ex.reason, "; ", UsableAgain(ex), ")");
    if (w->info.state() != v1::WORKER_STATE_LOST) --healthy;
  }
  for (const auto& [id, left] : kind.lost) {
    // A worker whose agent was stopped cleanly is "left", as `furnace workers` and
    // furnace_workers{state="left"} say, not lost.
    out.emplace(
        id, absl::StrCat(id, left ? " left" : " lost", " (usable again when its agent registers)"));
  }
  if (left_out != nullptr) {
    *left_out = absl::StrJoin(out, "; ",
                              [](std::string* o, const auto& e) { absl::StrAppend(o, e.second); });
  }
  return healthy;
}

void JobLifecycle::HealthCheckFailed(Job& job, const v1::RankReport& report) {
  const uint32_t n = job.current()->attempt();
  const Rendezvous::Scope scope{job.summary.job_id(), n};
  // Who never arrived: a collective that times out on every rank names nobody, but a rank's
  // arrival key is its own statement that it reached the check. (Copied out: FailAttempt may
  // restore the job from a backup.)
  struct Missing {
    uint32_t rank;
    std::string worker_id;
  };
  std::vector<Missing> missing;
  for (const auto& r : job.current()->ranks()) {
    if (!rendezvous_.Has(scope, absl::StrCat("health/arrived/", r.rank()))) {
      missing.push_back({r.rank(), r.worker_id()});
    }
  }
  const std::string reporter =
      absl::StrCat("rank ", report.rank(), " on ", report.worker_id(), ": ",
                   report.reason().empty() ? absl::StrCat("exited with code ", report.exit_code())
                                           : report.reason());
  if (missing.empty() || missing.size() == static_cast<size_t>(job.current()->ranks_size())) {
    // Everyone arrived (or nobody's arrival is known): the check names no one, so no worker can be
    // excluded and a restart on the same workers is an ordinary retry: it counts against
    // recovery.max_restarts. The reporting worker is a suspect.
    FailAttempt(job, "health_check",
                absl::StrCat(reporter, missing.empty() ? " (every rank arrived: no worker to blame)"
                                                       : " (no rank's arrival was recorded)"),
                report.worker_id(), Failure::kRetryable);
    return;
  }
  std::vector<std::string> names;
  for (const Missing& m : missing)
    names.push_back(absl::StrCat("rank ", m.rank, " on ", m.worker_id));
  // The ranks wait for their peers' arrival as long as start-up may take (worker/health_check.h).
  const auto& recovery = job.spec.recovery();
  const bool start_bound = recovery.start_timeout_s() > recovery.health_check_s();
  const std::string blamed =
      absl::StrFormat("%s never arrived at the health check within %.0f s (recovery.%s)",
                      absl::StrJoin(names, ", "),
                      start_bound ? recovery.start_timeout_s() : recovery.health_check_s(),
                      start_bound ? "start_timeout_s" : "health_check_s");
  if (!FailAttempt(job, "health_check", absl::StrCat(blamed, "; ", reporter), "",
                   Failure::kHealthCheck) ||
      IsFinal(job.summary.state())) {
    return;
  }
  for (const Missing& m : missing) {
    Exclude(
        job, m.worker_id,
        absl::StrCat("failed the health check of attempt ", n, ": rank ", m.rank, " never arrived"),
        /*lost=*/false);
  }
}

void JobLifecycle::Exclude(Job& job, const std::string& worker_id, const std::string& reason,
                           bool lost) {
  Job::Exclusion ex;
  ex.reason = reason;
  const Worker* w = workers_.Find(worker_id);
  ex.instance_id = w != nullptr ? w->info.instance_id() : "";
  ex.lost = lost;
  ex.until_mono = clock_.MonotonicSeconds() + job.spec.recovery().exclude_s();
  ex.until_unix = clock_.UnixSeconds() + job.spec.recovery().exclude_s();
  job.excluded_workers[worker_id] = ex;
  job.suspect_workers.erase(worker_id);
  Event(job, "exclude",
        absl::StrFormat("worker %s excluded from this job (%s); %s (recovery.exclude_s = %.0f s)",
                        worker_id, reason, UsableAgain(ex), job.spec.recovery().exclude_s()));
}

void JobLifecycle::ReleaseExclusions(Job& job) {
  const double now = clock_.MonotonicSeconds();
  for (auto it = job.excluded_workers.begin(); it != job.excluded_workers.end();) {
    const Worker* w = workers_.Find(it->first);
    std::string why;
    if (now >= it->second.until_mono) {
      why = absl::StrFormat("its exclusion of %.0f s is over (recovery.exclude_s)",
                            job.spec.recovery().exclude_s());
    } else if (w != nullptr && w->info.state() != v1::WORKER_STATE_LOST &&
               workers_.HasSession(it->first)) {
      if (w->info.instance_id() != it->second.instance_id) {
        why = "its agent restarted (registered as a new process)";
      } else if (it->second.lost) {
        why = "its agent registered again";
      }
    }
    if (why.empty()) {
      ++it;
      continue;
    }
    Event(job, "include",
          absl::StrCat("worker ", it->first, " usable again: ", why,
                       "; the next attempt's health check vets it"));
    job.suspect_workers.insert(it->first);
    it = job.excluded_workers.erase(it);
  }
}

void JobLifecycle::FailUnfit(Job& job, const std::string& why) {
  const Job backup = job;
  job.summary.set_cause(
      absl::StrCat("the layout no longer fits the workers left: ", why,
                   absl::StrFormat(" for %.0f s (recovery.wait_for_workers_s); not retried",
                                   job.spec.recovery().wait_for_workers_s())));
  if (!Transition(job, v1::JOB_FAILED, "failed", job.summary.cause()).ok()) job = backup;
}

}  // namespace furnace::controller
