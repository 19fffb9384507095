#include "controller/service/telemetry_aggregator.h"

#include <algorithm>
#include <limits>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "proto/furnace/v1/telemetry_labels.h"
#include "runtime/base/log_text.h"
#include "runtime/base/status.h"
#include "spdlog/spdlog.h"

namespace furnace::controller {

namespace v1 = furnace::v1;

TelemetryAggregator::TelemetryAggregator(JobStore& store) : store_(store) {}

void TelemetryAggregator::NoteBatch(const v1::TelemetryBatch& batch) {
  if (batch.dropped() > 0) {
    telemetry_dropped_ += batch.dropped();
    spdlog::warn("worker {} dropped {} telemetry records (controller too slow or away)",
                 EscapeForLog(batch.worker_id()), batch.dropped());
  }
  telemetry_records_ += batch.records_size();
}

bool TelemetryAggregator::Accumulate(const std::string& job_id, uint32_t world_size,
                                     const v1::TelemetryRecord& rec, size_t max_pending) {
  JobSteps& job = jobs_[job_id];
  auto key = std::make_pair(rec.attempt(), rec.step());
  if (job.has_step && key <= std::make_pair(job.last_step.attempt(), job.last_step.step())) {
    return false;  // already aggregated (a straggler or a re-sent batch)
  }
  if (rec.rank() >= world_size) return false;  // not a rank of this attempt
  PendingStep& p = job.pending_steps[key];
  if (p.seen.size() < world_size) p.seen.resize(world_size, false);
  if (p.seen[rec.rank()]) return false;  // this rank's record of the step came again
  p.seen[rec.rank()] = true;
  const v1::StepTelemetry& t = rec.train();
  // Every rank reports an uncommitted checkpoint alike: rank 0's counts it.
  if (rec.rank() == 0 && !t.checkpoint_error().empty()) ++job.checkpoint_failures;
  // Every rank computes the same held-out loss: rank 0's is the step's.
  if (rec.rank() == 0 && t.has_eval()) *p.record.mutable_eval() = t.eval();
  v1::StepRecord& r = p.record;
  r.set_attempt(rec.attempt());
  r.set_step(rec.step());
  r.set_unix_time(std::max(r.unix_time(), rec.unix_time()));
  p.loss_sum += t.loss();
  p.aux_sum += t.aux_loss();
  ++p.loss_n;
  p.mfu_sum += t.mfu();
  p.model_flops = std::max(p.model_flops, t.model_flops());  // the same on every rank
  p.peak_sum += t.peak_flops();
  p.peaks_known = p.peaks_known && t.peak_flops() > 0;
  p.grad_norm_sum += t.grad_norm();
  r.set_tokens(r.tokens() + static_cast<double>(t.tokens()));
  r.set_step_seconds(std::max(r.step_seconds(), t.step_seconds()));
  r.set_activation_peak_bytes(
      std::max(r.activation_peak_bytes(), static_cast<double>(t.memory().activation_peak_bytes())));
  r.set_memory_budget_bytes(static_cast<double>(t.memory().budget_bytes()));
  r.set_predicted_peak_bytes(
      std::max(r.predicted_peak_bytes(), static_cast<double>(t.memory().predicted_peak_bytes())));
  r.set_planner_seconds(std::max(r.planner_seconds(), t.memory().planner_seconds()));
  r.set_planner_decisions(r.planner_decisions() + t.memory().planner_decisions());
  r.set_emergency_offloads(r.emergency_offloads() + t.memory().emergency_offloads());
  r.set_late_reloads(r.late_reloads() + t.memory().late_reloads());
  r.set_agreements(std::max(r.agreements(), t.memory().agreements()));
  r.set_agreed_drops(r.agreed_drops() + t.memory().agreed_drops());
  r.set_agreement_seconds(std::max(r.agreement_seconds(), t.memory().agreement_seconds()));
  r.set_checkpoint_seconds(std::max(r.checkpoint_seconds(), t.checkpoint_seconds()));
  r.set_checkpoint_stall_seconds(
      std::max(r.checkpoint_stall_seconds(), t.checkpoint_stall_seconds()));
  // checkpoint.every auto: every rank agreed on the interval; the largest is the safe reading.
  if (t.checkpoint_interval_steps() > r.checkpoint_interval_steps()) {
    r.set_checkpoint_interval_steps(t.checkpoint_interval_steps());
    r.set_checkpoint_interval_seconds(t.checkpoint_interval_seconds());
  }
  r.set_lr(t.lr());
  r.set_routing_spike(r.routing_spike() || t.routing_spike());
  for (const v1::MoeLayerTelemetry& layer : t.moe_layers()) {
    constexpr uint32_t kMaxLayers = 4096, kMaxExperts = 65536;  // a bound against a bad record
    if (layer.layer() >= kMaxLayers) continue;
    // Every rank of a layer runs its schedule; the first rank that names one says it.
    if (p.schedules.size() <= layer.layer()) p.schedules.resize(layer.layer() + 1);
    if (p.schedules[layer.layer()] == v1::MOE_LAYER_SCHEDULE_UNSPECIFIED) {
      p.schedules[layer.layer()] = layer.schedule();
    }
    if (layer.expert_tokens_size() > static_cast<int>(kMaxExperts)) continue;
    if (p.expert_tokens.size() <= layer.layer()) p.expert_tokens.resize(layer.layer() + 1);
    std::vector<double>& sum = p.expert_tokens[layer.layer()];
    if (sum.size() < static_cast<size_t>(layer.expert_tokens_size())) {
      sum.resize(layer.expert_tokens_size());
    }
    for (int e = 0; e < layer.expert_tokens_size(); ++e) {
      sum[e] += static_cast<double>(layer.expert_tokens(e));
    }
  }
  for (const v1::PlannerActionBytes& a : t.planner()) p.planner[a.action()] += a.bytes();
  for (const v1::CommTelemetry& c : t.comm()) {
    v1::CommTelemetry& sum = p.comm[{c.op(), c.group()}];
    sum.set_op(c.op());
    sum.set_group(c.group());
    sum.set_bytes(sum.bytes() + c.bytes());
    sum.set_seconds(sum.seconds() + c.seconds());
    sum.set_calls(sum.calls() + c.calls());
  }
  for (const v1::MoeOpTelemetry& o : t.moe_ops()) {
    constexpr size_t kMaxMoeOps = 256;  // a bound against a bad record (the schedules have ~10)
    if (p.moe_ops.size() >= kMaxMoeOps && p.moe_ops.count(o.op()) == 0) continue;
    v1::MoeOpTelemetry& sum = p.moe_ops[o.op()];
    sum.set_op(o.op());
    sum.set_bytes(sum.bytes() + o.bytes());
    sum.set_seconds(sum.seconds() + o.seconds());
    sum.set_calls(sum.calls() + o.calls());
  }
  ++p.ranks;
  if (p.ranks >= world_size) {
    // Older steps still pending will not complete: a rank's record was dropped under
    // back-pressure, or its agent went away while the rank trained on and the attempt ended. They
    // were trained all the same: stored with the ranks that reported them, in order, before this.
    const auto older = job.pending_steps.lower_bound(key);
    for (auto it = job.pending_steps.begin(); it != older; ++it) {
      FinishStep(job_id, it->second);
    }
    FinishStep(job_id, p);
    job.pending_steps.erase(job.pending_steps.begin(), job.pending_steps.upper_bound(key));
    return true;
  }
  if (job.pending_steps.size() > max_pending) {
    // The oldest never completes (the bound): stored with the ranks it has.
    FinishStep(job_id, job.pending_steps.begin()->second);
    job.pending_steps.erase(job.pending_steps.begin());
    return true;
  }
  return false;
}

std::vector<std::string> TelemetryAggregator::JobsWithPendingSteps() const {
  std::vector<std::string> out;
  for (const auto& [id, job] : jobs_) {
    if (!job.pending_steps.empty()) out.push_back(id);
  }
  return out;
}

bool TelemetryAggregator::StoreUnfinished(const std::string& job_id, uint32_t below_attempt) {
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return false;
  auto& pending = it->second.pending_steps;
  const auto end = pending.lower_bound(std::make_pair(below_attempt, uint64_t{0}));
  if (pending.begin() == end) return false;
  for (auto p = pending.begin(); p != end; ++p) FinishStep(job_id, p->second);
  pending.erase(pending.begin(), end);
  return true;
}

void TelemetryAggregator::FinishStep(const std::string& job_id, PendingStep& p) {
  v1::StepRecord& r = p.record;
  r.set_ranks(p.ranks);
  if (p.loss_n > 0) {
    r.set_loss(p.loss_sum / p.loss_n);
    r.set_aux_loss(p.aux_sum / p.loss_n);
  }
  // Model FLOPs / (step seconds x the peak of all devices): the slowest rank's step over every
  // rank's own peak. (The mean of the ranks' own MFUs weighs each by its own step time and peak.)
  // A step some ranks never reported counts theirs at the mean of the others'; records without
  // their peak (an older worker) leave the mean of the ranks' own MFUs.
  const double world = static_cast<double>(std::max<size_t>(p.seen.size(), p.ranks));
  const double peak = p.peaks_known && p.ranks > 0 ? p.peak_sum / p.ranks * world : 0;
  r.set_mfu(peak > 0 && r.step_seconds() > 0 ? p.model_flops / (r.step_seconds() * peak)
                                             : p.mfu_sum / p.ranks);
  r.set_grad_norm(p.grad_norm_sum / p.ranks);
  if (r.step_seconds() > 0) r.set_tokens_per_second(r.tokens() / r.step_seconds());
  for (const auto& layer : p.expert_tokens) {
    auto* et = r.add_expert_tokens();
    double sum = 0, max = 0;
    for (double t : layer) {
      et->add_tokens(t);
      sum += t;
      max = std::max(max, t);
    }
    const double mean = layer.empty() ? 0 : sum / layer.size();
    r.add_imbalance(mean > 0 ? max / mean : 0);
  }
  for (const auto& [action, bytes] : p.planner) {
    v1::PlannerActionBytes* a = r.add_planner();
    a->set_action(static_cast<v1::PlannerAction>(action));
    a->set_bytes(bytes);
  }
  for (const auto& [key, comm] : p.comm) *r.add_comm() = comm;
  for (v1::MoeLayerSchedule schedule : p.schedules) r.add_moe_schedules(schedule);
  for (const auto& [op, sum] : p.moe_ops) *r.add_moe_ops() = sum;
  WriteStep(job_id, r, 1);
  NoteStep(job_id, r);
}

void TelemetryAggregator::WriteStep(const std::string& job_id, const v1::StepRecord& r, int tries) {
  // Written by the group commit, not under the caller's state mutex (an fsync); counted in the
  // exported totals once it is stored (the file comment).
  {
    std::lock_guard<std::mutex> lock(totals_mu_);
    ++totals_[job_id].steps_writing;
  }
  commit_.Submit([this, job_id, r] { return store_.PutStep(job_id, r); },
                 [this, job_id, r, tries](absl::Status s) {
                   if (s.ok()) AddTotals(job_id, r);
                   std::lock_guard<std::mutex> lock(totals_mu_);
                   Totals& t = totals_[job_id];
                   --t.steps_writing;
                   const auto key = std::make_pair(r.attempt(), r.step());
                   if (s.ok()) {
                     t.failed.erase(key);
                   } else if (tries < kStepWriteTries) {
                     // The agents keep its records meanwhile (Settled), and a restarted controller
                     // gets them.
                     if (tries == 1) {
                       spdlog::warn("job {}: step {} not stored: {}; trying again every {:.0f} s",
                                    job_id, r.step(), s.ToString(), kStepRetryS);
                     }
                     t.failed[key] = {r, tries, false};
                   } else {
                     t.failed.erase(key);
                     spdlog::error(
                         "job {}: step {} not stored after {} tries: {}; its point is missing from "
                         "the series",
                         job_id, r.step(), tries, s.ToString());
                   }
                 });
}

void TelemetryAggregator::RetryFailedWrites(double now_mono) {
  if (now_mono - last_retry_mono_ < kStepRetryS) return;
  last_retry_mono_ = now_mono;
  std::vector<std::tuple<std::string, v1::StepRecord, int>> again;
  {
    std::lock_guard<std::mutex> lock(totals_mu_);
    for (auto& [job_id, t] : totals_) {
      for (auto& [key, failed] : t.failed) {
        if (failed.writing) continue;
        failed.writing = true;
        again.emplace_back(job_id, failed.step, failed.tries);
      }
    }
  }
  // (Each stays in `failed` until its write is answered: Settled holds back until then.)
  for (const auto& [job_id, step, tries] : again) WriteStep(job_id, step, tries + 1);
}

void TelemetryAggregator::CountStep(const std::string& job_id, const v1::StepRecord& r) {
  NoteStep(job_id, r);
  AddTotals(job_id, r);
}

void TelemetryAggregator::AddTotals(const std::string& job_id, const v1::StepRecord& r) {
  std::lock_guard<std::mutex> lock(totals_mu_);
  Totals& t = totals_[job_id];
  t.tokens += r.tokens();
  t.planner_decisions += r.planner_decisions();
  t.emergency_offloads += r.emergency_offloads();
  t.late_reloads += static_cast<double>(r.late_reloads());
  t.agreements += r.agreements();
  t.agreed_drops += r.agreed_drops();
  t.agreement_seconds += r.agreement_seconds();
  // The Prometheus series are by action and by collective (over all groups).
  for (const auto& a : r.planner()) {
    t.planner[v1::PlannerActionLabel(a.action())] += static_cast<double>(a.bytes());
  }
  for (const auto& c : r.comm()) {
    t.comm[v1::CollectiveOpLabel(c.op())] += static_cast<double>(c.bytes());
  }
  for (const auto& o : r.moe_ops()) {
    t.moe_op_bytes[o.op()] += static_cast<double>(o.bytes());
    t.moe_op_seconds[o.op()] += o.seconds();
  }
  t.goodput.AddStep(r);
  NoteCommitted(t, r);
}

void TelemetryAggregator::NoteCommitted(Totals& t, const v1::StepRecord& r) {
  const auto key = std::make_pair(r.attempt(), r.step());
  if (!t.committed || *t.committed < key) t.committed = key;
}

v1::SettledSteps TelemetryAggregator::Settled(const std::string& job_id, bool ended) const {
  v1::SettledSteps settled;
  settled.set_job_id(job_id);
  std::lock_guard<std::mutex> lock(totals_mu_);
  auto t = totals_.find(job_id);
  if (t == totals_.end()) {
    settled.set_all(ended && PendingSteps(job_id) == 0);
    return settled;
  }
  std::optional<std::pair<uint32_t, uint64_t>> upto = t->second.committed;
  if (!t->second.failed.empty()) {
    // Everything below the first step not written (steps are written in order).
    const auto [attempt, step] = t->second.failed.begin()->first;
    const auto below = step > 0 ? std::make_pair(attempt, step - 1)
                                : std::make_pair(attempt - 1, std::numeric_limits<uint64_t>::max());
    if (upto && below < *upto) upto = below;
  }
  if (upto) {
    settled.set_attempt(upto->first);
    settled.set_step(upto->second);
  }
  settled.set_all(ended && PendingSteps(job_id) == 0 && t->second.steps_writing == 0 &&
                  t->second.failed.empty());
  return settled;
}

void TelemetryAggregator::NoteStep(const std::string& job_id, const v1::StepRecord& r) {
  JobSteps& job = jobs_[job_id];
  job.has_step = true;
  job.last_step = r;
  if (r.has_eval()) job.last_eval = r.eval();
  if (r.checkpoint_seconds() > 0) job.last_checkpoint_s = r.checkpoint_seconds();
  if (r.checkpoint_stall_seconds() > 0) job.last_checkpoint_stall_s = r.checkpoint_stall_seconds();
}

bool TelemetryAggregator::KeepRaw(const v1::TelemetryRecord& rec, uint32_t world) {
  if (!rec.has_train() || rec.rank() == 0 || rec.has_startup() || !rec.message().empty()) {
    return true;
  }
  const uint64_t stride = std::max<uint64_t>(1, (uint64_t{world} + kRawPerStep - 1) / kRawPerStep);
  return (rec.step() + rec.rank()) % stride == 0;
}

int TelemetryAggregator::RawRecordsKept(uint32_t world) {
  return static_cast<int>(std::max<uint64_t>(5000, 2 * uint64_t{world}));
}

std::vector<TelemetryAggregator::Trim> TelemetryAggregator::TrimDue(
    const std::map<std::string, uint32_t>& jobs, size_t added) {
  constexpr uint64_t kTrimEvery = 1000;  // records added between trims of a job
  std::vector<Trim> due;
  for (const auto& [id, world] : jobs) {
    JobSteps& job = jobs_[id];
    job.records_since_trim += added;
    if (job.records_since_trim >= kTrimEvery) {
      job.records_since_trim = 0;
      due.push_back({id, RawRecordsKept(world)});
    }
  }
  return due;
}

void TelemetryAggregator::Store(std::vector<v1::TelemetryRecord> records, std::vector<Trim> trim,
                                bool after_steps, std::function<void(absl::Status)> done) {
  if (records.empty() && trim.empty() && !after_steps) {
    done(absl::OkStatus());
    return;
  }
  if (!records.empty() && commit_.queued() >= kMaxQueuedWrites) {
    done(absl::ResourceExhaustedError(
        absl::StrCat(records.size(), " raw telemetry record(s) dropped: ", commit_.queued(),
                     " writes are waiting for the disk")));
    return;
  }
  commit_.Submit(
      [this, records = std::move(records), trim = std::move(trim)]() -> absl::Status {
        RETURN_IF_ERROR(store_.AddTelemetry(records));
        for (const auto& rec : records) {
          if (rec.rank() != 0) continue;
          for (const auto& c : rec.comm()) RETURN_IF_ERROR(store_.PutCommResult(rec.job_id(), c));
        }
        for (const Trim& t : trim) RETURN_IF_ERROR(store_.TrimTelemetry(t.job_id, t.keep));
        return absl::OkStatus();
      },
      std::move(done));
}

size_t TelemetryAggregator::PendingSteps(const std::string& job_id) const {
  auto it = jobs_.find(job_id);
  return it == jobs_.end() ? 0 : it->second.pending_steps.size();
}

void TelemetryAggregator::Fill(const std::string& job_id, JobMetrics& m) const {
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return;
  const JobSteps& job = it->second;
  m.has_step = job.has_step;
  m.last = job.last_step;
  {
    std::lock_guard<std::mutex> lock(totals_mu_);
    if (auto t = totals_.find(job_id); t != totals_.end()) {
      m.tokens_total = t->second.tokens;
      m.planner_bytes_total = t->second.planner;
      m.planner_decisions_total = t->second.planner_decisions;
      m.emergency_offloads_total = t->second.emergency_offloads;
      m.late_reloads_total = t->second.late_reloads;
      m.agreements_total = t->second.agreements;
      m.agreed_drops_total = t->second.agreed_drops;
      m.agreement_seconds_total = t->second.agreement_seconds;
      m.comm_bytes_total = t->second.comm;
      m.moe_op_bytes_total = t->second.moe_op_bytes;
      m.moe_op_seconds_total = t->second.moe_op_seconds;
    }
  }
  m.last_checkpoint_seconds = job.last_checkpoint_s;
  m.last_checkpoint_stall_seconds = job.last_checkpoint_stall_s;
  m.checkpoint_failures_total = job.checkpoint_failures;
  m.last_eval = job.last_eval;
}

std::optional<v1::StepRecord> TelemetryAggregator::LastStep(const std::string& job_id) const {
  auto it = jobs_.find(job_id);
  if (it == jobs_.end() || !it->second.has_step) return std::nullopt;
  return it->second.last_step;
}

std::optional<v1::EvalTelemetry> TelemetryAggregator::LastEval(const std::string& job_id) const {
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return std::nullopt;
  return it->second.last_eval;
}

v1::JobGoodput TelemetryAggregator::Goodput(const std::string& job_id,
                                            const std::vector<v1::AttemptInfo>& attempts,
                                            bool active, double now_unix) const {
  static const GoodputLedger kNone;
  std::lock_guard<std::mutex> lock(totals_mu_);
  auto it = totals_.find(job_id);
  return (it == totals_.end() ? kNone : it->second.goodput).Report(attempts, active, now_unix);
}

v1::CheckpointHint TelemetryAggregator::CheckpointHint(const std::string& job_id,
                                                       const std::vector<v1::AttemptInfo>& attempts,
                                                       double now_unix,
                                                       const ClusterFailureRate& cluster,
                                                       int ranks) const {
  static const GoodputLedger kNone;
  std::lock_guard<std::mutex> lock(totals_mu_);
  auto it = totals_.find(job_id);
  return MakeCheckpointHint(attempts, it == totals_.end() ? kNone : it->second.goodput, now_unix,
                            cluster, ranks);
}

void TelemetryAggregator::Forget(const std::string& job_id) {
  jobs_.erase(job_id);
  std::lock_guard<std::mutex> lock(totals_mu_);
  totals_.erase(job_id);
}

}  // namespace furnace::controller
