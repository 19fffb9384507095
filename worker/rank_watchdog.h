// The rank's own watchdog: which phase the rank is in (start-up, a step, a checkpoint), how long
// each may take, and what the rank is blocked in when one overruns.
//
// Why in the rank and not only in the agent: the agent sees a rank that stopped sending records,
// nothing more. Inside the rank, the phase and the collective in flight are known
// (runtime/comm/in_flight.h), so a hang is reported as "hung in step 12: all_reduce on group
// dp[0,1] (2 ranks) for 8.0 s" — which group, which op, in which phase — and a rank blocked on a
// stopped peer is told apart from one stuck in its own code.
//
// Timeouts (WatchdogTimeoutsFor, from the job's `recovery:` section; no new fields):
//   start-up    recovery.start_timeout_s + recovery.hang_timeout_s: rendezvous may wait for peers
//               as long as the controller lets them start (start_timeout_s); building the model,
//               calibrating MoE schedules and loading the checkpoint get hang_timeout_s more.
//   step        recovery.hang_timeout_s, from the end of the previous step (what "no progress for
//               hang_timeout_s" meant before, now measured per step).
//   checkpoint  recovery.hang_timeout_s for each checkpoint (every N steps, `every: auto` or the
//               final one), a phase of its own that Trainer::Run's phase callback enters when the
//               checkpoint starts (so `auto`, decided after the step, needs no prediction), plus
//               the rank's shard bytes at kDataScanBytesPerS (AllowForCheckpointBytes), which the
//               start-up's checkpoint load gets too.
//   evaluation  recovery.hang_timeout_s for every parallel.micro_batches held-out batches a rank
//               runs (eval.batches / dp, rounded up; a batch is a forward only), entered the same
//               way, so a long evaluation is not taken for a hung step.
//   heartbeat   every min(1 s, hang_timeout_s / 4) the watchdog thread tells the agent the process
//               is alive and where it is; the agent's own no-record timeout (rank_supervisor.h:
//               FrozenTimeoutS) then only catches a frozen process (SIGSTOP, a deadlock that
//               stops this thread too), and is longer than the step timeout, so a rank blocked on
//               a frozen peer is reported by its own watchdog, naming the collective, before the
//               peer's agent gives up on the peer.
//
// Thread-safety: the Enter*/Disarm methods are for the rank's main thread, Check for the watchdog
// thread (or a test); all may run concurrently.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "furnace/v1/job.pb.h"
#include "furnace/v1/telemetry.pb.h"
#include "runtime/base/clock.h"
#include "runtime/comm/in_flight.h"

namespace furnace::worker {

struct WatchdogTimeouts {
  double startup_s = 120;
  double step_s = 60;
  double checkpoint_s = 60;
  double eval_s = 60;
  double heartbeat_s = 1;
};
WatchdogTimeouts WatchdogTimeoutsFor(const furnace::v1::RecoverySpec& recovery);
// The start-up's extra time for the data a rank reads before training (runtime/data/
// data_sources.h: DataReadAtOpen): its indexed datasets' .idx files whole (20 bytes a sequence
// with Megatron's one sequence a document: 2 GB for 100M), counted at kDataScanBytesPerS, and the
// fingerprint's scattered tokens (1,024 a dataset), counted at kScatteredReadS each, a slow disk's
// seek (they are asked for together, so a disk that overlaps them takes far less), which the fixed
// start-up budget could take for a hang.
inline constexpr double kDataScanBytesPerS = 100e6;
inline constexpr double kScatteredReadS = 0.01;
double DataScanAllowanceS(uint64_t sequential_bytes, int64_t scattered_reads);
// The evaluation's share of them for a train job: step_s for each `micro_batches` held-out batches
// of the `batches` its `dp` data-parallel ranks share (at least step_s).
double EvalTimeoutS(const WatchdogTimeouts& timeouts, int64_t batches, int64_t dp,
                    int64_t micro_batches);

class RankWatchdog {
 public:
  RankWatchdog(WatchdogTimeouts timeouts, const Clock& clock,
               const comm::InFlightCollectives& in_flight);

  // Start-up: the first call starts its clock; later calls only say which part runs now
  // ("rendezvous", "model", "checkpoint load").
  void EnterStartup(const std::string& detail);
  // Step `step` (1-based) starts now.
  void EnterStep(uint64_t step);
  // A checkpoint of the state after step `after_step` starts now (`final`: the one after the last
  // step).
  void EnterCheckpoint(uint64_t after_step, bool final);
  // The job's largest checkpoint shard is `bytes` (a rank's parameters and Adam moments):
  // writing one (each checkpoint phase, which every rank ends waiting for the slowest) and reading
  // one (the start-up, when called during it: the checkpoint load is its last part) get bytes /
  // kDataScanBytesPerS more than hang_timeout_s, so a large shard fsynced on a slow disk is not
  // taken for a hang; below 0.1 s none. Call once, before the checkpoint load.
  void AllowForCheckpointBytes(uint64_t bytes);
  // A held-out evaluation after step `after_step` starts now.
  void EnterEval(uint64_t after_step);
  // The rank is finishing (`outcome`: how its work ended, e.g. "training failed at step 12:
  // ..."): tearing down its groups, which can block on a dead peer. hang_timeout_s for it, and a
  // hang reported with the outcome, so the cause it was about to report is not lost.
  void EnterFinishing(const std::string& outcome);
  // Nothing more to watch.
  void Disarm();

  // A heartbeat while the phase is within its timeout; once it is overrun, one KIND_HUNG record
  // with the reason; KIND_UNSPECIFIED when disarmed or after the hang was reported.
  furnace::v1::RankWatchdogRecord Check();

  const WatchdogTimeouts& timeouts() const { return timeouts_; }

 private:
  enum class Phase { kNone, kStartup, kStep, kCheckpoint, kEval, kFinishing };
  void Enter(Phase phase, uint64_t step, const std::string& detail, double timeout_s);
  // " + 20.0 s for the largest checkpoint shard (2.00 GB)" after a timeout's setting, if any.
  void AppendCheckpointAllowanceLocked(std::string& limit) const;

  const WatchdogTimeouts timeouts_;
  const Clock& clock_;
  const comm::InFlightCollectives& in_flight_;

  std::mutex mu_;
  Phase phase_ = Phase::kNone;     // guarded by mu_
  uint64_t step_ = 0;              // guarded by mu_
  std::string detail_;             // guarded by mu_
  double since_s_ = 0;             // guarded by mu_
  double timeout_s_ = 0;           // guarded by mu_
  bool reported_ = false;          // guarded by mu_
  double checkpoint_extra_s_ = 0;  // AllowForCheckpointBytes; guarded by mu_
  uint64_t checkpoint_bytes_ = 0;  // the shard it allows for; guarded by mu_
};

// Runs RankWatchdog::Check every heartbeat_s on a thread of its own and hands each record to
// `emit` (on that thread). The destructor stops and joins it.
class WatchdogThread {
 public:
  WatchdogThread(RankWatchdog& watchdog,
                 std::function<void(const furnace::v1::RankWatchdogRecord&)> emit);
  ~WatchdogThread();
  WatchdogThread(const WatchdogThread&) = delete;
  WatchdogThread& operator=(const WatchdogThread&) = delete;

 private:
  void Main();

  RankWatchdog& watchdog_;
  const std::function<void(const furnace::v1::RankWatchdogRecord&)> emit_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;  // guarded by mu_
  std::thread thread_;
};

}  // namespace furnace::worker
