#include "controller/cli/status_view.h"

#include <algorithm>
#include <map>
#include <optional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "controller/cli/exit_codes.h"
#include "controller/cli/format.h"
#include "controller/cli/goodput_view.h"
#include "controller/cli/recovery_view.h"
#include "controller/cli/train_view.h"
#include "proto/furnace/v1/state_names.h"

namespace furnace::cli {
namespace {

constexpr int kEventsShown = 10;
constexpr int kAttemptsWithRanks = 3;

std::string OrDash(const std::string& s) { return s.empty() ? "-" : s; }

// A rank not ended of an attempt that ended (cancelled, failed, interrupted) is being stopped.
std::string RankStateWord(const v1::AttemptInfo& attempt, const v1::RankInfo& rank) {
  if (rank.state() != v1::RANK_STATE_EXITED && attempt.state() != v1::ATTEMPT_STATE_RUNNING &&
      attempt.state() != v1::ATTEMPT_STATE_UNSPECIFIED) {
    return "stopping";
  }
  return OrDash(v1::StateWord(rank.state()));
}

constexpr size_t kCauseWidth = 60;

// Why a job waits, while it does; else its cause: for a job whose later attempt runs, the one it
// restarted after (see CauseIsPast).
std::string CauseColumn(const v1::JobSummary& job) {
  if (!job.waiting().empty()) return absl::StrCat("waiting: ", job.waiting());
  if (job.cause().empty()) return "-";
  return CauseIsPast(job) ? absl::StrCat("restarted after: ", job.cause()) : job.cause();
}

std::string AttemptDuration(const v1::AttemptInfo& a, double now_unix) {
  if (a.started_unix() <= 0) return "-";
  const double end = a.ended_unix() > 0 ? a.ended_unix() : now_unix;
  return FormatDuration(end - a.started_unix());
}

// What is left of resources.time_limit_s, counted from the first attempt's start ("" once the job
// ended).
std::string TimeLimitLeft(const v1::JobDetail& job, double now_unix) {
  if (IsFinalState(job.summary().state())) return "";
  double deadline = job.summary().deadline_unix();
  // (A controller older than JobSummary.deadline_unix: from the first attempt's start.)
  if (deadline <= 0 && !job.attempts().empty() && job.attempts(0).started_unix() > 0) {
    deadline = job.attempts(0).started_unix() + job.spec().resources().time_limit_s();
  }
  if (deadline <= 0) return "counted from its first attempt's start";
  const double left = deadline - now_unix;
  return left > 0 ? absl::StrCat(FormatDuration(left), " left") : "reached";
}

}  // namespace

std::string RenderJobStatus(const v1::JobDetail& job, double now_unix) {
  const v1::JobSummary& s = job.summary();
  std::string out;
  Table summary({"", ""});
  summary.AddRow({"job", absl::StrCat(s.job_id(), s.name().empty() ? "" : "  " + s.name(),
                                      s.kind().empty() ? "" : " (" + s.kind() + ")")});
  summary.AddRow({"state", StateName(s.state())});
  summary.AddRow({"attempt", absl::StrCat(s.attempt(), "  (", s.restarts(),
                                          s.restarts() == 1 ? " restart)" : " restarts)")});
  if (!s.cause().empty()) {
    summary.AddRow({CauseIsPast(s) ? "restarted after" : "cause", s.cause()});
  }
  if (!s.waiting().empty()) summary.AddRow({"waiting", s.waiting()});
  // An attempt that runs another memory policy than the spec's (the out-of-memory escalation).
  if (!job.attempts().empty()) {
    const v1::AttemptInfo& last = *job.attempts().rbegin();
    const std::string& spec_policy =
        job.spec().memory().policy().empty() ? std::string("none") : job.spec().memory().policy();
    if (!last.memory_policy().empty() && last.memory_policy() != spec_policy) {
      summary.AddRow(
          {"memory policy", absl::StrCat(last.memory_policy(), "  (the spec's is ", spec_policy,
                                         "; escalated after an attempt ran out of memory)")});
    }
  }
  summary.AddRow({"progress", absl::StrCat(ProgressBar(s.step(), s.total_steps(), 30), "  step ",
                                           FormatProgress(s.step(), s.total_steps()))});
  summary.AddRow({"ranks", absl::StrCat(s.world_size())});
  if (const double limit = job.spec().resources().time_limit_s(); limit > 0) {
    const std::string left = TimeLimitLeft(job, now_unix);
    summary.AddRow({"time limit",
                    absl::StrCat(FormatDuration(limit), left.empty() ? "" : "  (" + left + ")")});
  }
  summary.AddRow(
      {"submitted", absl::StrCat(FormatUnixTime(s.submitted_unix()), "  (",
                                 FormatDuration(now_unix - s.submitted_unix()), " ago)")});
  summary.AddRow({"updated", FormatUnixTime(s.updated_unix())});
  // The header row of a two-column key/value table is empty: drop it.
  const std::string rendered = summary.Render();
  out += rendered.substr(rendered.find('\n') + 1);

  if (!job.attempts().empty()) {
    out += "\nattempts\n";
    Table attempts({"ATTEMPT", "STATE", "STARTED", "DURATION", "CAUSE"}, "  ");
    attempts.SetRightAligned(0);
    for (const auto& a : job.attempts()) {
      attempts.AddRow({absl::StrCat(a.attempt()), OrDash(v1::StateWord(a.state())),
                       FormatUnixTime(a.started_unix()), AttemptDuration(a, now_unix),
                       OrDash(a.cause())});
    }
    out += attempts.Render();

    out += "\nranks\n";
    Table ranks({"ATTEMPT", "RANK", "WORKER", "HOST", "PID", "STATE", "STEP", "EXIT"}, "  ");
    for (size_t c : {0, 1, 4, 6}) ranks.SetRightAligned(c);
    const int first = std::max(0, job.attempts_size() - kAttemptsWithRanks);
    for (int i = first; i < job.attempts_size(); ++i) {
      const auto& a = job.attempts(i);
      for (const auto& r : a.ranks()) {
        ranks.AddRow({absl::StrCat(a.attempt()), absl::StrCat(r.rank()), OrDash(r.worker_id()),
                      OrDash(r.host()), r.pid() > 0 ? absl::StrCat(r.pid()) : "-",
                      RankStateWord(a, r), absl::StrCat(r.step()), OrDash(r.exit())});
      }
    }
    out += ranks.Render();
    if (first > 0) {
      absl::StrAppend(&out, "  (ranks of attempts 1-", job.attempts(first - 1).attempt(),
                      ": furnace --json status ", s.job_id(), ")\n");
    }
  }

  out += RenderRecoverySection(job);

  if (!job.comm().empty()) {
    std::vector<const v1::CommResult*> rows;
    for (const auto& r : job.comm()) rows.push_back(&r);
    std::sort(rows.begin(), rows.end(), [](const v1::CommResult* a, const v1::CommResult* b) {
      if (a->collective() != b->collective()) return a->collective() < b->collective();
      return a->bytes() < b->bytes();
    });
    out += "\ncommcheck\n";
    Table comm({"COLLECTIVE", "SIZE", "TIME (us)", "ALGBW GB/s", "BUSBW GB/s", "VERIFIED"}, "  ");
    for (size_t c = 1; c <= 4; ++c) comm.SetRightAligned(c);
    for (const auto* r : rows) {
      comm.AddRow({r->collective(), FormatBytes(r->bytes()),
                   absl::StrFormat("%.1f", r->time_s() * 1e6), FormatGbps(r->algbw_gbps()),
                   FormatGbps(r->busbw_gbps()),
                   r->verified() ? "yes" : absl::StrCat("NO (", r->errors(), " errors)")});
    }
    out += comm.Render();
  }

  out += RenderTrainSection(s, TrainMetricsOf(job));
  out += RenderGoodputSection(job);

  if (!job.events().empty()) {
    out += "\nevents\n";
    Table events({"TIME", "KIND", "MESSAGE"}, "  ");
    const int first = std::max(0, job.events_size() - kEventsShown);
    for (int i = first; i < job.events_size(); ++i) {
      const auto& e = job.events(i);
      events.AddRow({FormatUnixTime(e.unix_time()), e.kind(), e.message()});
    }
    out += events.Render();
  }
  return out;
}

std::string RenderJobsTable(const v1::ListJobsResponse& jobs, double now_unix) {
  Table table({"JOB", "NAME", "KIND", "STATE", "ATTEMPT", "RESTARTS", "RANKS", "PROGRESS",
               "AGE/UPDATED", "CAUSE"});
  for (size_t c : {4, 5, 6, 7}) table.SetRightAligned(c);
  for (const auto& j : jobs.jobs()) {
    table.AddRow({j.job_id(), OrDash(j.name()), OrDash(j.kind()), StateName(j.state()),
                  absl::StrCat(j.attempt()), absl::StrCat(j.restarts()),
                  absl::StrCat(j.world_size()), FormatProgress(j.step(), j.total_steps()),
                  absl::StrCat(FormatDuration(now_unix - j.submitted_unix()), "/",
                               FormatDuration(now_unix - j.updated_unix())),
                  Truncate(CauseColumn(j), kCauseWidth)});
  }
  return table.Render();
}

std::string RenderWorkersTable(const v1::ListWorkersResponse& workers, double now_unix) {
  Table table(
      {"WORKER", "HOST", "SLOT", "DEVICE", "MEMORY", "STATE", "JOB/RANK", "LAST SEEN", "PID"});
  for (size_t c : {2, 4, 8}) table.SetRightAligned(c);
  for (const auto& w : workers.workers()) {
    table.AddRow({w.worker_id(), OrDash(w.host()), absl::StrCat(w.slot()), OrDash(w.device_kind()),
                  w.device_memory() > 0 ? FormatBytes(w.device_memory()) : "-",
                  OrDash(v1::WorkerStateWord(w)),
                  w.job_id().empty() ? "-" : absl::StrCat(w.job_id(), "/", w.rank()),
                  w.last_seen_unix() > 0
                      ? absl::StrCat(FormatDuration(now_unix - w.last_seen_unix()), " ago")
                      : "-",
                  w.pid() > 0 ? absl::StrCat(w.pid()) : "-"});
  }
  return table.Render();
}

}  // namespace furnace::cli
