#include "controller/cli/train_view.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "controller/cli/exit_codes.h"
#include "controller/cli/format.h"
#include "proto/furnace/v1/telemetry_labels.h"

namespace furnace::cli {
namespace {

// More experts than this and the routing table shows a summary per layer instead of a column each.
constexpr size_t kMaxExpertColumns = 16;

std::string Fixed4(double v) { return std::isfinite(v) ? absl::StrFormat("%.4f", v) : "-"; }
std::string Fixed2(double v) { return std::isfinite(v) ? absl::StrFormat("%.2f", v) : "-"; }
std::string Sig4(double v) { return std::isfinite(v) ? absl::StrFormat("%.4g", v) : "-"; }
std::string Lr(double v) { return std::isfinite(v) ? absl::StrFormat("%.2e", v) : "-"; }
std::string Count(double v) {
  return std::isfinite(v) ? FormatCount(static_cast<int64_t>(std::llround(v))) : "-";
}
// How far the loss is above the entropy floor, relative to the floor: "+16.7%".
std::string Gap(double loss, double floor) {
  return absl::StrFormat("%+.1f%%", (loss - floor) / floor * 100.0);
}
uint64_t Bytes(double v) { return std::isfinite(v) && v > 0 ? static_cast<uint64_t>(v) : 0; }

// "deepspeed" when every layer ran the same schedule, else "layer 0 deepspeed, layer 1 s1"; empty
// without MoE layers.
std::string FormatSchedule(const TrainMetrics& m) {
  std::vector<std::string> each;
  bool same = true;
  for (const auto& l : m.layers) {
    each.push_back(absl::StrCat("layer ", l.layer, " ", l.schedule));
    same = same && l.schedule == m.layers.front().schedule;
  }
  if (each.empty()) return "";
  return same ? m.layers.front().schedule : absl::StrJoin(each, ", ");
}

// The watch line's form, only where a layer runs one of Parm's schedules (the baseline deepspeed is
// the default and goes unsaid): "s2" when every layer runs the same, else the layers per schedule
// ("deepspeed x2, s1 x6").
std::string CompactSchedule(const TrainMetrics& m) {
  std::map<std::string, int> layers;
  for (const auto& l : m.layers) ++layers[l.schedule];
  if (layers.empty() || (layers.size() == 1 && layers.begin()->first == "deepspeed")) return "";
  if (layers.size() == 1) return layers.begin()->first;
  std::vector<std::string> each;
  for (const auto& [schedule, n] : layers) each.push_back(absl::StrCat(schedule, " x", n));
  return absl::StrJoin(each, ", ");
}

// The communication table (bytes, time and calls per operation and group), the MoE ops' table
// (bytes, time and calls per op) and the planner's bytes per action, each only when there is
// something to show.
std::string RenderCommAndPlanner(const TrainMetrics& m) {
  std::string out;
  if (!m.comm.empty()) {
    out += "\ncommunication (last step, rank 0)\n";
    Table table({"OP", "GROUP", "BYTES", "TIME", "CALLS"}, "  ");
    for (size_t c = 2; c <= 4; ++c) table.SetRightAligned(c);
    for (const CommRow& r : m.comm) {
      table.AddRow(
          {r.op, r.group, FormatBytes(Bytes(r.bytes)), FormatSeconds(r.seconds), Count(r.calls)});
    }
    out += table.Render();
  }
  if (!m.moe_ops.empty()) {
    out += "\nMoE ops (last step, rank 0)\n";
    Table table({"OP", "BYTES", "TIME", "CALLS"}, "  ");
    for (size_t c = 1; c <= 3; ++c) table.SetRightAligned(c);
    for (const MoeOpRow& r : m.moe_ops) {
      table.AddRow({r.op, FormatBytes(Bytes(r.bytes)), FormatSeconds(r.seconds), Count(r.calls)});
    }
    out += table.Render();
  }
  if (!m.planner.empty()) {
    out += "\nmemory planner (last step, rank 0)\n";
    Table table({"ACTION", "BYTES"}, "  ");
    table.SetRightAligned(1);
    for (const auto& [action, bytes] : m.planner) {
      table.AddRow({action, FormatBytes(Bytes(bytes))});
    }
    out += table.Render();
  }
  return out;
}

// "step 42: " when the figures are of another step than the progress beside them.
std::string FiguresStep(const TrainMetrics& m) {
  return m.step > 0 && m.step != m.progress_step ? absl::StrCat("step ", m.step, ": ") : "";
}

}  // namespace

TrainMetrics TrainMetricsOf(const v1::StepTelemetry& t) {
  TrainMetrics m;
  m.loss = t.loss();
  m.aux_loss = t.aux_loss();
  m.tokens = static_cast<double>(t.tokens());
  m.grad_norm = t.grad_norm();
  m.lr = t.lr();
  m.dropped_tokens = static_cast<double>(t.dropped_tokens());
  m.memory_budget_bytes = static_cast<double>(t.memory().budget_bytes());
  // Zero is "not known" for these: no time measured, no peak FLOPs for the device (MFU), no arena
  // tracking, no floor for the data, no checkpoint in the step, one process (sync, in flight).
  auto known = [](double v) { return v > 0 ? std::optional<double>(v) : std::nullopt; };
  m.tokens_per_second = known(t.tokens_per_second());
  m.step_seconds = known(t.step_seconds());
  m.forward_backward_seconds = known(t.forward_backward_seconds());
  m.optimizer_seconds = known(t.optimizer_seconds());
  m.sync_seconds = known(t.sync_seconds());
  m.checkpoint_seconds = known(t.checkpoint_seconds());
  m.mfu = known(t.mfu());
  m.model_flops = known(t.model_flops());
  m.activation_peak_bytes = known(static_cast<double>(t.memory().activation_peak_bytes()));
  m.pipeline_in_flight = known(static_cast<double>(t.memory().pipeline_in_flight()));
  m.entropy_floor = known(t.entropy_floor());
  m.planner_decisions = known(static_cast<double>(t.memory().planner_decisions()));
  m.emergency_offloads = known(static_cast<double>(t.memory().emergency_offloads()));
  m.late_reloads = known(static_cast<double>(t.memory().late_reloads()));
  m.agreed_drops = known(static_cast<double>(t.memory().agreed_drops()));
  m.routing_spike = t.routing_spike();
  if (t.has_eval()) {
    m.eval_loss = t.eval().loss();
    m.eval_perplexity = t.eval().perplexity();
    m.eval_step = t.eval().step();
  }
  m.schedule_reason = t.moe_schedule_reason();
  std::map<int, MoeLayerRouting> layers;
  for (const v1::MoeLayerTelemetry& l : t.moe_layers()) {
    MoeLayerRouting& routing = layers[static_cast<int>(l.layer())];
    routing.layer = static_cast<int>(l.layer());
    routing.imbalance = l.imbalance();
    routing.tokens_per_expert.assign(l.expert_tokens().begin(), l.expert_tokens().end());
    routing.schedule = v1::MoeLayerScheduleLabel(l.schedule());
    m.imbalance_max = std::max(m.imbalance_max.value_or(l.imbalance()), l.imbalance());
  }
  for (auto& [layer, routing] : layers) m.layers.push_back(std::move(routing));
  for (const v1::CommTelemetry& c : t.comm()) {
    m.comm.push_back({v1::CollectiveOpLabel(c.op()), v1::ParallelGroupLabel(c.group()),
                      static_cast<double>(c.bytes()), c.seconds(), static_cast<double>(c.calls())});
  }
  for (const v1::MoeOpTelemetry& o : t.moe_ops()) {
    m.moe_ops.push_back(
        {o.op(), static_cast<double>(o.bytes()), o.seconds(), static_cast<double>(o.calls())});
  }
  for (const v1::PlannerActionBytes& p : t.planner()) {
    m.planner.emplace_back(v1::PlannerActionLabel(p.action()), static_cast<double>(p.bytes()));
  }
  return m;
}

std::optional<TrainMetrics> TrainMetricsOf(const v1::JobDetail& job) {
  if (!job.has_telemetry()) return std::nullopt;
  TrainMetrics m = TrainMetricsOf(job.telemetry());
  m.step = job.telemetry_step();
  m.progress_step = job.summary().step();
  // The job's MFU over every rank where the controller has aggregated a step: the figure the
  // dashboard and furnace_job_mfu_ratio show (rank 0's own view until then).
  if (job.job_mfu() > 0) m.mfu = job.job_mfu();
  // Between attempts nothing trains: the failed attempt's rates would read as the job's now (its
  // last loss stays, labelled with its step).
  if (!IsFinalState(job.summary().state()) && job.summary().state() != v1::JOB_RUNNING) {
    m.tokens_per_second.reset();
    m.mfu.reset();
  }
  if (!m.eval_loss && job.has_last_eval()) {
    m.eval_loss = job.last_eval().loss();
    m.eval_perplexity = job.last_eval().perplexity();
    m.eval_step = job.last_eval().step();
  }
  return m;
}

std::string FormatEvalLoss(const TrainMetrics& m) {
  if (!m.eval_loss) return "-";
  return absl::StrCat(Fixed4(*m.eval_loss), "  (perplexity ", Fixed2(m.eval_perplexity.value_or(0)),
                      ", after step ", m.eval_step, ")");
}

std::string FormatLoss(const TrainMetrics& m) {
  if (!m.loss) return "-";
  std::string out = Fixed4(*m.loss);
  if (m.entropy_floor && *m.entropy_floor > 0) {
    absl::StrAppend(&out, "  (entropy floor ", Fixed4(*m.entropy_floor), ", gap ",
                    Gap(*m.loss, *m.entropy_floor), ")");
  }
  return out;
}

std::string FormatActivationMemory(const TrainMetrics& m) {
  if (!m.activation_peak_bytes) return "-";
  const uint64_t peak = Bytes(*m.activation_peak_bytes);
  const uint64_t budget = m.memory_budget_bytes ? Bytes(*m.memory_budget_bytes) : 0;
  if (budget == 0) return absl::StrCat(FormatBytes(peak), " (no budget)");
  return absl::StrCat(FormatBytes(peak), " of ", FormatBytes(budget), " (",
                      FormatPercent(static_cast<double>(peak) / static_cast<double>(budget)), ")");
}

std::string FormatImbalance(const TrainMetrics& m) {
  if (!m.imbalance_max) return "-";
  std::string out = Fixed2(*m.imbalance_max);
  std::vector<std::string> each;
  for (const auto& l : m.layers) {
    if (l.imbalance) each.push_back(absl::StrCat("layer ", l.layer, " ", Fixed2(*l.imbalance)));
  }
  if (!each.empty()) absl::StrAppend(&out, "  (", absl::StrJoin(each, ", "), ")");
  return out;
}

std::string FormatMfu(const TrainMetrics& m) {
  if (!m.mfu) return "-";
  return FormatPercent(*m.mfu, *m.mfu < 0.1 ? 2 : 1);
}

std::string RenderTrainSection(const v1::JobSummary& summary,
                               const std::optional<TrainMetrics>& metrics) {
  if (!metrics) return "";
  const TrainMetrics& m = *metrics;
  Table kv({"", ""}, "  ");
  std::string step = FormatProgress(summary.step(), summary.total_steps());
  if (m.step > 0 && m.step != summary.step()) {
    absl::StrAppend(&step, "  (the figures below: rank 0's step ", m.step, ")");
  }
  kv.AddRow({"step", step});
  if (m.loss) kv.AddRow({"loss", FormatLoss(m)});
  if (m.aux_loss) kv.AddRow({"aux loss", Fixed4(*m.aux_loss)});
  if (m.eval_loss) kv.AddRow({"eval loss", FormatEvalLoss(m)});
  if (m.tokens) kv.AddRow({"tokens/step", Count(*m.tokens)});
  if (m.tokens_per_second) kv.AddRow({"tokens/s", FormatRate(*m.tokens_per_second)});
  if (m.step_seconds) {
    std::string time = FormatSeconds(*m.step_seconds);
    std::vector<std::string> phases;
    if (m.forward_backward_seconds) {
      phases.push_back(absl::StrCat("fwd+bwd ", FormatSeconds(*m.forward_backward_seconds)));
    }
    if (m.sync_seconds) phases.push_back(absl::StrCat("sync ", FormatSeconds(*m.sync_seconds)));
    if (m.optimizer_seconds) {
      phases.push_back(absl::StrCat("optimizer ", FormatSeconds(*m.optimizer_seconds)));
    }
    if (!phases.empty()) absl::StrAppend(&time, "  (", absl::StrJoin(phases, ", "), ")");
    kv.AddRow({"step time", time});
  }
  if (m.mfu) kv.AddRow({"MFU", FormatMfu(m)});
  if (m.checkpoint_seconds && *m.checkpoint_seconds > 0) {
    kv.AddRow({"checkpoint",
               absl::StrFormat("%.0f ms (written after this step)", *m.checkpoint_seconds * 1e3)});
  }
  if (m.grad_norm) kv.AddRow({"grad norm", Sig4(*m.grad_norm)});
  if (m.lr) kv.AddRow({"lr", Lr(*m.lr)});
  if (m.activation_peak_bytes) kv.AddRow({"activations", FormatActivationMemory(m)});
  if (m.pipeline_in_flight) {
    kv.AddRow(
        {"in flight",
         absl::StrCat(Count(*m.pipeline_in_flight),
                      *m.pipeline_in_flight == 1 ? " micro-batch" : " micro-batches", " (peak)")});
  }
  if (m.imbalance_max) kv.AddRow({"imbalance", FormatImbalance(m)});
  if (const std::string schedule = FormatSchedule(m); !schedule.empty()) {
    kv.AddRow({"schedule", m.schedule_reason.empty()
                               ? schedule
                               : absl::StrCat(schedule, " (auto: ", m.schedule_reason, ")")});
  }
  if (m.dropped_tokens) kv.AddRow({"dropped", Count(*m.dropped_tokens)});
  std::string out = "\ntraining\n";
  const std::string rendered = kv.Render();
  out += rendered.substr(rendered.find('\n') + 1);  // drop the empty header row
  out += RenderCommAndPlanner(m);

  size_t experts = 0;
  for (const auto& l : m.layers) experts = std::max(experts, l.tokens_per_expert.size());
  if (experts == 0) return out;
  out += "\ntokens per expert (last step)\n";
  std::vector<std::string> headers = {"MOE LAYER", "IMBALANCE"};
  const bool each = experts <= kMaxExpertColumns;
  if (each) {
    for (size_t e = 0; e < experts; ++e) headers.push_back(absl::StrCat("E", e));
  } else {
    for (const char* h : {"MIN", "MEAN", "MAX", "BUSIEST"}) headers.push_back(h);
  }
  Table table(headers, "  ");
  for (size_t c = 0; c < headers.size(); ++c) table.SetRightAligned(c);
  for (const auto& l : m.layers) {
    std::vector<std::string> row = {absl::StrCat(l.layer),
                                    l.imbalance ? Fixed2(*l.imbalance) : "-"};
    const auto& t = l.tokens_per_expert;
    if (each) {
      for (size_t e = 0; e < experts; ++e) row.push_back(e < t.size() ? Count(t[e]) : "-");
    } else if (!t.empty()) {
      const auto [lo, hi] = std::minmax_element(t.begin(), t.end());
      double sum = 0;
      for (double v : t) sum += v;
      row.push_back(Count(*lo));
      row.push_back(Count(sum / static_cast<double>(t.size())));
      row.push_back(Count(*hi));
      row.push_back(absl::StrCat("E", hi - t.begin()));
    }
    table.AddRow(std::move(row));
  }
  out += table.Render();
  return out;
}

std::optional<double> EstimateEtaSeconds(const v1::JobSummary& summary,
                                         const std::optional<TrainMetrics>& m,
                                         double observed_steps_per_second) {
  if (summary.total_steps() == 0 || IsFinalState(summary.state())) return std::nullopt;
  double rate = 0;
  if (observed_steps_per_second > 0 && std::isfinite(observed_steps_per_second)) {
    rate = observed_steps_per_second;
  } else if (m && m->step_seconds && *m->step_seconds > 0 && std::isfinite(*m->step_seconds)) {
    rate = 1.0 / *m->step_seconds;
  } else {
    return std::nullopt;
  }
  const uint64_t left =
      summary.total_steps() > summary.step() ? summary.total_steps() - summary.step() : 0;
  return static_cast<double>(left) / rate;
}

std::vector<std::string> TrainWatchLines(const TrainMetrics& m) {
  std::string first = FiguresStep(m);
  auto add = [](std::string* line, const std::string& item) {
    if (!line->empty() && line->back() != ' ') *line += "  ";
    *line += item;
  };
  if (m.loss) {
    std::string loss = absl::StrCat("loss ", Fixed4(*m.loss));
    if (m.entropy_floor && *m.entropy_floor > 0) {
      absl::StrAppend(&loss, " (floor ", Fixed4(*m.entropy_floor), ", gap ",
                      Gap(*m.loss, *m.entropy_floor), ")");
    }
    add(&first, loss);
  }
  if (m.aux_loss) add(&first, absl::StrCat("aux ", Fixed4(*m.aux_loss)));
  if (m.eval_loss) {
    add(&first, absl::StrCat("eval ", Fixed4(*m.eval_loss), " (ppl ",
                             Fixed2(m.eval_perplexity.value_or(0)), ")"));
  }
  if (m.tokens_per_second) add(&first, absl::StrCat("tokens/s ", FormatRate(*m.tokens_per_second)));
  if (m.mfu) add(&first, absl::StrCat("MFU ", FormatMfu(m)));
  std::string second;
  if (m.imbalance_max) {
    add(&second, absl::StrCat("imbalance ", Fixed2(*m.imbalance_max),
                              m.routing_spike ? " (routing spike)" : ""));
  }
  if (const std::string schedule = CompactSchedule(m); !schedule.empty()) {
    add(&second, absl::StrCat("schedule ", schedule));
  }
  if (m.dropped_tokens) add(&second, absl::StrCat("dropped ", Count(*m.dropped_tokens)));
  if (m.activation_peak_bytes) add(&second, absl::StrCat("memory ", FormatActivationMemory(m)));
  // The adaptive planner's decisions, emergency offloads and agreed drops of the step on rank 0,
  // as the plain lines say them.
  if (m.planner_decisions) add(&second, absl::StrCat("planner ", Count(*m.planner_decisions), "x"));
  if (m.emergency_offloads) {
    add(&second, absl::StrCat("emergency offloads ", Count(*m.emergency_offloads)));
  }
  if (m.late_reloads) add(&second, absl::StrCat("late reloads ", Count(*m.late_reloads)));
  if (m.agreed_drops) add(&second, absl::StrCat("agreed drops ", Count(*m.agreed_drops)));
  std::vector<std::string> lines;
  if (!first.empty()) lines.push_back(first);
  if (!second.empty()) lines.push_back(second);
  return lines;
}

std::string TrainPlainSuffix(const TrainMetrics& m) {
  std::string out;
  if (const std::string step = FiguresStep(m); !step.empty()) {
    absl::StrAppend(&out, "  ", step.substr(0, step.size() - 1));  // "  step 42:"
  }
  if (m.loss) absl::StrAppend(&out, "  loss ", Fixed4(*m.loss));
  if (m.eval_loss) absl::StrAppend(&out, "  eval ", Fixed4(*m.eval_loss));
  if (m.tokens_per_second) absl::StrAppend(&out, "  tokens/s ", FormatRate(*m.tokens_per_second));
  if (m.mfu) absl::StrAppend(&out, "  MFU ", FormatMfu(m));
  if (m.routing_spike) absl::StrAppend(&out, "  spike");
  // Under a budget, the step's peak against it; the memory policy's actions of the step, when it
  // took any ("memory 4.9 MiB of 5.0 MiB (98%), offload 1.2 MiB"); the adaptive planner's
  // decisions, emergency offloads, late reloads and agreed drops on rank 0.
  std::string memory;
  if (m.activation_peak_bytes && m.memory_budget_bytes && *m.memory_budget_bytes > 0) {
    memory = FormatActivationMemory(m);
  }
  for (size_t i = 0; i < m.planner.size(); ++i) {
    absl::StrAppend(&memory,
                    memory.empty() ? ""
                    : i == 0       ? ", "
                                   : " ",
                    m.planner[i].first, " ", FormatBytes(Bytes(m.planner[i].second)));
  }
  if (!memory.empty()) absl::StrAppend(&out, "  memory ", memory);
  if (m.planner_decisions) absl::StrAppend(&out, "  planner ", Count(*m.planner_decisions), "x");
  if (m.emergency_offloads) {
    absl::StrAppend(&out, "  emergency offloads ", Count(*m.emergency_offloads));
  }
  if (m.late_reloads) absl::StrAppend(&out, "  late reloads ", Count(*m.late_reloads));
  if (m.agreed_drops) absl::StrAppend(&out, "  agreed drops ", Count(*m.agreed_drops));
  return out;
}

}  // namespace furnace::cli
