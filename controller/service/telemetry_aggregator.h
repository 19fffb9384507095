// TelemetryAggregator: turns the per-rank telemetry records of a job (their typed StepTelemetry)
// into one StepRecord per training step (once every rank of the attempt reported it), keeps the
// job's running totals for monitoring, and writes raw records and steps to the JobStore.
//
// What is kept (bench/controlplane/REPORT.md: at 12,288 ranks a step is 12,288 records):
//  - every aggregated step, for the life of the job (JobStore job_steps: dashboards, reports);
//  - raw per-rank records (JobStore telemetry), a bounded sample: every record that is not a
//    step's routine telemetry (phases, start-up points, final words, commcheck results), rank 0's
//    every step (`furnace status` shows its newest), and of the other ranks about kRawPerStep
//    records per step: rank r's record of step s when (s + r) % stride == 0, stride =
//    ceil(world / kRawPerStep), so every rank is sampled every `stride` steps. The newest
//    RawRecordsKept(world) = max(5000, 2 * world) rows per job stay: every rank's last sample;
//  - in memory, per job, at most kMaxPendingSteps steps still waiting for ranks (the caller may
//    allow more for a while: after a restart, agents push what they held, each its own backlog
//    first), and the totals.
//    A step that cannot complete any more (a newer step completed, the bound passed: a rank whose
//    record never comes must not grow the controller) is stored with the ranks that reported it
//    (StepRecord.ranks below the world): it was trained, so the series, the totals and the
//    goodput keep it. Its sums (tokens, expert counts) are those ranks' only.
//    A step is each rank's record once: a rank's record that comes again (a batch re-sent after
//    its answer was lost, or held records an agent pushes again after it registers anew) is not
//    counted twice, nor does it complete a step another rank has not reported.
//    The steps waiting for ranks live only here: a controller killed outright loses them, and gets
//    their records again from the agents, which hold each step record until Settled says its step
//    is stored (worker/unsettled_records.h).
//
// What it owns: per job, the steps still waiting for ranks, the newest aggregated step and the
// totals (tokens, planner bytes, communication bytes, MoE op bytes and seconds, checkpoint
// seconds), and the goodput ledger (controller/store/goodput.h), fed every stored step and
// rebuilt from the stored steps at start; the counters of records received and dropped by agents.
// The exported totals (the Prometheus counters: tokens, planner, communication and MoE op bytes
// and seconds, the goodput's productive and lost seconds and redone steps) count a step once it
// is committed, so they never run ahead of the store they are rebuilt from at start: a controller
// restarted after a crash exports at least what it exported before, never less (a counter that
// goes down reads to Prometheus as a reset, and rate() then shows the whole total as one spike).
// Threading: Accumulate, CountStep, NoteBatch, TrimDue and Fill are externally synchronised (the
// Controller calls them holding its state mutex); Store only queues writes and may be called
// without it. Every write (raw records, steps) goes through the group commit's thread, so no
// insert or fsync happens under the state mutex; the totals have a mutex of their own, which that
// thread takes when a step is committed.
// Errors: a step that cannot be stored is logged, and not counted in the totals (the dashboards
// lose a point, training goes on); Store returns the store's error, and the agent re-sends the
// batch.
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "controller/service/metrics_snapshot.h"
#include "controller/store/goodput.h"
#include "controller/store/group_commit.h"
#include "controller/store/job_store.h"
#include "furnace/v1/agent.pb.h"
#include "furnace/v1/controller.pb.h"
#include "furnace/v1/telemetry.pb.h"

namespace furnace::controller {

class TelemetryAggregator {
 public:
  explicit TelemetryAggregator(JobStore& store);

