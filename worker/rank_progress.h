// What a rank process tells its agent (telemetry records on fd 3) and the deliberate failures of
// spec.fault, shared by every job kind's rank program.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "furnace/v1/agent.pb.h"
#include "runtime/comm/commcheck.h"
#include "worker/telemetry_pipe.h"

namespace furnace::worker {

// Emits this rank's telemetry records. A broken pipe (the agent is gone) is not the rank's
// problem: PR_SET_PDEATHSIG ends it anyway. Every record is progress for the agent's watchdog.
// Thread-safe: the rank's watchdog thread emits its records through the same pipe.
class Progress {
 public:
  explicit Progress(const furnace::v1::RankTask& task) : task_(task) {}

  void Emit(const std::string& phase, uint64_t step, const std::string& message = "",
            const comm::CommResult* result = nullptr,
            const furnace::v1::StepTelemetry* train = nullptr,
            const furnace::v1::RankStartupTimes* startup = nullptr);
  // A record of the rank's watchdog (worker/rank_watchdog.h), for the agent only.
  void EmitWatchdog(const furnace::v1::RankWatchdogRecord& watchdog);
  void set_total_steps(uint64_t total) { total_steps_.store(total); }

 private:
  void Write(furnace::v1::TelemetryRecord& record);

  const furnace::v1::RankTask& task_;
  std::mutex mu_;
  TelemetryWriter writer_;  // guarded by mu_
  uint64_t seq_ = 0;        // guarded by mu_: the last record's TelemetryRecord.seq
  std::atomic<uint64_t> total_steps_{0};
};

// While it lives, a record of `phase` every `interval_s` from a thread of its own: a rank blocked
// in a call that retries for as long as recovery.start_timeout_s allows (marking its arrival while
// the controller restarts) is alive to the agent, whose hang watchdog kills a rank silent for
// recovery.hang_timeout_s (the rank's own watchdog, which speaks for it later, has not started).
class ProgressBeat {
 public:
  ProgressBeat(Progress& progress, std::string phase, double interval_s = 1.0);
  ~ProgressBeat();
  ProgressBeat(const ProgressBeat&) = delete;
  ProgressBeat& operator=(const ProgressBeat&) = delete;

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;  // guarded by mu_
  std::thread thread_;
};

// True when spec.fault has this mode and targets this rank in this attempt: the rank on
// fault.worker when that is set, else rank fault.rank; only attempt 1 unless fault.every_attempt.
bool FaultTargets(const furnace::v1::RankTask& task, const std::string& mode);

// Fires spec.fault when it applies to this rank, attempt and step. Returns the exit code for
// mode "exit"; "crash" and "hang" do not return.
std::optional<int> MaybeInjectFault(const furnace::v1::RankTask& task, uint64_t completed,
                                    Progress& progress);

}  // namespace furnace::worker
