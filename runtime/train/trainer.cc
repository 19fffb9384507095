#include "runtime/train/trainer.h"

#include <algorithm>
#include <cmath>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "runtime/base/status.h"
#include "runtime/checkpoint/reshard.h"
#include "runtime/tensor/transfer.h"

namespace furnace::train {
namespace {

// " (columns [0, 4) [8, 12) of [16, 48])" style, empty for a whole tensor.
std::string SliceText(const ParamShard& shard) {
  if (!shard.sharded()) return "";
  std::string ranges;
  for (const auto& [b, e] : shard.ranges) absl::StrAppend(&ranges, " [", b, ", ", e, ")");
  return absl::StrCat(" (dim ", shard.dim, ranges, " of ", ShapeText(shard.global_shape), ")");
}

}  // namespace

double ImbalanceOf(const std::vector<int64_t>& tokens_per_expert) {
  int64_t sum = 0, max = 0;
  for (int64_t c : tokens_per_expert) {
    sum += c;
    max = std::max(max, c);
  }
  const double mean =
      tokens_per_expert.empty() ? 0 : static_cast<double>(sum) / tokens_per_expert.size();
  return mean > 0 ? max / mean : 0;
}

void Trainer::FinishStats(StepStats& stats, double tokens, int devices) const {
  if (stats.step_seconds > 0) stats.tokens_per_second = tokens / stats.step_seconds;
  stats.imbalance.clear();
  for (const auto& layer : stats.tokens_per_expert) stats.imbalance.push_back(ImbalanceOf(layer));
  stats.model_flops = model_->FlopsPerToken() * tokens;
  stats.peak_flops = config_.peak_flops;
  if (config_.peak_flops > 0 && stats.step_seconds > 0) {
    stats.mfu = stats.model_flops / devices / stats.step_seconds / config_.peak_flops;
  }
}

absl::StatusOr<std::unique_ptr<Trainer>> Trainer::Create(
    Trainable* model, const data::Sampler* data, const TrainConfig& config, const Clock* clock,
    const ParallelRuntime* parallel, const data::Sampler* held_out) {
  if (model == nullptr || data == nullptr) {
    return absl::InvalidArgumentError("trainer: model and sampler are required");
  }
  RETURN_IF_ERROR(config.schedule.Validate());
  if (config.steps < 0 || config.micro_batches < 1) {
    return absl::InvalidArgumentError(absl::StrCat("trainer: steps ", config.steps,
                                                   " must be >= 0 and micro_batches ",
                                                   config.micro_batches, " >= 1"));
  }
  if (!(config.clip >= 0)) {
    return absl::InvalidArgumentError(absl::StrCat("trainer: clip ", config.clip, " must be >= 0"));
  }
  const data::SamplerConfig& sc = data->config();
  if (sc.seq_len != model->seq_len()) {
    return absl::InvalidArgumentError(absl::StrCat("trainer: sampler seq_len ", sc.seq_len,
                                                   " != model seq_len ", model->seq_len()));
  }
  if (data->vocab() > model->vocab()) {
    return absl::InvalidArgumentError(absl::StrCat("trainer: data vocab ", data->vocab(),
                                                   " exceeds the model's vocab ", model->vocab()));
  }
  const int64_t dp = parallel != nullptr ? parallel->dp : 1;
  if (sc.global_batch != 0 && sc.global_batch != int64_t{sc.batch} * config.micro_batches * dp) {
    return absl::InvalidArgumentError(
        absl::StrCat("trainer: sampler global batch ", sc.global_batch, " != micro_batch ",
                     sc.batch, " * micro_batches ", config.micro_batches, " * dp ", dp));
  }
  if (config.checkpoint.every_auto && !(config.checkpoint.auto_hint.mtbf_seconds > 0)) {
    // Without M the Young/Daly interval has no value, and the probe interval (1 step) would stay.
    return absl::InvalidArgumentError(absl::StrCat(
        "trainer: checkpoint.every_auto needs auto_hint.mtbf_seconds > 0 (the mean time between "
        "failures; got ",
        config.checkpoint.auto_hint.mtbf_seconds, ")"));
  }
  if (sc.seed != config.seed) {
    return absl::InvalidArgumentError(
        absl::StrCat("trainer: sampler seed ", sc.seed, " != train seed ", config.seed));
  }
  for (const ParamInfo& p : model->params()) {
    if (p.offset < 0 || p.offset + p.numel() > model->num_params()) {
      return absl::InvalidArgumentError(
          absl::StrCat("trainer: parameter ", p.name, " lies outside the flat array"));
    }
  }
  if (parallel != nullptr && dynamic_cast<PipelineStage*>(model) == nullptr) {
    return absl::InvalidArgumentError(
        "trainer: a parallel layout needs a model that runs as a pipeline stage "
        "(train::PipelineStage)");
  }
  if (config.eval.every < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("trainer: eval.every ", config.eval.every, " must be >= 0"));
  }
  if (config.eval.every > 0) {
    if (held_out == nullptr || config.eval.batches < 1) {
      return absl::InvalidArgumentError(absl::StrCat("trainer: eval.every ", config.eval.every,
                                                     " needs held-out data and eval.batches >= 1 (",
                                                     config.eval.batches, ")"));
    }
    if (held_out->config().seq_len != model->seq_len() || held_out->vocab() > model->vocab()) {
      return absl::InvalidArgumentError(
          absl::StrCat("trainer: held-out data (seq_len ", held_out->config().seq_len, ", vocab ",
                       held_out->vocab(), ") does not fit the model (seq_len ", model->seq_len(),
                       ", vocab ", model->vocab(), ")"));
    }
  }
  // The optimizer runs where the parameters are, in fp32 (master weights and moments).
  ASSIGN_OR_RETURN(const device::Backend* ops, device::BackendFor(model->device()));
  ASSIGN_OR_RETURN(std::unique_ptr<AdamW> adamw,
                   AdamW::Create(config.adamw, model->num_params(), model->device(), *ops));
  return std::unique_ptr<Trainer>(
      new Trainer(model, data, config, clock, parallel, held_out, *ops, std::move(adamw)));
}

