#include "worker/rank_progress.h"

#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <csignal>

#include "absl/strings/str_cat.h"
#include "runtime/base/clock.h"
#include "spdlog/spdlog.h"
#include "worker/rank_exit.h"

namespace furnace::worker {

void Progress::Write(furnace::v1::TelemetryRecord& record) {
  record.set_job_id(task_.job_id());
  record.set_attempt(task_.attempt());
  record.set_rank(task_.rank());
  record.set_total_steps(total_steps_.load());
  record.set_unix_time(RealClock().UnixSeconds());
  std::lock_guard<std::mutex> lock(mu_);
  record.set_seq(++seq_);  // under the lock: numbered in the order they enter the pipe
  (void)writer_.Write(record);
}

ProgressBeat::ProgressBeat(Progress& progress, std::string phase, double interval_s) {
  thread_ = std::thread([this, &progress, phase = std::move(phase), interval_s] {
    std::unique_lock<std::mutex> lock(mu_);
    while (
        !cv_.wait_for(lock, std::chrono::duration<double>(interval_s), [this] { return stop_; })) {
      lock.unlock();
      progress.Emit(phase, 0);
      lock.lock();
    }
  });
}

ProgressBeat::~ProgressBeat() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void Progress::EmitWatchdog(const furnace::v1::RankWatchdogRecord& watchdog) {
  furnace::v1::TelemetryRecord record;
  record.set_step(watchdog.step());
  record.set_phase(watchdog.phase());
  *record.mutable_watchdog() = watchdog;
  Write(record);
}

void Progress::Emit(const std::string& phase, uint64_t step, const std::string& message,
                    const comm::CommResult* result, const furnace::v1::StepTelemetry* train,
                    const furnace::v1::RankStartupTimes* startup) {
  furnace::v1::TelemetryRecord record;
  record.set_step(step);
  record.set_phase(phase);
  record.set_message(message);
  if (result != nullptr) {
    furnace::v1::CommResult* comm = record.add_comm();
    comm->set_collective(result->collective);
    comm->set_bytes(result->bytes);
    comm->set_world_size(static_cast<uint32_t>(result->world_size));
    comm->set_time_s(result->time_s);
    comm->set_algbw_gbps(result->algbw_gbps);
    comm->set_busbw_gbps(result->busbw_gbps);
    comm->set_verified(result->verified);
    comm->set_errors(result->errors);
  }
  if (train != nullptr) *record.mutable_train() = *train;
  if (startup != nullptr) *record.mutable_startup() = *startup;
  Write(record);
}

bool FaultTargets(const furnace::v1::RankTask& task, const std::string& mode) {
  const furnace::v1::FaultSpec& fault = task.spec().fault();
  if (fault.mode().empty() || fault.mode() != mode) return false;
  if (!fault.every_attempt() && task.attempt() != 1) return false;
  if (!fault.worker().empty()) return task.worker_id() == fault.worker();
  return static_cast<int64_t>(task.rank()) == fault.rank();
}

std::optional<int> MaybeInjectFault(const furnace::v1::RankTask& task, uint64_t completed,
                                    Progress& progress) {
  const furnace::v1::FaultSpec& fault = task.spec().fault();
  // health_check fires in worker/health_check.cc, before any step; fault.mean_steps fails at
  // random steps instead (fault_schedule.h).
  if (fault.mode().empty() || fault.mode() == "health_check" || fault.mean_steps() > 0 ||
      !FaultTargets(task, fault.mode()) || completed != fault.at_step()) {
    return std::nullopt;
  }
  if (fault.mode() == "crash") {
    spdlog::error("fault injection: crashing with SIGSEGV at step {}", completed);
    spdlog::default_logger()->flush();
    const rlimit no_core = {0, 0};
    setrlimit(RLIMIT_CORE, &no_core);  // a drill should not litter the disk with cores
    std::raise(SIGSEGV);
    return kRankExitError;  // only if SIGSEGV was somehow handled
  }
  if (fault.mode() == "hang") {
    spdlog::error("fault injection: hanging at step {} (no more progress records)", completed);
    spdlog::default_logger()->flush();
    while (true) pause();
  }
  if (fault.mode() == "exit") {
    const std::string message = absl::StrCat("fault injection: exiting with code ",
                                             fault.exit_code(), " at step ", completed);
    spdlog::error("{}", message);
    progress.Emit("failed", completed, message);
    return fault.exit_code();
  }
  spdlog::warn("unknown fault mode '{}' ignored", fault.mode());
  return std::nullopt;
}

}  // namespace furnace::worker
