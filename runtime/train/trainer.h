// The training loop of one rank: a whole model in one process, or one rank of a parallel layout
// (a ParallelRuntime, see parallel.h). A step is MODEL.md "Loss and step": ZeroGrad, then m
// micro-batches of ForwardBackward with ce_scale = 1/(B*T*m) and aux_scale = 1/m, so the
// accumulated gradient is that of the step's mean loss; then global-norm clipping, then AdamW at
// the scheduled LR. Before each micro-batch the model learns the step and where the micro-batch's
// sequences sit in the global batch (Trainable::SetStepContext: what seeds routing spikes, so they
// are the same on every layout). Batches come from a deterministic Sampler keyed by the step index,
// and checkpoints hold params, Adam moments, the step and the seed, so Restore + Run continues
// bit-for-bit as if the run had never stopped.
//
// Devices: the loop runs where the model's parameters are (Trainable::device()): the Adam moments,
// clipping, the gradient reductions (buckets in device memory), the pipeline's activation buffers
// and the optimizer update live on that device and run through its fp32 backend table on the
// calling thread's current stream, after the model's kernels. The host waits for the device where
// it needs a value: the gradient norm (sum_of_squares returns a host scalar), every collective of
// a communicator over a host transport (comm::ForDevice stages through the host), checkpoints
// (saved from a device-to-host copy; the asynchronous snapshot is that copy on the writer's
// stream) and restores (host-to-device). The communicators given in ParallelRuntime must take
// buffers of the model's device.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/base/clock.h"
#include "runtime/checkpoint/checkpoint.h"
#include "runtime/checkpoint/reshard.h"
#include "runtime/comm/communicator.h"
#include "runtime/data/sampler.h"
#include "runtime/device/backend.h"
#include "runtime/tensor/device_memory.h"
#include "runtime/train/async_checkpoint.h"
#include "runtime/train/checkpoint_interval.h"
#include "runtime/train/held_out_eval.h"
#include "runtime/train/lr_schedule.h"
#include "runtime/train/optimizer_step.h"
#include "runtime/train/parallel.h"
#include "runtime/train/run_settings.h"
#include "runtime/trainable/trainable.h"

