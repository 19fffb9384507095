#include "worker/rank_main.h"

#include <signal.h>
#include <unistd.h>

#include <csignal>
#include <fstream>
#include <optional>

#include "absl/strings/str_cat.h"
#include "runtime/base/clock.h"
#include "runtime/base/open_files.h"
#include "runtime/comm/commcheck.h"
#include "runtime/device/current_stream.h"
#include "spdlog/sinks/stdout_sinks.h"
#include "spdlog/spdlog.h"
#include "worker/health_check.h"
#include "worker/rank_device.h"
#include "worker/rank_exit.h"
#include "worker/rank_groups.h"
#include "worker/rank_progress.h"
#include "worker/rank_stop_signal.h"
#include "worker/telemetry_pipe.h"
#include "worker/train_rank.h"

namespace furnace::worker {
namespace {

comm::CommcheckOptions CommcheckOptionsFrom(const furnace::v1::CommcheckSpec& spec) {
  comm::CommcheckOptions options;
  options.min_bytes = spec.min_bytes();
  options.max_bytes = spec.max_bytes();
  options.step_factor = spec.step_factor();
  options.iters = spec.iters();
  options.warmup_iters = spec.warmup_iters();
  options.rounds = spec.rounds();
  options.collectives.assign(spec.collectives().begin(), spec.collectives().end());
  options.timeout_s = spec.timeout_s();
  return options;
}

// Returns the exit code.
int RunCommcheck(const furnace::v1::RankTask& task, Progress& progress, device::Device& dev) {
  const furnace::v1::CommcheckSpec& spec = task.spec().commcheck();
  progress.set_total_steps(spec.rounds());
  const double start_timeout_s = StartTimeoutS(task);
  absl::StatusOr<Rendezvous> rendezvous = OpenRendezvous(task, start_timeout_s);
  if (!rendezvous.ok()) {
    const std::string message(rendezvous.status().message());
    spdlog::error("{}", message);
    progress.Emit("failed", 0, message);
    return kRankExitError;
  }
  // The collectives run on the rank's device (resources.device): NCCL between GPUs, Gloo
  // between CPU ranks (rank_groups.h ConnectWorldGroup).
  const comm::CommcheckOptions options = CommcheckOptionsFrom(spec);
  progress.Emit("rendezvous", 0);
  absl::StatusOr<std::unique_ptr<comm::Communicator>> group = ConnectWorldGroup(
      task, *rendezvous, "commcheck", start_timeout_s, options.timeout_s,
      [&progress] { progress.Emit("rendezvous", 0); }, dev);
  if (!group.ok()) {
    const std::string message = absl::StrCat("rendezvous failed: ", group.status().ToString());
    spdlog::error("{}", message);
    progress.Emit("failed", 0, message);
    return kRankExitError;
  }
  spdlog::info("connected; commcheck: {} round(s) on {}", spec.rounds(), dev.name());

  std::optional<int> fault_exit;
  const absl::Status status = comm::RunCommcheck(
      **group, dev, options,
      [&](uint32_t round, const comm::CommResult* result, bool round_done) -> absl::Status {
        if (result != nullptr) {
          spdlog::info(
              "round {} {:<9} {:>10} B  {:>10.1f} us  algbw {:7.3f} GB/s  busbw {:7.3f} "
              "GB/s  {}",
              round, result->collective, result->bytes, result->time_s * 1e6, result->algbw_gbps,
              result->busbw_gbps,
              result->verified ? "OK" : absl::StrCat(result->errors, " ERRORS"));
          progress.Emit("running", round, "", result);
        }
        if (round_done) {
          progress.Emit("running", round + 1);
          fault_exit = MaybeInjectFault(task, round + 1, progress);
          if (fault_exit) return absl::CancelledError("fault injection");
        }
        return absl::OkStatus();
      });
  if (fault_exit) return *fault_exit;
  if (!status.ok()) {
    const std::string message = absl::StrCat("commcheck failed: ", status.ToString());
    spdlog::error("{}", message);
    progress.Emit("failed", 0, message);
    return kRankExitError;
  }
  spdlog::info("commcheck passed");
  progress.Emit("done", spec.rounds(), "commcheck passed");
  return kRankExitSuccess;
}

}  // namespace

int RankMain(const std::string& task_path) {
  InstallStopSignal();  // SIGUSR1: a stop that keeps the progress (rank_stop_signal.h)
  furnace::v1::RankTask task;
  {
    std::ifstream in(task_path, std::ios::binary);
    if (!in || !task.ParseFromIstream(&in)) {
      std::fprintf(stderr, "furnace-worker rank: cannot read the rank task %s\n",
                   task_path.c_str());
      Progress progress(task);
      progress.Emit("failed", 0, absl::StrCat("cannot read the rank task ", task_path));
      return kRankExitError;
    }
  }
  auto logger = spdlog::stderr_logger_mt("rank");
  logger->set_pattern(absl::StrCat("[%Y-%m-%d %H:%M:%S.%e] [", task.job_id(), " a", task.attempt(),
                                   " r", task.rank(), "] [%l] %v"));
  spdlog::set_default_logger(logger);
  if (!task.log_level().empty()) spdlog::set_level(spdlog::level::from_str(task.log_level()));
  spdlog::flush_on(spdlog::level::info);
  // A blend of hundreds of datasets holds more descriptors than systemd's soft limit of 1024
  // (runtime/base/open_files.h); a failure leaves the limit as it was, which may still do.
  if (absl::StatusOr<OpenFileLimit> files = RaiseOpenFileLimit(); files.ok()) {
    spdlog::debug("{}", DescribeOpenFileLimit(*files));
  } else {
    spdlog::warn("open files: {}", std::string(files.status().message()));
  }

  Progress progress(task);
  progress.Emit("starting", 0);
  spdlog::info("rank {} of {}, kind {}, pid {}", task.rank(), task.world_size(), task.spec().kind(),
               getpid());
  if (std::optional<int> code = MaybeInjectFault(task, 0, progress)) return *code;

  const bool known = task.spec().kind() == "commcheck" || task.spec().kind() == "train";
  if (!known) {
    const std::string message =
        absl::StrCat("job kind '", task.spec().kind(), "' is not supported by this build");
    spdlog::error("{}", message);
    progress.Emit("failed", 0, message);
    return kRankExitUnknownKind;
  }
  // The rank's device (resources.device), made once before anything runs on it: a device this
  // worker cannot give (no GPU, a build without CUDA) is bad input, named before any rendezvous.
  // Its compute stream is this thread's from here on.
  absl::StatusOr<RankDevice> rank_device = MakeRankDevice(task);
  if (!rank_device.ok()) {
    const std::string message = absl::StrCat("resources.device ", task.spec().resources().device(),
                                             ": ", rank_device.status().message());
    spdlog::error("{}", message);
    progress.Emit("failed", 0, message);
    return absl::IsUnavailable(rank_device.status()) ||
                   absl::IsInvalidArgument(rank_device.status())
               ? kRankExitBadInput
               : kRankExitError;
  }
  const device::StreamScope on_compute(*rank_device->compute);
  // Every attempt's ranks vet each other before the real work (recovery.health_check_s).
  if (absl::Status health = RunHealthCheck(task, progress, *rank_device->device); !health.ok()) {
    const std::string message(health.message());
    spdlog::error("{}", message);
    progress.Emit("failed", 0, message);
    return kRankExitHealthCheck;
  }
  if (task.spec().kind() == "commcheck") {
    return RunCommcheck(task, progress, *rank_device->device);
  }
  return RunTrainRank(task, progress, *rank_device);
}

}  // namespace furnace::worker