Trainer::Trainer(Trainable* model, const data::Sampler* data, const TrainConfig& config,
                 const Clock* clock, const ParallelRuntime* parallel, const data::Sampler* held_out,
                 const device::Backend& ops, std::unique_ptr<AdamW> adamw)
    : model_(model),
      data_(data),
      held_out_(held_out),
      config_(config),
      clock_(clock != nullptr ? clock : &RealClock()),
      parallel_(parallel),
      device_(model->device()),
      ops_(ops),
      adamw_(std::move(adamw)),
      settings_([&] {
        std::map<std::string, std::string> s =
            RecordedSettings(config_.schedule, config_.adamw, config_.clip);
        s.insert(config_.model_settings.begin(), config_.model_settings.end());
        return s;
      }()) {
  if (parallel_ != nullptr) {
    config_.dp_rank = parallel_->dp_rank;
    stage_ = dynamic_cast<PipelineStage*>(model);
    for (const ParamInfo& p : model_->params()) {  // the global norm's share of this rank
      if (!p.norm_owner) continue;
      norm_begin_.push_back(p.offset);
      norm_count_.push_back(p.numel());
    }
  }
}

std::vector<MoeOpTotal> Trainer::MoeOpsSince(const std::vector<MoeOpTotal>& before) const {
  std::vector<MoeOpTotal> out;
  for (MoeOpTotal now : model_->MoeOps()) {
    for (const MoeOpTotal& b : before) {
      if (b.op != now.op) continue;
      now.bytes -= b.bytes;
      now.calls -= b.calls;
      now.seconds -= b.seconds;
    }
    if (now.calls > 0) out.push_back(std::move(now));
  }
  return out;
}