  // Counts a batch's records and the records its agent reports having dropped.
  void NoteBatch(const furnace::v1::TelemetryBatch& batch);
  // One rank's record of a training step of a job whose attempts have `world_size` ranks. True
  // when it queued a step for the store (it completed this one, or stored older ones that can no
  // longer complete), ahead of what Store queues next. Past `max_pending` steps waiting for ranks
  // the oldest is stored with the ranks it has.
  bool Accumulate(const std::string& job_id, uint32_t world_size,
                  const furnace::v1::TelemetryRecord& record,
                  size_t max_pending = kMaxPendingSteps);
  // Adds a stored step to the job's state and totals (rebuilding them at start).
  void CountStep(const std::string& job_id, const furnace::v1::StepRecord& step);
  // Whether the record is written raw (see the file comment); the others only feed the steps.
  static constexpr uint32_t kRawPerStep = 256;
  static constexpr size_t kMaxPendingSteps = 64;
  // The bound for a while after the controller starts (the caller's choice): the first agent to
  // register again pushes its held records and its ranks' backlog before the others come.
  static constexpr size_t kMaxPendingStepsAfterStart = 1024;
  // A step whose write failed (a full or failing disk) is written again, every kStepRetryS, up to
  // kStepWriteTries times in all; until then Settled keeps the agents' records of it.
  static constexpr double kStepRetryS = 1.0;
  static constexpr int kStepWriteTries = 60;
  // Raw records are written behind; past this many writes waiting for the disk, more are dropped
  // (ResourceExhausted to Store's callback), so a slow disk cannot grow the controller's memory.
  static constexpr size_t kMaxQueuedWrites = 4096;
  static bool KeepRaw(const furnace::v1::TelemetryRecord& record, uint32_t world_size);
  static int RawRecordsKept(uint32_t world_size);
  // The jobs (id -> world size) whose raw records are due for trimming after `added` more.
  struct Trim {
    std::string job_id;
    int keep = 0;
  };
  std::vector<Trim> TrimDue(const std::map<std::string, uint32_t>& jobs, size_t added);
  // Writes raw records (and rank 0's commcheck results), then trims; `done` gets the status once
  // they are committed (on the group commit's thread), or at once when there is nothing to write
  // and `after_steps` is false (with it, after the steps Accumulate queued before are committed).
  // Group commit (controller/store/group_commit.h): thousands of agents pushing a step's records
  // cost a few transactions, not one each.
  void Store(std::vector<furnace::v1::TelemetryRecord> records, std::vector<Trim> trim,
             bool after_steps, std::function<void(absl::Status)> done);
  // The job's step fields of its metrics.
  void Fill(const std::string& job_id, JobMetrics& metrics) const;
  // The job's newest aggregated step, if one was.
  std::optional<furnace::v1::StepRecord> LastStep(const std::string& job_id) const;
  // The job's newest held-out evaluation (eval.every), if any ran.
  std::optional<furnace::v1::EvalTelemetry> LastEval(const std::string& job_id) const;
  // Where the job's time went, given its attempts (goodput.h: GoodputLedger::Report).
  furnace::v1::JobGoodput Goodput(const std::string& job_id,
                                  const std::vector<furnace::v1::AttemptInfo>& attempts,
                                  bool active, double now_unix) const;
  // What a new attempt's ranks get for checkpoint.every auto (goodput.h: MakeCheckpointHint).
  // `cluster`: the failure rate over every job's attempts; `ranks`: the new attempt's.
  furnace::v1::CheckpointHint CheckpointHint(const std::string& job_id,
                                             const std::vector<furnace::v1::AttemptInfo>& attempts,
                                             double now_unix, const ClusterFailureRate& cluster,
                                             int ranks) const;
  // How far the job's steps are stored (committed, not only queued): every step record of the
  // job at or below the answer's (attempt, step) is in a stored step or of one stored without it;
  // below a step whose write failed and is to be tried again. `all` once `ended` (the caller says
  // the job is over, or unknown) and none of its steps waits for ranks or for the disk. Agents
  // hold their step records until this covers them (TelemetryBatch, v1 telemetry.proto), so a
  // controller killed while merging loses none.
  furnace::v1::SettledSteps Settled(const std::string& job_id, bool ended) const;
  // Steps of the job still waiting for ranks (at most kMaxPendingSteps).
  size_t PendingSteps(const std::string& job_id) const;
  // The jobs with steps still waiting for ranks.
  std::vector<std::string> JobsWithPendingSteps() const;
  // The job's attempts before `below_attempt` ended (and their ranks' last batches had time to
  // come): their steps still waiting for ranks never complete, and are stored with the ranks that
  // reported them. True when it queued any.
  bool StoreUnfinished(const std::string& job_id,
                       uint32_t below_attempt = std::numeric_limits<uint32_t>::max());
  // Drops what it holds of the job (an ended job the controller forgets).
  void Forget(const std::string& job_id);
  // Writes again the steps whose write failed, when kStepRetryS has passed since the last try.
  void RetryFailedWrites(double now_mono);
  uint64_t dropped() const { return telemetry_dropped_; }
  uint64_t records() const { return telemetry_records_; }

