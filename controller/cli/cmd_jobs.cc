// furnace jobs | status | cancel | workers: one request, one answer printed.
#include <algorithm>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "controller/cli/commands.h"
#include "controller/cli/exit_codes.h"
#include "controller/cli/format.h"
#include "controller/cli/poll_outage.h"
#include "controller/cli/status_view.h"
#include "google/protobuf/util/json_util.h"
#include "proto/furnace/v1/job_paths.h"
#include "proto/furnace/v1/state_names.h"
#include "runtime/base/status.h"

namespace furnace::cli {

absl::Status PrintJson(const google::protobuf::Message& message, std::ostream& out) {
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.always_print_primitive_fields = true;
  options.preserve_proto_field_names = true;
  std::string json;
  const auto status = google::protobuf::util::MessageToJsonString(message, &json, options);
  if (!status.ok()) {
    return absl::InternalError(absl::StrCat("cannot print JSON: ", status.ToString()));
  }
  out << json;
  if (json.empty() || json.back() != '\n') out << '\n';
  return absl::OkStatus();
}

absl::StatusOr<int> RunJobs(const CommandContext& ctx, const std::vector<std::string>& states) {
  ASSIGN_OR_RETURN(v1::ListJobsResponse jobs, ctx.client->ListJobs());
  if (!states.empty()) {
    const std::set<std::string> wanted(states.begin(), states.end());
    v1::ListJobsResponse kept;
    for (v1::JobSummary& job : *jobs.mutable_jobs()) {
      const bool ended = IsFinalState(job.state());
      if (wanted.count(v1::StateWord(job.state())) > 0 ||
          wanted.count(ended ? "ended" : "active") > 0) {
        *kept.add_jobs() = std::move(job);
      }
    }
    jobs = std::move(kept);
    if (jobs.jobs().empty() && !ctx.json) {
      *ctx.out << "no jobs in state " << absl::StrJoin(states, ", ") << "\n";
      return kExitOk;
    }
  }
  if (ctx.json) {
    RETURN_IF_ERROR(PrintJson(jobs, *ctx.out));
  } else if (jobs.jobs().empty()) {
    *ctx.out << "no jobs\n";
  } else {
    *ctx.out << RenderJobsTable(jobs, ctx.clock->UnixSeconds());
  }
  return kExitOk;
}

absl::StatusOr<int> RunStatus(const CommandContext& ctx, const std::string& job_id) {
  ASSIGN_OR_RETURN(const v1::JobDetail job, ctx.client->GetJob(job_id));
  if (ctx.json) {
    RETURN_IF_ERROR(PrintJson(job, *ctx.out));
  } else {
    *ctx.out << RenderJobStatus(job, ctx.clock->UnixSeconds());
  }
  return kExitOk;
}

namespace {

// The last attempt's ranks that have not ended (a cancel stops those).
int RanksNotEnded(const v1::JobDetail& job) {
  if (job.attempts().empty()) return 0;
  const auto& ranks = job.attempts(job.attempts_size() - 1).ranks();
  return static_cast<int>(std::count_if(ranks.begin(), ranks.end(), [](const v1::RankInfo& r) {
    return r.state() != v1::RANK_STATE_EXITED;
  }));
}

// How the ranks of a job just cancelled stop: after their step, writing its checkpoint, when the
// job has one to keep (v1::StopCheckpointGraceS); "" when none is left running.
std::string StoppingNote(const v1::JobDetail& job) {
  const int running = RanksNotEnded(job);
  if (running == 0) return "";
  const double grace = v1::StopCheckpointGraceS(job.spec());
  const bool one = running == 1;
  const std::string ranks = one ? "its rank" : absl::StrCat("its ", running, " ranks");
  if (grace <= 0) return absl::StrCat(": ", ranks, one ? " is" : " are", " being stopped");
  return absl::StrCat(
      ": ", ranks, one ? " stops after its step and writes" : " stop after their step and write",
      " its checkpoint (within checkpoint.stop_grace_s ", FormatMetric(grace), " s)");
}

// How the ranks of the job's last attempt ended, one line per way ("  ranks 0-3, 5: <exit>\n"),
// in rank order of each way's first rank: ranks that ended alike (every rank of a stop agrees on
// its step) share a line.
std::string RankEnds(const v1::JobDetail& job) {
  if (job.attempts().empty()) return "";
  std::vector<std::pair<std::string, std::vector<uint32_t>>> groups;
  for (const v1::RankInfo& r : job.attempts(job.attempts_size() - 1).ranks()) {
    const std::string how = r.exit().empty() ? "-" : OneLine(r.exit());
    auto it =
        std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return g.first == how; });
    if (it == groups.end()) it = groups.insert(groups.end(), {how, {}});
    it->second.push_back(r.rank());
  }
  std::string out;
  for (const auto& [how, ranks] : groups) {
    std::vector<std::string> spans;  // ascending runs: "0-3", "5"
    for (size_t i = 0; i < ranks.size();) {
      size_t j = i;
      while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
      spans.push_back(j == i ? absl::StrCat(ranks[i]) : absl::StrCat(ranks[i], "-", ranks[j]));
      i = j + 1;
    }
    absl::StrAppend(&out, "  ", ranks.size() == 1 ? "rank " : "ranks ", absl::StrJoin(spans, ", "),
                    ": ", how, "\n");
  }
  return out;
}