MemoryActionTotals Trainer::MemoryActionsSince(const MemoryActionTotals& before) const {
  MemoryActionTotals d = model_->MemoryActions();
  d.recomputed_bytes -= before.recomputed_bytes;
  d.offloaded_bytes -= before.offloaded_bytes;
  d.compressed_bytes -= before.compressed_bytes;
  d.late_reloads -= before.late_reloads;
  d.planner_seconds -= before.planner_seconds;
  d.planner_decisions -= before.planner_decisions;
  d.emergency_offloads -= before.emergency_offloads;
  d.agreements -= before.agreements;
  d.agreed_drops -= before.agreed_drops;
  d.agreement_seconds -= before.agreement_seconds;
  return d;
}

absl::StatusOr<StepStats> Trainer::Step() {
  if (parallel_ != nullptr) return StepParallel();
  const data::SamplerConfig& sc = data_->config();
  const int m = config_.micro_batches;
  const double tokens = static_cast<double>(sc.batch) * sc.seq_len * m;
  StepStats stats;
  stats.step = step_;
  stats.tokens = static_cast<int64_t>(tokens);

  const MemoryActionTotals actions_before = model_->MemoryActions();
  const std::vector<MoeOpTotal> moe_before = model_->MoeOps();
  const double t0 = clock_->MonotonicSeconds();
  model_->ZeroGrad();
  for (int micro = 0; micro < m; ++micro) {
    ASSIGN_OR_RETURN(const data::Batch batch, data_->Sample(step_, 0, config_.dp_rank * m + micro));
    model_->SetStepContext(step_, (int64_t{config_.dp_rank} * m + micro) * sc.batch);
    ASSIGN_OR_RETURN(MicroBatchResult r,
                     model_->ForwardBackward(batch.inputs.data(), batch.targets.data(), batch.B,
                                             1.0 / tokens, 1.0 / m));
    stats.loss += r.loss / m;
    stats.aux_loss += r.aux_loss / m;
    stats.dropped += r.dropped;
    stats.activation_peak_bytes = std::max(stats.activation_peak_bytes, r.activation_peak_bytes);
    stats.predicted_peak_bytes = std::max(stats.predicted_peak_bytes, r.predicted_peak_bytes);
    stats.routing_spike = stats.routing_spike || r.routing_spike;
    if (stats.tokens_per_expert.size() < r.tokens_per_expert.size()) {
      stats.tokens_per_expert.resize(r.tokens_per_expert.size());
    }
    for (size_t l = 0; l < r.tokens_per_expert.size(); ++l) {
      auto& acc = stats.tokens_per_expert[l];
      if (acc.size() < r.tokens_per_expert[l].size()) acc.resize(r.tokens_per_expert[l].size());
      for (size_t e = 0; e < r.tokens_per_expert[l].size(); ++e)
        acc[e] += r.tokens_per_expert[l][e];
    }
  }
  const double t1 = clock_->MonotonicSeconds();

  const int64_t n = model_->num_params();
  stats.grad_norm = ClipGradNorm(ops_, model_->grad_data(), n, config_.clip);
  RETURN_IF_ERROR(RefuseNonFinite(stats));
  stats.lr = config_.schedule.At(step_);
  async_agreed_ = LocalAsyncState();
  stats.checkpoint_stall_seconds += WaitSnapshotCopied();
  adamw_->Update(model_->params(), model_->param_data(), model_->grad_data(), stats.lr, step_ + 1);
  // The step's time is the device's: what the update enqueued has run.
  RETURN_IF_ERROR(tensor::Synchronize(device_));
  const double t2 = clock_->MonotonicSeconds();

  stats.forward_backward_seconds = t1 - t0;
  stats.optimizer_seconds = t2 - t1;
  stats.step_seconds = t2 - t0;
  stats.memory_actions = MemoryActionsSince(actions_before);
  stats.moe_ops = MoeOpsSince(moe_before);
  stats.moe_schedules = model_->MoeScheduleNames();
  FinishStats(stats, tokens, 1);
  ++step_;
  return stats;
}