namespace furnace::train {

struct CheckpointConfig {
  std::string dir;    // empty: no checkpoints
  int64_t every = 0;  // save after every `every` steps (0: only at the end of Run)
  int keep = 3;       // committed checkpoints retained; <= 0 keeps all
  // Snapshot and write shards on a background thread (async_checkpoint.h) and commit a
  // checkpoint after the first step at which every rank's shard is durable (at the latest at the
  // next checkpoint step, which waits for it, or at the end of Run). A failed background write is
  // reported (StepStats::checkpoint_error) and not committed; training goes on.
  bool async = false;
  // checkpoint.every auto (then `every` is not used): the Young/Daly interval
  // (checkpoint_interval.h), re-evaluated after every step from inputs all ranks agree on.
  // `auto_hint`: M (> 0: Create refuses every_auto without it), and the stall and step time
  // measured by earlier attempts (0: unknown).
  bool every_auto = false;
  IntervalInputs auto_hint = {};
};

struct TrainConfig {
  int64_t steps = 1;      // Run stops when step() reaches this
  int micro_batches = 1;  // m; the micro-batch size B and seq_len T are the sampler's
  int dp_rank = 0;
  uint64_t seed = 0;  // recorded in checkpoints; must be the sampler's seed
  LrSchedule schedule;
  AdamWConfig adamw;
  double clip = 1.0;      // global-norm clip; 0 = off
  double peak_flops = 0;  // device peak FLOP/s for MFU; 0 = MFU not reported
  CheckpointConfig checkpoint;
  // What defines the model beyond its tensors' names and shapes (model::ModelConfig::
  // RecordedSettings: field -> text), recorded in checkpoints beside the optimizer's settings and
  // compared with them at a resume. Empty: none recorded (a model that has none).
  std::map<std::string, std::string> model_settings;
  // A resume from a checkpoint written with other optimizer or model settings (run_settings.h,
  // model_settings): refused (false), or continued with this run's, the differences kept in
  // settings_overridden().
  bool override_checkpoint_settings = false;
  // The job this run trains for, recorded in each checkpoint's manifest ("job"; empty: not
  // recorded), so `furnace export` and `furnace sample` of a job read its own steps.
  std::string job_id;
  // Held-out evaluation (held_out_eval.h) after every `eval.every` steps and the last; needs the
  // held-out sampler given to Create.
  EvalConfig eval;
};

// One collective on one of this rank's groups over one step (runtime/comm/communicator.h has what
// the bytes count).
struct CommStats {
  std::string group;  // RankGroup::kind
  comm::CollectiveOp op = comm::CollectiveOp::kAllReduce;
  int64_t bytes = 0;
  int64_t calls = 0;
  double seconds = 0;  // wall time of the calls
};

struct StepStats {
  int64_t step = 0;     // 0-based index of the step just completed
  double loss = 0;      // mean token cross-entropy over the step's micro-batches
  double aux_loss = 0;  // mean over micro-batches of the summed MoE aux losses
  int64_t tokens = 0;   // B * T * m on this rank
  double step_seconds = 0;
  double forward_backward_seconds = 0;
  double optimizer_seconds = 0;  // clipping + AdamW
  double tokens_per_second = 0;
  double grad_norm = 0;  // before clipping
  double lr = 0;
  std::vector<std::vector<int64_t>> tokens_per_expert;  // [moe_layer][e], summed over micro-batches
  std::vector<double> imbalance;                        // [moe_layer] max / mean
  int64_t dropped = 0;
  int64_t activation_peak_bytes = 0;  // max over micro-batches
  int64_t predicted_peak_bytes = 0;   // the model's prediction for the same (0: none)
  bool routing_spike = false;         // a routing-spike step (MicroBatchResult::routing_spike)
  MemoryActionTotals memory_actions;  // what the memory policy did during this step (this rank)
  double model_flops = 0;             // FlopsPerToken * tokens
  double mfu = 0;                     // model_flops / step_seconds / peak_flops
  double peak_flops = 0;              // the device peak the MFU is of (TrainConfig::peak_flops)
  // The checkpoint written after this step (0: none); with checkpoint.async, the background
  // write of the checkpoint committed (or failed) after this step.
  double checkpoint_seconds = 0;
  // How long this step was held by checkpointing: the whole write when synchronous; when
  // asynchronous, the wait for the snapshot's copy before the optimizer update, the commit, and
  // at a checkpoint step the wait for the previous snapshot's write.
  double checkpoint_stall_seconds = 0;
  std::string checkpoint_error;  // why the checkpoint finished after this step was not committed
  // checkpoint.every auto: the interval in force after this step (0 steps under a fixed one;
  // seconds 0 while probing the stall), the agreed inputs it came from, and whether this step
  // changed it (or is Run's first). The same on every rank.
  int64_t checkpoint_interval_steps = 0;
  double checkpoint_interval_seconds = 0;
  IntervalInputs checkpoint_interval_inputs;
  bool checkpoint_interval_changed = false;
  // Parallel layouts (a ParallelRuntime): the numbers above are global (loss, aux loss, tokens,
  // tokens per expert and imbalance over the whole global batch; model_flops of the whole step,
  // mfu per device), and these are this rank's.
  double sync_seconds = 0;      // gradient reductions, norm and statistics after the micro-batches
  int in_flight_peak = 0;       // most micro-batches holding activations at once (1F1B)
  std::vector<CommStats> comm;  // per (group, op) with calls this step, in all_groups order
  // The MoE schedules' ops this step (calls > 0 only), and each MoE layer's schedule.
  std::vector<MoeOpTotal> moe_ops;
  std::vector<std::string> moe_schedules;
  // The held-out evaluation run after this step (TrainConfig::eval), the same on every rank.
  std::optional<EvalResult> eval;
};

// max / mean of routed tokens per expert (0 when no token was routed).
double ImbalanceOf(const std::vector<int64_t>& tokens_per_expert);

// Asks a running loop to stop after the current step. Thread-safe; RequestCheckpointedStop is
// also async-signal-safe (a lock-free atomic store).
//   RequestStop: this rank stops on its own (an injected fault): with a parallel layout it writes
//     no checkpoint, a collective the other ranks are not in.
//   RequestCheckpointedStop: the job is being stopped, and its progress kept: every rank learns it
//     in the step's own world all-reduce (any rank's request stops all of them after that same
//     step), and the checkpoint of that step is written before Run returns.
class StopToken {
 public:
  void RequestStop() { stop_.store(true); }
  bool stop_requested() const { return stop_.load(); }
  void RequestCheckpointedStop() { checkpointed_stop_.store(true); }
  bool checkpointed_stop_requested() const { return checkpointed_stop_.load(); }

