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

// The last attempt's ranks in `state`, or (UNSPECIFIED) not ended.
int LastAttemptRanks(const v1::JobDetail& job, v1::RankState state = v1::RANK_STATE_UNSPECIFIED) {
  if (job.attempts().empty()) return 0;
  const auto& ranks = job.attempts(job.attempts_size() - 1).ranks();
  return static_cast<int>(std::count_if(ranks.begin(), ranks.end(), [&](const v1::RankInfo& r) {
    return state == v1::RANK_STATE_UNSPECIFIED ? r.state() != v1::RANK_STATE_EXITED
                                               : r.state() == state;
  }));
}

std::string Ranks(int n, const std::string& what) {
  return n == 1 ? absl::StrCat("its rank", what, " ")
                : absl::StrCat("its ", n, " ranks", what, " ");
}

// How the ranks of a job just cancelled stop: the ones running after their step, writing its
// checkpoint, when the job has one to keep (v1::StopCheckpointGraceS); the ones still starting at
// once. A job whose last attempt had ended before (it was recovering): what is left of that
// attempt is still stopping. "" when no rank is left.
std::string StoppingNote(const v1::JobDetail& job) {
  const int left = LastAttemptRanks(job);
  if (left == 0) return "";
  if (job.attempts(job.attempts_size() - 1).state() != v1::ATTEMPT_STATE_CANCELLED) {
    return absl::StrCat(": ", left, left == 1 ? " rank" : " ranks",
                        " of its last attempt, which had ended, still stopping");
  }
  const int running = LastAttemptRanks(job, v1::RANK_STATE_RUNNING);
  const int starting = left - running;
  const double grace = v1::StopCheckpointGraceS(job.spec());
  std::vector<std::string> parts;
  if (running > 0 && grace > 0) {
    parts.push_back(absl::StrCat(
        Ranks(running, ""),
        running == 1 ? "stops after its step and writes" : "stop after their step and write",
        " its checkpoint (within checkpoint.stop_grace_s ", FormatMetric(grace), " s)"));
  } else if (running > 0) {
    parts.push_back(
        absl::StrCat(Ranks(running, ""), running == 1 ? "is" : "are", " being stopped"));
  }
  if (starting > 0) {
    parts.push_back(absl::StrCat(Ranks(starting, " still starting"), "stop",
                                 starting == 1 ? "s" : "", " at once"));
  }
  return absl::StrCat(": ", absl::StrJoin(parts, "; "));
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
absl::StatusOr<v1::JobDetail> WaitForRanks(const CommandContext& ctx, const std::string& job_id) {
  PollOutage outage(*ctx.clock, /*answered=*/true);  // (its cancel was answered)
  const double started = ctx.clock->MonotonicSeconds();
  bool drawn = false;
  const auto end_line = [&] {
    if (drawn) *ctx.err << "\n";
  };
  while (true) {
    absl::StatusOr<v1::JobDetail> polled = ctx.client->GetJob(job_id);
    if (!polled.ok() && !outage.Retry(polled.status())) {
      end_line();
      return polled.status();
    }
    if (polled.ok()) {
      outage.Answered();
      const int left = LastAttemptRanks(*polled);
      if (left == 0) {
        end_line();
        return polled;
      }
      if (ctx.err_tty) {
        *ctx.err << "\rjob " << job_id << ": waiting for " << left << " of "
                 << polled->attempts(polled->attempts_size() - 1).ranks_size() << " ranks to stop  "
                 << FormatDuration(ctx.clock->MonotonicSeconds() - started) << "   " << std::flush;
        drawn = true;
      }
    }
    ctx.sleep(ctx.poll_interval_s);
  }
}

}  // namespace

absl::StatusOr<int> RunCancel(const CommandContext& ctx, const std::vector<std::string>& job_ids,
                              const CancelOptions& options) {
  int exit_code = kExitOk;
  // With several jobs, one that fails is said on stderr and the others go on; one job: its error
  // is the command's.
  const auto failed = [&](const absl::Status& error, const std::string& what) {
    *ctx.err << "furnace: " << what << error.message() << "\n";
    if (exit_code == kExitOk) exit_code = ExitCodeForStatus(error);
  };
  v1::ListJobsResponse cancelled_jobs;        // --json with several jobs
  std::optional<v1::CancelJobResponse> only;  // --json with one
  std::vector<std::string> to_wait;
  // Every job is cancelled first: --wait waits for them all together.
  for (const std::string& job_id : job_ids) {
    absl::StatusOr<v1::CancelJobResponse> cancelled = ctx.client->CancelJob(job_id);
    // The controller refuses to cancel a job that already ended: not an RPC error (exit 6).
    absl::Status error = cancelled.status();
    if (absl::IsFailedPrecondition(error)) error = NotApplicable(error);
    if (!error.ok()) {
      if (job_ids.size() == 1) return error;
      failed(error, "");
      continue;
    }
    const v1::JobSummary& job = cancelled->job();
    const std::string id = job.job_id().empty() ? job_id : job.job_id();
    if (options.wait) to_wait.push_back(id);
    if (ctx.json) {
      if (job_ids.size() == 1) {
        only = *std::move(cancelled);
      } else {
        *cancelled_jobs.add_jobs() = job;
      }
      continue;
    }
    // How its ranks stop, from the job as it is now (a failed look only leaves that out: the
    // cancel is done).
    const absl::StatusOr<v1::JobDetail> detail = ctx.client->GetJob(id);
    *ctx.out << "job " << id << " is " << StateName(job.state())
             << (detail.ok() ? StoppingNote(*detail) : "") << "\n"
             << std::flush;
  }
  for (const std::string& id : to_wait) {
    const absl::StatusOr<v1::JobDetail> ended = WaitForRanks(ctx, id);
    if (!ended.ok()) {
      if (job_ids.size() == 1) return ended.status();
      failed(ended.status(), absl::StrCat("job ", id, ": waiting for its ranks: "));
      continue;
    }
    if (!ctx.json && !ended->attempts().empty()) {
      *ctx.out << "job " << id << ": how its ranks ended\n" << RankEnds(*ended) << std::flush;
    }
  }
  // --json: the cancels' answers, printed once the ranks are out with --wait.
  if (only) RETURN_IF_ERROR(PrintJson(*only, *ctx.out));
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