absl::Status Trainer::RefuseNonFinite(const StepStats& stats) const {
  if (std::isfinite(stats.loss) && std::isfinite(stats.grad_norm)) return absl::OkStatus();
  // Steps as the logs and checkpoints count them: step_ + 1 is the one that failed.
  const std::string kept =
      step_ == 0 ? std::string("the initial ones") : absl::StrCat("those of step ", step_);
  return absl::AbortedError(absl::StrFormat(
      "step %d: the loss is %g and the gradient norm %g: the update was not applied (the "
      "parameters and Adam moments are still %s). The run diverged or a device computed "
      "garbage; a restart resumes from the last checkpoint (to resume under a lower train.lr or "
      "a longer train.warmup, resubmit with checkpoint.override_settings: true)",
      step_ + 1, stats.loss, stats.grad_norm, kept));
}

absl::StatusOr<EvalResult> Trainer::Evaluate() {
  if (held_out_ == nullptr || config_.eval.batches < 1) {
    return absl::FailedPreconditionError("trainer: no held-out data or eval.batches to evaluate");
  }
  return EvaluateHeldOut(*model_, *held_out_, config_.eval.batches, parallel_, *clock_);
}

absl::Status Trainer::Run(const StepCallback& on_step, const StopToken* stop,
                          const PhaseCallback& on_phase) {
  const auto enter = [&](RunPhase phase) {
    if (on_phase) on_phase(phase, step_);
  };
  const bool checkpoints = !config_.checkpoint.dir.empty();
  const bool async = checkpoints && config_.checkpoint.async;
  std::optional<AutoCheckpointInterval> auto_interval;
  if (checkpoints && config_.checkpoint.every_auto) {
    auto_interval.emplace(config_.checkpoint.auto_hint, config_.steps);
  }
  const int64_t run_start = step_;
  int64_t checkpointed_at = step_;  // the last checkpoint, or where Run started
  // checkpoint.async: what the snapshot in flight has held so far (its copy wait, the commit,
  // then the wait at the next checkpoint step), the stall `every: auto` learns per checkpoint.
  double in_flight_stall = 0;
  bool snapshot_started = false;  // by this Run
  run_stop_ = stop;
  stop_agreed_ = false;
  stopped_on_request_ = false;
  struct ClearRunStop {
    const StopToken*& token;
    ~ClearRunStop() { token = nullptr; }
  } clear_run_stop{run_stop_};
  while (step_ < config_.steps) {
    ASSIGN_OR_RETURN(StepStats stats, Step());
    if (async) {
      const double t0 = clock_->MonotonicSeconds();
      RETURN_IF_ERROR(CommitIfDurable(stats));
      stats.checkpoint_stall_seconds += clock_->MonotonicSeconds() - t0;
      in_flight_stall += stats.checkpoint_stall_seconds;
    }
    bool due = checkpoints && config_.checkpoint.every > 0 && step_ % config_.checkpoint.every == 0;
    if (auto_interval) {
      auto_interval->ObserveStep(stats.step_seconds);
      ASSIGN_OR_RETURN(const IntervalInputs agreed,
                       AgreeIntervalInputs(parallel_ != nullptr ? parallel_->world_group : nullptr,
                                           auto_interval->Local()));
      // The first step says the interval in force (from the hint, or the probe's one step).
      stats.checkpoint_interval_changed = auto_interval->Update(agreed) || step_ == run_start + 1;
      stats.checkpoint_interval_steps = auto_interval->current().steps;
      stats.checkpoint_interval_seconds = auto_interval->current().seconds;
      stats.checkpoint_interval_inputs = agreed;
      due = auto_interval->Due(step_ - checkpointed_at);
    }
    if (due) {
      enter(RunPhase::kCheckpoint);
      checkpointed_at = step_;
      const double t0 = clock_->MonotonicSeconds();
      if (async) {
        // A write slower than the interval: the step waits for it and commits it before the
        // next snapshot starts, so two are never in flight.
        FinishAsyncCheckpoint(&stats);
        FinishCommit(&stats);
        const double waited = clock_->MonotonicSeconds() - t0;
        // The previous snapshot's whole stall (none before the first of this run).
        if (auto_interval && snapshot_started) {
          auto_interval->ObserveStall(in_flight_stall + waited);
        }
        RETURN_IF_ERROR(StartAsyncCheckpoint());
        snapshot_started = true;
        in_flight_stall = 0;
      } else {
        RETURN_IF_ERROR(SaveCheckpoint());
        stats.checkpoint_seconds = clock_->MonotonicSeconds() - t0;
      }
      stats.checkpoint_stall_seconds += clock_->MonotonicSeconds() - t0;
      if (auto_interval && !async) auto_interval->ObserveStall(stats.checkpoint_stall_seconds);
    }
    // A checkpointed stop: with a layout, agreed in this step's world all-reduce, so every rank
    // leaves after this same step (no evaluation first) and writes its checkpoint below together.
    const bool stop_here =
        step_ < config_.steps &&
        (parallel_ != nullptr ? stop_agreed_
                              : stop != nullptr && stop->checkpointed_stop_requested());
    if (!stop_here && EvalDue(config_.eval, step_, config_.steps)) {
      enter(RunPhase::kEval);
      ASSIGN_OR_RETURN(stats.eval, Evaluate());
    }
    if (on_step) on_step(stats);
    if (stop != nullptr && stop->stop_requested()) {
      // A parallel checkpoint is a collective: a rank that stops on its own cannot write one (nor
      // commit the one in flight; its shard is still finished).
      if (parallel_ != nullptr) {
        if (async_ != nullptr && async_->in_flight()) async_->Wait().IgnoreError();
        if (async_ != nullptr && async_->commit_open()) async_->WaitCommit().IgnoreError();
        return absl::OkStatus();
      }
      break;
    }
    if (stop_here) {
      stopped_on_request_ = true;
      break;
    }
  }
  if (async) {
    enter(RunPhase::kCheckpoint);  // the final one, or the wait for the one in flight
    FinishAsyncCheckpoint(nullptr);
    FinishCommit(nullptr);
    // A snapshot of this very step that failed is not written again.
    const bool attempted = async_ != nullptr && async_->state().step == step_;
    if (last_saved_step_ != step_ && !attempted) {
      RETURN_IF_ERROR(StartAsyncCheckpoint());
      FinishAsyncCheckpoint(nullptr);
      FinishCommit(nullptr);
    }
    // The run's success stands on its final checkpoint (what export, sample and a later resume
    // read): one that failed in the background is written once more in the foreground, and a
    // second failure fails the run, as a synchronous checkpoint's does (every rank agreed on
    // last_saved_step_, so they all take this branch together).
    if (last_saved_step_ != step_) {
      enter(RunPhase::kCheckpoint);  // its own watchdog deadline, not what the first write left
      if (absl::Status saved = SaveCheckpoint(); !saved.ok()) {
        return absl::Status(saved.code(),
                            absl::StrCat("the final checkpoint (step ", step_,
                                         ") failed in the background and again in the "
                                         "foreground: ",
                                         saved.message()));
      }
    }
    return absl::OkStatus();
  }
  if (checkpoints && last_saved_step_ != step_) {
    enter(RunPhase::kCheckpoint);
    RETURN_IF_ERROR(SaveCheckpoint());
  }
  return absl::OkStatus();
}