 private:
  std::atomic<bool> stop_{false};
  std::atomic<bool> checkpointed_stop_{false};
  static_assert(std::atomic<bool>::is_always_lock_free);
};

using StepCallback = std::function<void(const StepStats&)>;

// What Run does between steps, said when it starts (for a watchdog, worker/rank_watchdog.h): a
// checkpoint of the state after step `step` (every N steps, `every: auto`, or the final one), or a
// held-out evaluation after it. The step's callback follows them.
enum class RunPhase { kCheckpoint, kEval };
using PhaseCallback = std::function<void(RunPhase phase, int64_t step)>;

// Drives one Trainable. Borrows the model, sampler and clock (they must outlive it); owns the
// Adam moments. Not thread-safe, except StopToken.
class Trainer {
 public:
  // `parallel`: this rank's place in a parallel layout and its groups (borrowed; see
  // parallel.h); nullptr for one process. With it, the model must be a PipelineStage
  // (InvalidArgument otherwise). config.dp_rank is then parallel->dp_rank, and the batch
  // of micro-batch j on data-parallel rank r is the sampler's micro-batch r * m + j of rank 0, so
  // the global batch does not depend on the layout.
  static absl::StatusOr<std::unique_ptr<Trainer>> Create(Trainable* model,
                                                         const data::Sampler* data,
                                                         const TrainConfig& config,
                                                         const Clock* clock = nullptr,
                                                         const ParallelRuntime* parallel = nullptr,
                                                         const data::Sampler* held_out = nullptr);

  // One step at index step(); advances step().
  absl::StatusOr<StepStats> Step();

  // The held-out evaluation of the current parameters (held_out_eval.h); with a parallel layout a
  // collective of every rank. FailedPrecondition without a held-out sampler or eval.batches.
  absl::StatusOr<EvalResult> Evaluate();

  // Steps until step() == config.steps, `stop` is requested (checked after each step and its
  // callback), or a checkpointed stop is agreed (stopped_on_request()), saving every
  // `checkpoint.every` steps (with checkpoint.every_auto, whenever the
  // auto interval has passed since the last checkpoint or the start of Run) and once at the end
  // when a dir is set.
  // With a ParallelRuntime a stop skips that last checkpoint: it is a collective, and the other
  // ranks have not stopped. With checkpoint.async an in-flight snapshot is committed after the
  // first step at which every rank's shard is durable, at the latest at the next checkpoint step
  // and at the end (a parallel stop only waits for this rank's write); write and commit errors
  // are reported, not returned. `on_phase` is told when each checkpoint and evaluation starts.
  absl::Status Run(const StepCallback& on_step = nullptr, const StopToken* stop = nullptr,
                   const PhaseCallback& on_phase = nullptr);

  // Whether the last Run ended early on a checkpointed stop (StopToken::RequestCheckpointedStop
  // on any rank): at step(), whose checkpoint it wrote when a dir is set.
  bool stopped_on_request() const { return stopped_on_request_; }

  // Saves a checkpoint of the current state (needs checkpoint.dir).
  absl::Status SaveCheckpoint();
  // With a parallel layout, that every rank opened the same data: each rank's data order (the
  // source, its content fingerprints, seq_len, seed, global batch and split; the held-out data's
  // too) equals rank 0's. InvalidArgument on every rank, naming the ranks that differ (a host
  // with another copy of the files at the same path), before the first step; OK without a
  // layout. A collective over the world: every rank calls it once, before training.
  absl::Status CheckSameData();
  // Restores params, Adam moments and the step from the newest usable checkpoint in
  // checkpoint.dir, whatever parallel layout wrote it (runtime/checkpoint/reshard.h: each rank
  // gathers its part by name and global offsets). NotFound when there is none (a fresh start).
  // Refuses (FailedPrecondition) a checkpoint of another model (its tensors, by name and whole
  // shape, are not this model's), another seed, another data order (CheckDataPosition), or
  // other optimizer or model settings unless config.override_checkpoint_settings
  // (CheckSettings), or one whose step is past config.steps (nothing would train). The data
  // order is the step's: the global batch
  // of step s is the sampler's micro-batches 0 .. dp * m - 1 of step s on every layout, so a
  // layout with another dp continues the same sequence when dp * micro_batches is unchanged.
  absl::StatusOr<LoadedCheckpoint> RestoreLatest();
  // Restores from a checkpoint already loaded into this rank's layout: its parameters must be
  // this model's exactly (names, shapes, offsets, slices), and its seed this run's.
  absl::Status Restore(const LoadedCheckpoint& checkpoint);

