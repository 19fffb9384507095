// `furnace report`: a training job's history as plots and a summary. The controller keeps one
// StepRecord per (attempt, step), aggregated over ranks (GetJobSeries); this file turns a JobDetail
// and its JobSeries into the report's files, with no I/O, so the rendering is testable with
// fixtures. A restarted job resumes from a checkpoint and so repeats steps: each attempt is drawn
// as its own line and the restart is marked by a vertical line where the new attempt starts.
//
// Files: loss.svg (with the entropy floor when the job reported one), tokens_per_second.svg,
// eval_loss.svg (held-out loss, when the job evaluated), mfu.svg, step_seconds.svg, memory.svg
// (activation peak, and the budget when it is > 0), imbalance_heatmap.svg (step x MoE layer) and
// summary.txt (with the job's goodput: where its time went, goodput_view.h).
#pragma once

#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "furnace/v1/controller.pb.h"

namespace furnace::cli {

struct ReportFile {
  std::string name;  // "loss.svg"
  std::string content;
};

// The numbers in summary.txt; a figure the series lacks stays nullopt and prints as "-".
struct ReportSummary {
  size_t records = 0;
  std::optional<double> final_loss, min_loss, min_loss_step, entropy_floor;
  // Held-out evaluations (eval.every): how many, the last one's loss, perplexity and step, and the
  // lowest loss with its step.
  size_t evals = 0;
  std::optional<double> final_eval_loss, final_eval_perplexity, final_eval_step, min_eval_loss,
      min_eval_step;
  std::optional<double> median_tokens_per_second, median_mfu, p10_mfu, median_step_seconds;
  std::optional<double> max_imbalance, max_imbalance_layer, max_imbalance_step;
  std::optional<double> peak_activation_bytes, memory_budget_bytes;
  size_t checkpoints = 0;  // steps with checkpoint_seconds > 0
  std::optional<double> median_checkpoint_seconds, max_checkpoint_seconds;
  // Per restart: seconds from the failed attempt's end to the next one's ranks all running.
  std::vector<std::pair<uint32_t, double>> recovery_seconds;  // (new attempt, seconds)
  // Per MoE layer, the schedule of the last step ("deepspeed", "s1", "s2").
  std::vector<std::string> moe_schedules;
  // Per MoE op ("a2a(ep)", ...), bytes over every step and rank of the series.
  std::map<std::string, double> moe_op_bytes;
};

// The q-quantile (0..1) by linear interpolation between order statistics; nullopt when empty.
std::optional<double> Quantile(std::vector<double> values, double q);

ReportSummary Summarize(const v1::JobDetail& job, const v1::JobSeries& series);
std::string RenderSummaryText(const v1::JobDetail& job, const v1::JobSeries& series,
                              const ReportSummary& summary);

// Every file of the report, summary.txt last.
std::vector<ReportFile> BuildReport(const v1::JobDetail& job, const v1::JobSeries& series);

}  // namespace furnace::cli