ShardState Trainer::CurrentShardState() const {
  ShardState state;
  state.step = step_;
  state.data_position = step_;
  state.data = data_->PositionAt(step_);
  state.seed = config_.seed;
  state.settings = settings_;
  state.job = config_.job_id;
  state.shard = parallel_ != nullptr ? parallel_->world_rank : 0;
  state.num_shards = parallel_ != nullptr ? parallel_->world : 1;
  state.n = model_->num_params();
  state.params = model_->param_data();
  state.m = adamw_->m();
  state.v = adamw_->v();
  return state;
}

absl::StatusOr<ShardState> Trainer::HostShardState(std::vector<float> (&host)[3]) const {
  ShardState state = CurrentShardState();
  if (device::HostAddressable(device_)) return state;
  const float* arrays[3] = {state.params, state.m, state.v};
  for (int i = 0; i < 3; ++i) {
    host[i].resize(static_cast<size_t>(state.n));
    RETURN_IF_ERROR(
        tensor::CopyToHost(device_, host[i].data(), arrays[i], host[i].size() * sizeof(float)));
  }
  state.params = host[0].data();
  state.m = host[1].data();
  state.v = host[2].data();
  return state;
}

absl::Status Trainer::StartAsyncCheckpoint() {
  if (async_ == nullptr) {
    async_ = std::make_unique<AsyncCheckpointWriter>(config_.checkpoint.dir,
                                                     config_.checkpoint.keep, &device_);
    async_->SetWriteHookForTest(write_hook_);
    async_->SetCopyHookForTest(copy_hook_);
  }
  return async_->Start(CurrentShardState());
}