  // The settings the restored checkpoint was written with that this run changed
  // (config.override_checkpoint_settings); empty when none did or nothing was restored.
  const std::vector<SettingChange>& settings_overridden() const { return settings_overridden_; }

  // checkpoint.async: why each checkpoint that was not committed failed, oldest first.
  const std::vector<std::string>& checkpoint_errors() const { return checkpoint_errors_; }
  // Checkpoints committed whose old checkpoints could not all be deleted (checkpoint.keep; tried
  // again at the next commit), oldest first: warnings, not failures. Rank 0's (it commits).
  const std::vector<std::string>& checkpoint_warnings() const { return checkpoint_warnings_; }
  // Tests: runs on the async writer's thread before each shard write.
  void SetCheckpointWriteHookForTest(std::function<void(const ShardState&)> hook) {
    write_hook_ = std::move(hook);
  }
  // Tests: runs on the async writer's thread before each snapshot copy.
  void SetCheckpointCopyHookForTest(std::function<void()> hook) { copy_hook_ = std::move(hook); }

  int64_t step() const { return step_; }
  const AdamW& optimizer() const { return *adamw_; }
  const TrainConfig& config() const { return config_; }

 private:
  Trainer(Trainable* model, const data::Sampler* data, const TrainConfig& config,
          const Clock* clock, const ParallelRuntime* parallel, const data::Sampler* held_out,
          const device::Backend& ops, std::unique_ptr<AdamW> adamw);

  // FailedPrecondition unless the checkpoint's data position (order and sequences drawn) is what
  // this run's sampler gives at its step, so a resume reads exactly the sequences an
  // uninterrupted run would. A checkpoint without one passes for endless (markov) data only.
  absl::Status CheckDataPosition(const LoadedCheckpoint& c) const;
  // Aborted, naming the step and both values, when a step's loss or gradient norm (global under
  // a layout: every rank decides alike) is not finite. Called before the update, which would
  // write NaN into every parameter and Adam moment, and into every checkpoint after it (the
  // same check as Megatron-LM's check_for_nan_in_loss_and_grad).
  absl::Status RefuseNonFinite(const StepStats& stats) const;
  // FailedPrecondition naming each field when the checkpoint's settings are not this
  // run's, unless config.override_checkpoint_settings (then they are kept for
  // settings_overridden()).
  absl::Status CheckSettings(const LoadedCheckpoint& c);
  // Tokens per second, model FLOPs, MFU (over `devices` devices) and imbalance from the times
  // and tokens already in `stats`.
  void FinishStats(StepStats& stats, double tokens, int devices) const;
  // The model's memory actions since `before` (a step's share of the running totals).
  MemoryActionTotals MemoryActionsSince(const MemoryActionTotals& before) const;
  // The model's MoE op totals now less `before`, the ops with calls since.
  std::vector<MoeOpTotal> MoeOpsSince(const std::vector<MoeOpTotal>& before) const;

  // The parallel step and checkpoints (trainer_parallel.cc).
  absl::StatusOr<StepStats> StepParallel();
  absl::Status RunSchedule(StepStats& stats, std::vector<MicroBatchResult>& results);
  absl::Status SyncGradients();
  absl::StatusOr<double> ClipParallel();
  absl::Status ReduceStats(const std::vector<MicroBatchResult>& results, StepStats& stats);
  absl::Status SaveCheckpointParallel();
  // Agrees on every rank's write (a failure anywhere fails every rank with its cause) and gives
  // every rank every rank's record (a collective over the world).
  absl::StatusOr<std::vector<ShardRecord>> GatherShardRecords(
      const absl::StatusOr<ShardRecord>& written);
  // Every rank's `mine`, agreed over the world (AgreeOnStatus; `mine` itself without a layout).
  absl::Status AgreeOnWorld(const absl::Status& mine) const;
  // Gathers the records, has rank 0 commit `state` and agrees on the outcome (synchronous).
  absl::Status CommitShardParallel(const absl::StatusOr<ShardRecord>& written,
                                   const ShardState& state);

  // This rank's shard now (arrays borrowed from the model and optimizer: device memory).
  ShardState CurrentShardState() const;
  // CurrentShardState with host arrays: itself where the host addresses the device, else copies
  // of its arrays in `host` (device-to-host, the stream synchronised).
  absl::StatusOr<ShardState> HostShardState(std::vector<float> (&host)[3]) const;