 private:
  // Per-rank records of a step are combined into one StepRecord once every rank of the attempt
  // has reported it (or it can no longer complete: then with the ranks that did).
  struct PendingStep {
    furnace::v1::StepRecord record;
    uint32_t ranks = 0;
    // The ranks whose record is counted, [rank]: a re-sent batch (an agent retries a push whose
    // answer it lost) brings a rank's record again, and it must not stand in for another rank's.
    std::vector<bool> seen;
    double loss_sum = 0, aux_sum = 0, mfu_sum = 0, grad_norm_sum = 0;
    double model_flops = 0, peak_sum = 0;  // the step's model FLOPs; the ranks' peaks, summed
    bool peaks_known = true;               // every rank so far reported its peak
    uint32_t loss_n = 0;
    std::vector<std::vector<double>> expert_tokens;  // [layer][expert], summed
    std::map<int, uint64_t> planner;                 // v1::PlannerAction -> bytes, summed
    // (v1::CollectiveOp, v1::ParallelGroup) -> bytes, seconds and calls summed over ranks.
    std::map<std::pair<int, int>, furnace::v1::CommTelemetry> comm;
    std::vector<furnace::v1::MoeLayerSchedule> schedules;        // [layer], the first rank's
    std::map<std::string, furnace::v1::MoeOpTelemetry> moe_ops;  // by op, summed over ranks
  };
  struct JobSteps {
    std::map<std::pair<uint32_t, uint64_t>, PendingStep> pending_steps;
    bool has_step = false;
    furnace::v1::StepRecord last_step;
    double last_checkpoint_s = -1;
    double last_checkpoint_stall_s = -1;
    uint64_t checkpoint_failures = 0;  // checkpoints the ranks could not commit (rank 0 says)
    std::optional<furnace::v1::EvalTelemetry> last_eval;  // the newest held-out evaluation
    uint64_t records_since_trim = 0;
  };
  // Stores the step: complete, or with the ranks that reported it (pending.seen has the world).
  void FinishStep(const std::string& job_id, PendingStep& pending);
  // Queues the step's write (its `tries`-th); counted in the totals once it is committed.
  void WriteStep(const std::string& job_id, const furnace::v1::StepRecord& step, int tries);
  // The newest step, checkpoint and evaluation readings (at once).
  void NoteStep(const std::string& job_id, const furnace::v1::StepRecord& step);
  // The exported totals and the goodput ledger (once the step is stored).
  void AddTotals(const std::string& job_id, const furnace::v1::StepRecord& step);

  struct Totals {
    double tokens = 0;
    // The memory planner's decisions and emergency offloads, the late reloads (all ranks).
    double planner_decisions = 0, emergency_offloads = 0, late_reloads = 0;
    // Collective drops: the agreements (each once), the buffers dropped (all ranks), the
    // agreements' time (the slowest rank's, per step).
    double agreements = 0, agreed_drops = 0, agreement_seconds = 0;
    // Counters by Prometheus label (v1::PlannerActionLabel, v1::CollectiveOpLabel).
    std::map<std::string, double> planner, comm;
    // By MoE op name (MoeOpTelemetry.op).
    std::map<std::string, double> moe_op_bytes, moe_op_seconds;
    // Exported as counters too (productive and lost seconds, redone steps).
    GoodputLedger goodput;
    // The newest stored step's (attempt, step), if any; steps queued for the store, not yet
    // written (Settled).
    std::optional<std::pair<uint32_t, uint64_t>> committed;
    uint64_t steps_writing = 0;
    // Steps whose write failed, to be written again (RetryFailedWrites): each with its tries, and
    // whether a write of it is queued (not queued twice: each success counts it in the totals).
    struct FailedStep {
      furnace::v1::StepRecord step;
      int tries = 0;
      bool writing = false;
    };
    std::map<std::pair<uint32_t, uint64_t>, FailedStep> failed;
  };
  // The step is stored (at start, or its write committed): Totals.committed (totals_mu_ held).
  static void NoteCommitted(Totals& totals, const furnace::v1::StepRecord& step);

  JobStore& store_;
  // Before commit_: its callbacks, which add to them, run until commit_ is destroyed.
  mutable std::mutex totals_mu_;
  std::map<std::string, Totals> totals_;  // guarded by totals_mu_
  GroupCommit commit_{store_};            // Store's writes
  std::map<std::string, JobSteps> jobs_;
  uint64_t telemetry_dropped_ = 0;   // records agents reported dropping
  uint64_t telemetry_records_ = 0;   // records received
  double last_retry_mono_ = -1e300;  // RetryFailedWrites' last try (externally synchronised)
};

}  // namespace furnace::controller