double Trainer::WaitSnapshotCopied() { return async_ != nullptr ? async_->WaitCopied() : 0.0; }

Trainer::AsyncAgreement Trainer::LocalAsyncState() const {
  AsyncAgreement local;
  if (async_ == nullptr) return local;
  local.writing = async_->in_flight() && !async_->durable() ? 1.0f : 0.0f;
  local.commit_open = async_->commit_open() && !async_->commit_finished() ? 1.0f : 0.0f;
  local.commit_failed = async_->commit_open() && async_->commit_failed() ? 1.0f : 0.0f;
  return local;
}

absl::Status Trainer::CommitIfDurable(StepStats& stats) {
  if (commit_step_ >= 0 && async_agreed_.commit_open == 0.0f) {
    ResolveCommit(async_agreed_.commit_failed > 0.0f, &stats);
  }
  if (async_ != nullptr && async_->in_flight() && async_agreed_.writing == 0.0f) {
    FinishAsyncCheckpoint(&stats);
  }
  return absl::OkStatus();
}

void Trainer::FinishAsyncCheckpoint(StepStats* stats) {
  if (async_ == nullptr || !async_->in_flight()) return;
  FinishCommit(stats);  // one commit open at a time
  const absl::StatusOr<ShardRecord> written = async_->Wait();
  // The snapshot's header (its arrays are not needed to commit it).
  ShardState header = async_->state();
  header.params = header.m = header.v = nullptr;
  if (stats != nullptr) stats->checkpoint_seconds = async_->write_seconds();
  absl::StatusOr<std::vector<ShardRecord>> records;
  if (parallel_ != nullptr) {
    records = GatherShardRecords(written);
  } else if (written.ok()) {
    records = std::vector<ShardRecord>{*written};
  } else {
    records = written.status();
  }
  if (!records.ok()) {
    RecordCheckpointError(header.step, records.status(), stats);
    return;
  }
  commit_step_ = header.step;
  if (parallel_ != nullptr && parallel_->world_rank != 0) return;
  const absl::Status started =
      async_->StartCommit([dir = config_.checkpoint.dir, keep = config_.checkpoint.keep,
                           params = model_->params(), header, records = *std::move(records),
                           retention = commit_retention_ = std::make_shared<std::string>()] {
        CheckpointStore store(dir, keep);
        return store.Commit(params, header, records, retention.get());
      });
  if (!started.ok()) RecordCheckpointError(header.step, started, stats);
}

void Trainer::FinishCommit(StepStats* stats) {
  if (commit_step_ < 0) return;
  const int64_t step = commit_step_;
  commit_step_ = -1;
  // Only rank 0 runs a commit; the others learn its outcome from the agreement.
  absl::Status committed = async_->commit_open() ? async_->WaitCommit() : absl::OkStatus();
  if (parallel_ != nullptr) committed = AgreeOnWorld(committed);
  if (committed.ok()) {
    last_saved_step_ = step;
    if (commit_retention_ != nullptr) NoteRetention(step, *commit_retention_);
    commit_retention_.reset();
    return;
  }
  RecordCheckpointError(step, committed, stats);
}