// --wait: polls the job until every rank of its last attempt has ended (the controller records a
// lost worker's rank as ended too, so this ends), riding out a controller restart like watch.
absl::StatusOr<v1::JobDetail> WaitForRanks(const CommandContext& ctx, const std::string& job_id,
                                           v1::JobDetail job) {
  PollOutage outage(*ctx.clock, /*answered=*/true);
  const double started = ctx.clock->MonotonicSeconds();
  bool drawn = false;
  while (RanksNotEnded(job) > 0) {
    if (ctx.err_tty) {
      *ctx.err << "\rjob " << job_id << ": waiting for " << RanksNotEnded(job) << " of "
               << job.attempts(job.attempts_size() - 1).ranks_size() << " ranks to stop  "
               << FormatDuration(ctx.clock->MonotonicSeconds() - started) << "   " << std::flush;
      drawn = true;
    }
    ctx.sleep(ctx.poll_interval_s);
    absl::StatusOr<v1::JobDetail> polled = ctx.client->GetJob(job_id);
    if (!polled.ok()) {
      if (!outage.Retry(polled.status())) return polled.status();
      continue;
    }
    outage.Answered();
    job = *std::move(polled);
  }
  if (drawn) *ctx.err << "\n";
  return job;
}

}  // namespace

absl::StatusOr<int> RunCancel(const CommandContext& ctx, const std::vector<std::string>& job_ids,
                              const CancelOptions& options) {
  v1::ListJobsResponse cancelled_jobs;  // --json with several jobs
  int exit_code = kExitOk;
  for (const std::string& job_id : job_ids) {
    absl::StatusOr<v1::CancelJobResponse> cancelled = ctx.client->CancelJob(job_id);
    // The controller refuses to cancel a job that already ended: not an RPC error (exit 6).
    absl::Status error = cancelled.status();
    if (absl::IsFailedPrecondition(error)) error = NotApplicable(error);
    if (!error.ok()) {
      if (job_ids.size() == 1) return error;
      *ctx.err << "furnace: " << error.message() << "\n";
      if (exit_code == kExitOk) exit_code = ExitCodeForStatus(error);
      continue;
    }
    const v1::JobSummary& job = cancelled->job();
    const std::string id = job.job_id().empty() ? job_id : job.job_id();
    // The job as it is now, for how its ranks stop and (--wait) how they ended. Without --wait a
    // failed look only leaves the note out: the cancel is done.
    absl::StatusOr<v1::JobDetail> detail = absl::UnavailableError("not asked");
    if (!ctx.json || options.wait) detail = ctx.client->GetJob(id);
    if (options.wait && !detail.ok()) return detail.status();
    if (ctx.json && job_ids.size() == 1) {
      RETURN_IF_ERROR(PrintJson(*cancelled, *ctx.out));
    } else if (ctx.json) {
      *cancelled_jobs.add_jobs() = job;
    } else {
      *ctx.out << "job " << id << " is " << StateName(job.state())
               << (detail.ok() ? StoppingNote(*detail) : "") << "\n"
               << std::flush;
    }
    if (!options.wait) continue;
    ASSIGN_OR_RETURN(const v1::JobDetail ended, WaitForRanks(ctx, id, *std::move(detail)));
    if (!ctx.json && !ended.attempts().empty()) {
      *ctx.out << "job " << id << ": how its ranks ended\n" << RankEnds(ended) << std::flush;
    }
  }
  if (ctx.json && job_ids.size() > 1) RETURN_IF_ERROR(PrintJson(cancelled_jobs, *ctx.out));
  return exit_code;
}

absl::StatusOr<int> RunWorkers(const CommandContext& ctx) {
  ASSIGN_OR_RETURN(const v1::ListWorkersResponse workers, ctx.client->ListWorkers());
  if (ctx.json) {
    RETURN_IF_ERROR(PrintJson(workers, *ctx.out));
  } else if (workers.workers().empty()) {
    *ctx.out << "no workers\n";
  } else {
    *ctx.out << RenderWorkersTable(workers, ctx.clock->UnixSeconds());
  }
  return kExitOk;
}

}  // namespace furnace::cli
