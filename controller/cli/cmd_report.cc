// furnace report JOB -o DIR: the job and its whole step series from the controller, rendered by
// report.h into plots and a summary in DIR. The controller keeps the series; the CLI only draws it.
#include <filesystem>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "controller/cli/commands.h"
#include "controller/cli/exit_codes.h"
#include "controller/cli/goodput_view.h"
#include "controller/cli/report.h"
#include "google/protobuf/struct.pb.h"
#include "runtime/base/status.h"
#include "runtime/checkpoint/durable_file.h"

namespace furnace::cli {
namespace {

namespace fs = std::filesystem;

constexpr uint32_t kReportPageSteps = 5000;  // steps a GetJobSeries page asks for

// Atomically (a temporary file renamed over `path`): a crash or a full disk leaves the previous
// report's file whole, never a truncated one.
absl::Status WriteFile(const fs::path& path, const std::string& content) {
  if (absl::Status written = train::WriteFileDurably(path.string(), content); !written.ok()) {
    return LocalError(written);
  }
  return absl::OkStatus();
}

void SetNumber(google::protobuf::Struct* s, const std::string& key,
               const std::optional<double>& value) {
  if (value) (*s->mutable_fields())[key].set_number_value(*value);
}

google::protobuf::Struct SummaryJson(const ReportSummary& m, const v1::JobSeries& series) {
  google::protobuf::Struct s;
  SetNumber(&s, "records", static_cast<double>(m.records));
  SetNumber(&s, "final_loss", m.final_loss);
  SetNumber(&s, "min_loss", m.min_loss);
  SetNumber(&s, "entropy_floor", m.entropy_floor);
  SetNumber(&s, "final_eval_loss", m.final_eval_loss);
  SetNumber(&s, "final_eval_perplexity", m.final_eval_perplexity);
  SetNumber(&s, "min_eval_loss", m.min_eval_loss);
  SetNumber(&s, "median_tokens_per_second", m.median_tokens_per_second);
  SetNumber(&s, "median_mfu", m.median_mfu);
  SetNumber(&s, "p10_mfu", m.p10_mfu);
  SetNumber(&s, "median_step_seconds", m.median_step_seconds);
  SetNumber(&s, "max_imbalance", m.max_imbalance);
  SetNumber(&s, "peak_activation_bytes", m.peak_activation_bytes);
  SetNumber(&s, "memory_budget_bytes", m.memory_budget_bytes);
  SetNumber(&s, "checkpoints", static_cast<double>(m.checkpoints));
  SetNumber(&s, "median_checkpoint_seconds", m.median_checkpoint_seconds);
  SetNumber(&s, "telemetry_dropped", static_cast<double>(series.telemetry_dropped()));
  if (!m.moe_schedules.empty()) {
    google::protobuf::ListValue* schedules =
        (*s.mutable_fields())["moe_schedules"].mutable_list_value();
    for (const std::string& schedule : m.moe_schedules) {
      schedules->add_values()->set_string_value(schedule);
    }
  }
  if (!m.moe_op_bytes.empty()) {
    google::protobuf::Struct* ops = (*s.mutable_fields())["moe_op_bytes"].mutable_struct_value();
    for (const auto& [op, bytes] : m.moe_op_bytes)
      (*ops->mutable_fields())[op].set_number_value(bytes);
  }
  return s;
}

// The job's goodput (JobGoodput), in seconds and steps.
google::protobuf::Struct GoodputJson(const v1::JobGoodput& g) {
  google::protobuf::Struct s;
  SetNumber(&s, "ratio", g.ratio());
  SetNumber(&s, "productive_seconds", g.productive_seconds());
  SetNumber(&s, "productive_steps", static_cast<double>(g.productive_steps()));
  google::protobuf::Struct* lost = (*s.mutable_fields())["lost_seconds"].mutable_struct_value();
  SetNumber(lost, "restart", g.restart_seconds());
  SetNumber(lost, "redone", g.redone_seconds());
  SetNumber(lost, "checkpoint_stall", g.checkpoint_stall_seconds());
  SetNumber(lost, "startup", g.startup_seconds());
  SetNumber(&s, "redone_steps", static_cast<double>(g.redone_steps()));
  SetNumber(&s, "failures", g.failures());
  SetNumber(&s, "mtbf_seconds", g.mtbf_seconds());
  if (g.checkpoint_interval_steps() > 0) {
    SetNumber(&s, "checkpoint_interval_steps", g.checkpoint_interval_steps());
  }
  return s;
}

}  // namespace

absl::StatusOr<int> RunReport(const CommandContext& ctx, const std::string& job_id,
                              const ReportOptions& options) {
  if (options.output.empty()) return absl::InvalidArgumentError("report: pass -o DIR");
  ASSIGN_OR_RETURN(const v1::JobDetail job, ctx.client->GetJob(job_id));
  // Every step (the plots are only as honest as their points), a page at a time: a long job's
  // whole series in one reply can pass protobuf's 2 GiB limit.
  v1::JobSeries series;
  v1::GetJobSeriesRequest request;
  request.set_job_id(job_id);
  request.set_page_size(kReportPageSteps);
  while (true) {
    ASSIGN_OR_RETURN(v1::JobSeries page, ctx.client->GetJobSeries(request));
    series.set_job_id(page.job_id());
    series.set_telemetry_dropped(page.telemetry_dropped());
    for (v1::StepRecord& step : *page.mutable_steps()) *series.add_steps() = std::move(step);
    if (!page.more() || page.steps_size() == 0) break;
    request.set_after_attempt(series.steps(series.steps_size() - 1).attempt());
    request.set_after_step(series.steps(series.steps_size() - 1).step());
  }

  const fs::path dir(options.output);
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec || !fs::is_directory(dir)) {
    return LocalError(absl::PermissionDeniedError(
        absl::StrCat("cannot create the report directory ", dir.string(), ": ", ec.message())));
  }
  const std::vector<ReportFile> files = BuildReport(job, series);
  std::vector<std::string> written;
  for (const ReportFile& f : files) {
    RETURN_IF_ERROR(WriteFile(dir / f.name, f.content));
    written.push_back((dir / f.name).string());
  }

  if (ctx.json) {
    google::protobuf::Struct out;
    auto& fields = *out.mutable_fields();
    fields["job_id"].set_string_value(job.summary().job_id());
    fields["dir"].set_string_value(dir.string());
    for (const std::string& path : written) {
      fields["files"].mutable_list_value()->add_values()->set_string_value(path);
    }
    google::protobuf::Struct summary = SummaryJson(Summarize(job, series), series);
    if (HasGoodput(job)) {
      *(*summary.mutable_fields())["goodput"].mutable_struct_value() = GoodputJson(job.goodput());
    }
    *fields["summary"].mutable_struct_value() = std::move(summary);
    RETURN_IF_ERROR(PrintJson(out, *ctx.out));
  } else {
    *ctx.out << "report for " << job.summary().job_id() << " (" << series.steps_size()
             << " step records) in " << dir.string() << ":\n";
    if (series.steps_size() == 0) {
      // The files are written all the same (the summary has the job and its attempts), but the
      // plots are empty: said, not left for the reader to wonder at.
      *ctx.err << "furnace: job " << job.summary().job_id()
               << " has no step records yet (no step of it has been reported by every rank): "
                  "the plots are empty\n";
    }
    for (const ReportFile& f : files) *ctx.out << "  " << f.name << "\n";
    *ctx.out << "\n" << files.back().content;  // summary.txt
  }
  return kExitOk;
}

}  // namespace furnace::cli