  // checkpoint.async. A snapshot goes through: started (StartAsyncCheckpoint, at a checkpoint
  // step) -> every rank's shard durable -> committed by rank 0 in the background -> its outcome
  // agreed by every rank (last_saved_step_, or an error). Every transition happens at the same
  // step on every rank: the "durable" and "commit finished" flags ride on the gradient-norm
  // all-reduce every step performs anyway (ClipParallel), so following a snapshot costs no
  // collective of its own per step and nobody waits for rank 0's fsyncs.
  struct AsyncAgreement {
    float writing = 0;        // ranks whose shard is still being written
    float commit_open = 0;    // 1 while rank 0's background commit runs
    float commit_failed = 0;  // 1 once it has finished and failed
  };
  AsyncAgreement LocalAsyncState() const;
  // Snapshots the current state and starts its write (none may be in flight).
  absl::Status StartAsyncCheckpoint();
  // Waits for the in-flight write, if any, gathers the records and starts rank 0's background
  // commit (after resolving an earlier one); a failed write is recorded (RecordCheckpointError).
  void FinishAsyncCheckpoint(StepStats* stats);
  // Waits for the open background commit, if any, and agrees on its outcome (a collective).
  void FinishCommit(StepStats* stats);
  // The open commit, which every rank agrees has finished (`failed`: and failed), is resolved.
  void ResolveCommit(bool failed, StepStats* stats);
  // After every step: resolves a commit every rank agrees has finished, then starts the commit
  // of a snapshot every rank agrees is durable (not waiting for the next checkpoint step).
  absl::Status CommitIfDurable(StepStats& stats);
  void RecordCheckpointError(int64_t step, const absl::Status& why, StepStats* stats);
  // Before an optimizer update: waits until the in-flight snapshot has copied the parameters
  // and moments the update is about to change; the seconds waited.
  double WaitSnapshotCopied();
  absl::StatusOr<LoadedCheckpoint> RestoreLatestParallel();
  // checkpoint.dir is one directory for every rank (rank 0 commits every rank's shard from it):
  // rank 0 writes a token there and every rank reads it back; Unavailable on every rank, naming
  // the ranks that read something else, when one cannot (its host has its own disk at that path,
  // or lacks the mount), before any checkpoint is loaded or written. A collective.
  absl::Status CheckSharedCheckpointDir();
  // The whole model's tensors (every rank's, merged; a collective over the world).
  absl::StatusOr<TensorShapes> WholeModelShapes() const;

  Trainable* model_;
  const data::Sampler* data_;
  const data::Sampler* held_out_;  // nullptr: no evaluation
  TrainConfig config_;
  const Clock* clock_;
  const ParallelRuntime* parallel_;
  PipelineStage* stage_ = nullptr;  // the model, when `parallel_` is set
  device::Device& device_;          // the model's
  const device::Backend& ops_;      // its fp32 table: optimizer, clipping, gradient scaling
  std::unique_ptr<AdamW> adamw_;
  tensor::DeviceMemory bucket_;  // the gradient reductions' bucket (parallel layouts)
  int64_t step_ = 0;
  int64_t last_saved_step_ = -1;
  // The settings this run records in its checkpoints and compares on resume: the optimizer's
  // (run_settings.h) and config_.model_settings.
  const std::map<std::string, std::string> settings_;
  std::vector<SettingChange> settings_overridden_;
  // Parallel layouts: the ranges of grad_data() this rank counts in the global norm (its
  // norm_owner parameters), one sum_of_squares_ranges call a step.
  std::vector<int64_t> norm_begin_, norm_count_;
  std::unique_ptr<AsyncCheckpointWriter> async_;
  AsyncAgreement async_agreed_;  // as of the last step
  // The token Run was given (nullptr outside Run), and whether the last step's world all-reduce
  // (ClipParallel) carried a checkpointed stop from any rank.
  const StopToken* run_stop_ = nullptr;
  bool stop_agreed_ = false;
  bool stopped_on_request_ = false;
  int64_t commit_step_ = -1;  // the snapshot whose commit is open (every rank; -1: none)
  std::function<void(const ShardState&)> write_hook_;
  std::function<void()> copy_hook_;
  std::vector<std::string> checkpoint_errors_;
  std::vector<std::string> checkpoint_warnings_;
  // checkpoint.async: the retention error of the commit in flight (written by its thread, read
  // after WaitCommit).
  std::shared_ptr<std::string> commit_retention_;
  void NoteRetention(int64_t step, const std::string& retention_error);
};

}  // namespace furnace::train