void Trainer::ResolveCommit(bool failed, StepStats* stats) {
  const int64_t step = commit_step_;
  commit_step_ = -1;
  // Rank 0 joins its finished commit and has the cause; the others know whether it failed.
  const absl::Status committed =
      async_->commit_open() ? async_->WaitCommit()
      : failed              ? absl::AbortedError("rank 0 could not commit it (its log says why)")
                            : absl::OkStatus();
  if (committed.ok()) {
    last_saved_step_ = step;
    if (commit_retention_ != nullptr) NoteRetention(step, *commit_retention_);
    commit_retention_.reset();
    return;
  }
  RecordCheckpointError(step, committed, stats);
}

void Trainer::NoteRetention(int64_t step, const std::string& retention_error) {
  if (retention_error.empty()) return;
  checkpoint_warnings_.push_back(absl::StrCat(
      "checkpoint of step ", step, " committed, but an older one could not be deleted ",
      "(checkpoint.keep; tried again at the next checkpoint): ", retention_error));
}

void Trainer::RecordCheckpointError(int64_t step, const absl::Status& why, StepStats* stats) {
  std::string error = absl::StrCat("checkpoint of step ", step, " not committed: ", why.message());
  if (stats != nullptr) stats->checkpoint_error = error;
  checkpoint_errors_.push_back(std::move(error));
}

absl::Status Trainer::SaveCheckpoint() {
  if (config_.checkpoint.dir.empty()) {
    return absl::FailedPreconditionError("trainer: no checkpoint dir configured");
  }
  if (parallel_ != nullptr) return SaveCheckpointParallel();
  CheckpointStore store(config_.checkpoint.dir, config_.checkpoint.keep);
  std::vector<float> host[3];
  ASSIGN_OR_RETURN(const ShardState state, HostShardState(host));
  std::string retention;
  RETURN_IF_ERROR(store.Save(model_->params(), state, &retention));
  last_saved_step_ = step_;
  NoteRetention(step_, retention);
  return absl::OkStatus();
}

absl::StatusOr<LoadedCheckpoint> Trainer::RestoreLatest() {
  if (config_.checkpoint.dir.empty()) {
    return absl::FailedPreconditionError("trainer: no checkpoint dir configured");
  }
  if (parallel_ != nullptr) return RestoreLatestParallel();
  CheckpointStore store(config_.checkpoint.dir, config_.checkpoint.keep);
  ASSIGN_OR_RETURN(
      LoadedCheckpoint loaded,
      LoadLatestIntoLayout(store, model_->params(), model_->num_params(), /*preferred=*/0));
  ASSIGN_OR_RETURN(const TensorShapes model, WholeShapes(model_->params()));
  RETURN_IF_ERROR(CompareTensorSets(loaded.path, loaded.tensors, model));
  RETURN_IF_ERROR(Restore(loaded));
  return loaded;
}

absl::Status Trainer::CheckDataPosition(const LoadedCheckpoint& c) const {
  const data::DataPosition now = data_->PositionAt(c.data_position);
  if (c.data.order.empty()) {
    if (now.epoch_sequences == 0) return absl::OkStatus();  // endless data: the step suffices
    return absl::FailedPreconditionError(
        absl::StrCat("checkpoint ", c.path,
                     " records no data position (written before positions were "
                     "recorded); this run reads finite data (",
                     now.order, ") and could not resume at the same sequence"));
  }
  if (!data::SameDataOrder(c.data.order, now.order)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "checkpoint ", c.path, " was written reading other data or in another order: ",
        data::DataOrderDifference(c.data.order, now.order),
        " (a file's size and hash are its content: a changed file reads other sequences). "
        "It recorded\n  ",
        c.data.order, "\nbut this run's data and settings give\n  ", now.order,
        "\n(resuming would read other sequences: use the same data, seq_len, seed, global "
        "batch and data.validation)"));
  }
  if (now.epoch_sequences > 0 && c.data.sequences != now.sequences) {
    return absl::FailedPreconditionError(absl::StrCat(
        "checkpoint ", c.path, " stopped after ", c.data.sequences, " sequences (epoch ",
        c.data.epoch, ", index ", c.data.index_in_epoch, "); its step ", c.data_position,
        " is sequence ", now.sequences, " in this run"));
  }
  return absl::OkStatus();
}

