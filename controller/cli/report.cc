#include "controller/cli/report.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <functional>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "controller/cli/exit_codes.h"
#include "controller/cli/format.h"
#include "controller/cli/goodput_view.h"
#include "controller/cli/svg_plot.h"
#include "proto/furnace/v1/state_names.h"
#include "proto/furnace/v1/telemetry_labels.h"

namespace furnace::cli {
namespace {

constexpr std::array<const char*, 6> kAttemptColors = {"#1f77b4", "#d62728", "#2ca02c",
                                                       "#9467bd", "#ff7f0e", "#8c564b"};
constexpr double kMiB = 1048576.0;

using Field = std::function<double(const v1::StepRecord&)>;

// The attempts in the series, in order of first appearance.
std::vector<uint32_t> Attempts(const v1::JobSeries& series) {
  std::vector<uint32_t> out;
  for (const v1::StepRecord& r : series.steps()) {
    if (out.empty() || out.back() != r.attempt()) out.push_back(r.attempt());
  }
  return out;
}

// One line per attempt of `field` against the step; records where `field` is not finite are
// skipped. Named `name` with one attempt, "attempt N" with several.
std::vector<LineSeries> PerAttempt(const v1::JobSeries& series, const std::string& name,
                                   const Field& field) {
  const std::vector<uint32_t> attempts = Attempts(series);
  std::vector<LineSeries> out;
  for (const v1::StepRecord& r : series.steps()) {
    if (out.empty() || r.attempt() != attempts[out.size() - 1]) {
      LineSeries s;
      s.name = attempts.size() > 1 ? absl::StrCat("attempt ", r.attempt()) : name;
      s.color = kAttemptColors[out.size() % kAttemptColors.size()];
      out.push_back(std::move(s));
    }
    out.back().points.push_back({static_cast<double>(r.step()), field(r)});
  }
  return out;
}

// A vertical line where each attempt after the first starts.
std::vector<ReferenceLine> RestartMarkers(const v1::JobSeries& series) {
  std::vector<ReferenceLine> out;
  uint32_t previous = 0;
  bool first = true;
  for (const v1::StepRecord& r : series.steps()) {
    if (!first && r.attempt() != previous) {
      ReferenceLine l;
      l.label = absl::StrCat("restart: attempt ", r.attempt());
      l.value = static_cast<double>(r.step());
      l.color = "#7f7f7f";
      out.push_back(l);
    }
    previous = r.attempt();
    first = false;
  }
  return out;
}

std::string PlotTitle(const v1::JobDetail& job, const std::string& what) {
  const v1::JobSummary& s = job.summary();
  return absl::StrCat(what, " - ", s.name().empty() ? s.job_id() : s.name(), " (", s.job_id(), ")");
}

std::optional<double> EntropyFloor(const v1::JobDetail& job) {
  if (!job.has_telemetry() || !(job.telemetry().entropy_floor() > 0)) return std::nullopt;
  return job.telemetry().entropy_floor();
}

double Budget(const v1::JobSeries& series) {
  double budget = 0;
  for (const v1::StepRecord& r : series.steps()) budget = std::max(budget, r.memory_budget_bytes());
  return budget;
}

// A step's value, or NaN (no point drawn) where it is not known: zero for a time, a rate or MFU.
double Known(double v) { return v > 0 ? v : std::nan(""); }

std::string LinePlotFile(const v1::JobDetail& job, const v1::JobSeries& series,
                         const std::string& title, const std::string& y_label,
                         const std::string& name, const Field& field, bool y_from_zero,
                         std::vector<ReferenceLine> horizontal = {}) {
  LinePlot plot;
  plot.title = PlotTitle(job, title);
  plot.x_label = "step";
  plot.y_label = y_label;
  plot.series = PerAttempt(series, name, field);
  plot.horizontal = std::move(horizontal);
  plot.vertical = RestartMarkers(series);
  plot.y_from_zero = y_from_zero;
  return RenderLinePlot(plot);
}

std::string ImbalanceHeatmap(const v1::JobDetail& job, const v1::JobSeries& series) {
  constexpr uint64_t kMaxColumns = 300;
  Heatmap map;
  map.title = PlotTitle(job, "routing imbalance per MoE layer");
  map.x_label = "step";
  map.y_label = "MoE layer";
  map.value_label = "max/mean tokens";
  size_t layers = 0;
  uint64_t lo = UINT64_MAX, hi = 0;
  for (const v1::StepRecord& r : series.steps()) {
    layers = std::max(layers, static_cast<size_t>(r.imbalance_size()));
    lo = std::min(lo, r.step());
    hi = std::max(hi, r.step());
  }
  if (layers == 0 || lo > hi) return RenderHeatmap(map);
  // Step s occupies (s - 1, s]; columns are bins of whole steps, each showing its worst value.
  const uint64_t first = lo > 0 ? lo - 1 : 0;
  hi = std::max(hi, first + 1);
  const uint64_t span = hi - first;
  const uint64_t width = (span + kMaxColumns - 1) / kMaxColumns;
  const uint64_t cols = (span + width - 1) / width;
  for (uint64_t c = 0; c <= cols; ++c) {
    map.x_edges.push_back(static_cast<double>(std::min(first + c * width, hi)));
  }
  map.values.assign(layers, std::vector<double>(cols, std::nan("")));
  for (const v1::StepRecord& r : series.steps()) {
    const uint64_t c = std::min(cols - 1, r.step() > first ? (r.step() - 1 - first) / width : 0);
    for (int l = 0; l < r.imbalance_size(); ++l) {
      double& cell = map.values[l][c];
      if (std::isnan(cell) || r.imbalance(l) > cell) cell = r.imbalance(l);
    }
  }
  for (size_t l = 0; l < layers; ++l) map.row_labels.push_back(absl::StrCat(l));
  map.vertical = RestartMarkers(series);
  for (ReferenceLine& l : map.vertical) l.color = "#ffffff";  // readable on the dark scale
  return RenderHeatmap(map);
}

std::string Opt(const std::optional<double>& v, const std::function<std::string(double)>& f) {
  return v ? f(*v) : "-";
}

}  // namespace

std::optional<double> Quantile(std::vector<double> values, double q) {
  std::erase_if(values, [](double v) { return !std::isfinite(v); });
  if (values.empty()) return std::nullopt;
  std::sort(values.begin(), values.end());
  const double pos = std::clamp(q, 0.0, 1.0) * static_cast<double>(values.size() - 1);
  const size_t i = static_cast<size_t>(pos);
  if (i + 1 >= values.size()) return values.back();
  return values[i] + (pos - static_cast<double>(i)) * (values[i + 1] - values[i]);
}

ReportSummary Summarize(const v1::JobDetail& job, const v1::JobSeries& series) {
  ReportSummary s;
  s.records = static_cast<size_t>(series.steps_size());
  s.entropy_floor = EntropyFloor(job);
  std::vector<double> tps, mfu, step_s, ckpt;
  for (const v1::StepRecord& r : series.steps()) {
    s.final_loss = r.loss();
    if (!s.min_loss || r.loss() < *s.min_loss) {
      s.min_loss = r.loss();
      s.min_loss_step = static_cast<double>(r.step());
    }
    if (r.has_eval()) {
      ++s.evals;
      s.final_eval_loss = r.eval().loss();
      s.final_eval_perplexity = r.eval().perplexity();
      s.final_eval_step = static_cast<double>(r.step());
      if (!s.min_eval_loss || r.eval().loss() < *s.min_eval_loss) {
        s.min_eval_loss = r.eval().loss();
        s.min_eval_step = static_cast<double>(r.step());
      }
    }
    // Zero is "not known" (no time measured; no peak FLOPs for a CPU or emulated device), not a
    // value: it must not pull a median down or show as 0% MFU where `status` shows "-".
    if (r.tokens_per_second() > 0) tps.push_back(r.tokens_per_second());
    if (r.mfu() > 0) mfu.push_back(r.mfu());
    if (r.step_seconds() > 0) step_s.push_back(r.step_seconds());
    for (int l = 0; l < r.imbalance_size(); ++l) {
      if (!s.max_imbalance || r.imbalance(l) > *s.max_imbalance) {
        s.max_imbalance = r.imbalance(l);
        s.max_imbalance_layer = l;
        s.max_imbalance_step = static_cast<double>(r.step());
      }
    }
    if (r.activation_peak_bytes() > 0 &&
        (!s.peak_activation_bytes || r.activation_peak_bytes() > *s.peak_activation_bytes)) {
      s.peak_activation_bytes = r.activation_peak_bytes();
    }
    if (r.checkpoint_seconds() > 0) ckpt.push_back(r.checkpoint_seconds());
    for (const v1::MoeOpTelemetry& o : r.moe_ops()) {
      s.moe_op_bytes[o.op()] += static_cast<double>(o.bytes());
    }
  }
  if (!series.steps().empty()) {
    for (int schedule : series.steps().rbegin()->moe_schedules()) {
      s.moe_schedules.push_back(
          v1::MoeLayerScheduleLabel(static_cast<v1::MoeLayerSchedule>(schedule)));
    }
  }
  s.median_tokens_per_second = Quantile(tps, 0.5);
  s.median_mfu = Quantile(mfu, 0.5);
  s.p10_mfu = Quantile(mfu, 0.1);
  s.median_step_seconds = Quantile(step_s, 0.5);
  if (const double budget = Budget(series); budget > 0) s.memory_budget_bytes = budget;
  s.checkpoints = ckpt.size();
  s.median_checkpoint_seconds = Quantile(ckpt, 0.5);
  if (!ckpt.empty()) s.max_checkpoint_seconds = *std::max_element(ckpt.begin(), ckpt.end());
  for (int i = 1; i < job.attempts_size(); ++i) {
    const v1::AttemptInfo& before = job.attempts(i - 1);
    const v1::AttemptInfo& after = job.attempts(i);
    if (before.ended_unix() > 0 && after.all_running_unix() > 0) {
      s.recovery_seconds.emplace_back(after.attempt(),
                                      after.all_running_unix() - before.ended_unix());
    }
  }
  return s;
}

std::string RenderSummaryText(const v1::JobDetail& job, const v1::JobSeries& series,
                              const ReportSummary& m) {
  const v1::JobSummary& s = job.summary();
  std::vector<std::pair<std::string, std::string>> rows;
  const auto metric4 = [](double v) { return absl::StrFormat("%.4f", v); };
  const auto pct = [](double v) { return absl::StrFormat("%.2f%%", v * 100); };
  rows.emplace_back("job", absl::StrCat(s.job_id(), s.name().empty() ? "" : "  ", s.name(),
                                        s.kind().empty() ? "" : absl::StrCat(" (", s.kind(), ")")));
  rows.emplace_back("state", absl::StrCat(StateName(s.state()),
                                          s.cause().empty() ? "" : absl::StrCat(": ", s.cause())));
  rows.emplace_back("attempts", absl::StrCat(job.attempts_size(), " (", s.restarts(),
                                             s.restarts() == 1 ? " restart)" : " restarts)"));
  for (const v1::AttemptInfo& a : job.attempts()) {
    std::string line = absl::StrCat("attempt ", a.attempt(), ": ", v1::StateWord(a.state()));
    if (!a.cause().empty()) absl::StrAppend(&line, ", ", a.cause());
    if (!a.failure_kind().empty()) absl::StrAppend(&line, " [", a.failure_kind(), "]");
    // Shown when an out-of-memory exit escalated it away from what the spec asked for.
    if (!a.memory_policy().empty() && a.memory_policy() != job.spec().memory().policy()) {
      absl::StrAppend(&line, " (memory.policy ", a.memory_policy(), ")");
    }
    rows.emplace_back("", line);
  }
  rows.emplace_back("steps", absl::StrCat(FormatProgress(s.step(), s.total_steps()), "  (",
                                          m.records, " step records)"));
  std::string loss =
      absl::StrCat("final ", Opt(m.final_loss, metric4), "  min ", Opt(m.min_loss, metric4));
  if (m.min_loss_step)
    absl::StrAppend(&loss, " (step ", static_cast<uint64_t>(*m.min_loss_step), ")");
  rows.emplace_back("loss", loss);
  if (m.entropy_floor) {
    std::string floor = absl::StrCat("entropy floor ", metric4(*m.entropy_floor));
    if (m.final_loss) {
      absl::StrAppend(
          &floor, "  gap ", absl::StrFormat("%+.4f", *m.final_loss - *m.entropy_floor), " (",
          absl::StrFormat("%+.1f%%", (*m.final_loss / *m.entropy_floor - 1) * 100), ")");
    }
    rows.emplace_back("", floor);
  }
  if (m.evals > 0) {
    rows.emplace_back(
        "eval loss",
        absl::StrFormat("final %.4f (perplexity %.2f, step %d)  min %.4f (step %d)  %d evaluations",
                        *m.final_eval_loss, *m.final_eval_perplexity,
                        static_cast<uint64_t>(*m.final_eval_step), *m.min_eval_loss,
                        static_cast<uint64_t>(*m.min_eval_step), m.evals));
  }
  rows.emplace_back("tokens/s",
                    absl::StrCat("median ", Opt(m.median_tokens_per_second,
                                                [](double v) { return FormatRate(v); })));
  rows.emplace_back("MFU",
                    absl::StrCat("median ", Opt(m.median_mfu, pct), "  p10 ", Opt(m.p10_mfu, pct)));
  rows.emplace_back("step time", absl::StrCat("median ", Opt(m.median_step_seconds, [](double v) {
                                                return FormatSeconds(v);
                                              })));
  std::string imbalance = Opt(m.max_imbalance, [](double v) { return absl::StrFormat("%.3f", v); });
  if (m.max_imbalance) {
    absl::StrAppend(&imbalance, " max (layer ", static_cast<int>(*m.max_imbalance_layer), ", step ",
                    static_cast<uint64_t>(*m.max_imbalance_step), ")");
  }
  rows.emplace_back("imbalance", imbalance);
  if (!m.moe_schedules.empty()) {
    // One word when every MoE layer ran the same schedule, else each layer's.
    const bool same = std::all_of(m.moe_schedules.begin(), m.moe_schedules.end(),
                                  [&](const std::string& x) { return x == m.moe_schedules[0]; });
    std::string schedule = m.moe_schedules[0];
    if (!same) {
      schedule.clear();
      for (size_t l = 0; l < m.moe_schedules.size(); ++l) {
        absl::StrAppend(&schedule, l == 0 ? "" : ", ", "layer ", l, " ", m.moe_schedules[l]);
      }
    }
    absl::StrAppend(&schedule, " (last step");
    const std::string& asked = job.spec().moe().schedule();
    if (asked == "auto") absl::StrAppend(&schedule, "; moe.schedule auto");
    rows.emplace_back("schedule", absl::StrCat(schedule, ")"));
  }
  for (const auto& [op, bytes] : m.moe_op_bytes) {
    rows.emplace_back(
        &op == &m.moe_op_bytes.begin()->first ? "MoE ops" : "",
        absl::StrCat(op, " ", FormatBytes(static_cast<uint64_t>(bytes)), " (all steps and ranks)"));
  }
  std::string memory = Opt(m.peak_activation_bytes, [](double v) {
    return absl::StrCat(FormatBytes(static_cast<uint64_t>(v)), " activation peak");
  });
  if (m.peak_activation_bytes) {
    if (m.memory_budget_bytes) {
      absl::StrAppend(&memory, " of ", FormatBytes(static_cast<uint64_t>(*m.memory_budget_bytes)),
                      " budget (", FormatPercent(*m.peak_activation_bytes / *m.memory_budget_bytes),
                      ")");
    } else {
      absl::StrAppend(&memory, " (no budget)");
    }
  }
  rows.emplace_back("memory", memory);
  if (m.checkpoints > 0) {
    rows.emplace_back(
        "checkpoints",
        absl::StrCat(m.checkpoints, ", median ", FormatSeconds(*m.median_checkpoint_seconds),
                     ", max ", FormatSeconds(*m.max_checkpoint_seconds)));
  }
  for (const auto& [attempt, seconds] : m.recovery_seconds) {
    rows.emplace_back("recovery",
                      absl::StrCat("attempt ", attempt, " running ", FormatSeconds(seconds),
                                   " after the previous attempt ended"));
  }
  if (HasGoodput(job)) {
    for (auto& row : GoodputRows(job.goodput())) rows.push_back(std::move(row));
  }
  rows.emplace_back("telemetry", absl::StrCat(series.telemetry_dropped(),
                                              " records dropped by agents (all jobs)"));
  size_t width = 0;
  for (const auto& [key, value] : rows) width = std::max(width, key.size());
  std::string out;
  for (const auto& [key, value] : rows) {
    absl::StrAppend(&out, key, std::string(width + 2 - key.size(), ' '), value, "\n");
  }
  return out;
}

std::vector<ReportFile> BuildReport(const v1::JobDetail& job, const v1::JobSeries& series) {
  std::vector<ReportFile> files;
  std::vector<ReferenceLine> floor;
  if (const auto h = EntropyFloor(job)) {
    ReferenceLine l;
    l.label = absl::StrFormat("entropy floor %.4f", *h);
    l.value = *h;
    l.color = "#2ca02c";
    floor.push_back(l);
  }
  files.push_back(
      {"loss.svg", LinePlotFile(
                       job, series, "training loss", "loss (nats/token)", "loss",
                       [](const v1::StepRecord& r) { return r.loss(); }, false, floor)});
  v1::JobSeries evaluated;  // the steps after which the held-out loss was computed
  for (const v1::StepRecord& r : series.steps()) {
    if (r.has_eval()) *evaluated.add_steps() = r;
  }
  if (evaluated.steps_size() > 0) {
    files.push_back(
        {"eval_loss.svg",
         LinePlotFile(
             job, evaluated, "held-out loss (eval.every)", "loss (nats/token)", "held-out loss",
             [](const v1::StepRecord& r) { return r.eval().loss(); }, false, floor)});
  }
  files.push_back(
      {"tokens_per_second.svg",
       LinePlotFile(
           job, series, "throughput", "tokens/s (all ranks)", "tokens/s",
           [](const v1::StepRecord& r) { return Known(r.tokens_per_second()); }, true)});
  files.push_back(
      {"mfu.svg", LinePlotFile(
                      job, series, "model FLOPs utilisation", "MFU (%)", "MFU",
                      [](const v1::StepRecord& r) { return Known(r.mfu()) * 100; }, true)});
  files.push_back(
      {"step_seconds.svg",
       LinePlotFile(
           job, series, "step time (slowest rank)", "step time (ms)", "step time",
           [](const v1::StepRecord& r) { return Known(r.step_seconds()) * 1e3; }, true)});
  std::vector<ReferenceLine> budget;
  if (const double b = Budget(series); b > 0) {
    ReferenceLine l;
    l.label = absl::StrCat("budget ", FormatBytes(static_cast<uint64_t>(b)));
    l.value = b / kMiB;
    l.color = "#000000";
    budget.push_back(l);
  }
  files.push_back(
      {"memory.svg", LinePlotFile(
                         job, series, "activation memory peak (max over ranks)",
                         "activation peak (MiB)", "activation peak",
                         [](const v1::StepRecord& r) { return r.activation_peak_bytes() / kMiB; },
                         true, budget)});
  files.push_back({"imbalance_heatmap.svg", ImbalanceHeatmap(job, series)});
  files.push_back({"summary.txt", RenderSummaryText(job, series, Summarize(job, series))});
  return files;
}

}  // namespace furnace::cli