absl::Status Trainer::CheckSettings(const LoadedCheckpoint& c) {
  std::vector<SettingChange> changes = ChangedSettings(c.settings, settings_, c.data_position);
  if (!changes.empty() && !config_.override_checkpoint_settings) {
    return absl::FailedPreconditionError(absl::StrCat(
        "checkpoint ", c.path, " was written with other settings: ", DescribeChanges(changes),
        " (checkpoint -> this run); resuming would change the model or its update rule from ",
        "step ", c.data_position, " on. Submit with the checkpoint's values, or set ",
        "checkpoint.override_settings: true to continue with this run's"));
  }
  settings_overridden_ = std::move(changes);
  return absl::OkStatus();
}

absl::Status Trainer::Restore(const LoadedCheckpoint& c) {
  const std::vector<ParamInfo>& params = model_->params();
  const int64_t n = model_->num_params();
  if (c.params.size() != params.size()) {
    return absl::FailedPreconditionError(
        absl::StrCat("checkpoint ", c.path, " has ", c.params.size(), " tensors; the model has ",
                     params.size(), " (load a checkpoint into another layout with RestoreLatest)"));
  }
  for (size_t i = 0; i < params.size(); ++i) {
    const ParamInfo& a = c.params[i];
    const ParamInfo& b = params[i];
    if (a.name != b.name || a.shape != b.shape || a.offset != b.offset ||
        a.shard.global_shape != b.shard.global_shape || a.shard.dim != b.shard.dim ||
        a.shard.ranges != b.shard.ranges) {
      return absl::FailedPreconditionError(
          absl::StrCat("checkpoint ", c.path, ": tensor ", i, " is ", a.name, " ",
                       ShapeText(a.shape), " at ", a.offset, SliceText(a.shard), "; the model has ",
                       b.name, " ", ShapeText(b.shape), " at ", b.offset, SliceText(b.shard),
                       " (load a checkpoint into another layout with RestoreLatest)"));
    }
  }
  if (c.param_data.size() != static_cast<size_t>(n)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "checkpoint ", c.path, " holds ", c.param_data.size(), " parameters; the model has ", n));
  }
  if (c.seed != config_.seed) {
    return absl::FailedPreconditionError(absl::StrCat(
        "checkpoint ", c.path, " was written with seed ", c.seed, "; this run has seed ",
        config_.seed, " (resuming would change the data order)"));
  }
  if (c.data_position > config_.steps) {
    return absl::FailedPreconditionError(
        absl::StrCat("checkpoint ", c.path, " is of step ", c.data_position,
                     ", past this run's train.steps ", config_.steps,
                     ": resuming would train nothing and hand out a model of more steps than "
                     "asked. Raise train.steps to at least ",
                     c.data_position,
                     " (under a cosine schedule with checkpoint.override_settings: true too, "
                     "since train.steps shapes its decay), or give the job another "
                     "checkpoint.dir"));
  }
  RETURN_IF_ERROR(CheckDataPosition(c));
  RETURN_IF_ERROR(CheckSettings(c));
  // Host to device (the stream synchronised: the loaded arrays may go on return). c.m and c.v
  // hold n values each, as c.param_data (the loaders' contract).
  if (c.m.size() != static_cast<size_t>(n) || c.v.size() != static_cast<size_t>(n)) {
    return absl::FailedPreconditionError(absl::StrCat("checkpoint ", c.path, " holds ", c.m.size(),
                                                      " and ", c.v.size(),
                                                      " Adam moments; the model has ", n));
  }
  const size_t bytes = static_cast<size_t>(n) * sizeof(float);
  RETURN_IF_ERROR(tensor::CopyToDevice(device_, model_->param_data(), c.param_data.data(), bytes));
  RETURN_IF_ERROR(tensor::CopyToDevice(device_, adamw_->m(), c.m.data(), bytes));
  RETURN_IF_ERROR(tensor::CopyToDevice(device_, adamw_->v(), c.v.data(), bytes));
  step_ = c.data_position;
  last_saved_step_ = c.step;
  return absl::OkStatus();
}

}  // namespace furnace::train
