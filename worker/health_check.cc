#include "worker/health_check.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "runtime/comm/commcheck.h"
#include "spdlog/spdlog.h"
#include "worker/rank_groups.h"

namespace furnace::worker {
namespace {

constexpr char kArrivedPrefix[] = "health/arrived/";

std::string ArrivedKey(uint32_t rank) { return absl::StrCat(kArrivedPrefix, rank); }

}  // namespace

absl::Status RunHealthCheck(const furnace::v1::RankTask& task, Progress& progress,
                            device::Device& dev) {
  const double bound = task.spec().recovery().health_check_s();
  if (bound <= 0 || task.world_size() <= 1) return absl::OkStatus();
  const auto start = std::chrono::steady_clock::now();
  progress.Emit("health_check", 0);
  if (FaultTargets(task, "health_check")) {
    // Alive but never arriving, like a rank that cannot reach the rendezvous: it keeps reporting
    // progress, so it is the check (not the hang watchdog) that names it.
    spdlog::error("fault injection: this rank drops out of its health check (never arrives)");
    spdlog::default_logger()->flush();
    while (true) {
      progress.Emit("health_check", 0);
      sleep(1);
    }
  }
  // Reaching the controller is start-up (bounded like every rendezvous by the start timeout); the
  // check's own bound starts at this rank's arrival.
  absl::StatusOr<Rendezvous> rendezvous = OpenRendezvous(task, StartTimeoutS(task));
  if (!rendezvous.ok()) return rendezvous.status();
  GrpcKvStore& store = *rendezvous->store;
  {
    // The mark retries while the controller is away, up to the start timeout: alive meanwhile.
    const ProgressBeat beat(progress, "health_check");
    if (absl::Status s = store.Set(ArrivedKey(task.rank()), "1"); !s.ok()) {
      return absl::Status(s.code(),
                          absl::StrCat("health check: cannot mark arrival: ", s.message()));
    }
  }
  // Waited for in slices, each a progress record, so the agent's hang watchdog sees a rank that
  // waits for a late peer as alive. The wait is indexed (a count of health/arrived/<r> keys, not
  // their names): naming all N keys made the arrival O(N^2) on the wire at thousands of ranks.
  // The peers' arrival is start-up too (a loaded host can take seconds to exec and link a rank),
  // so it is bounded by the start timeout when that is longer; the collectives below get
  // recovery.health_check_s.
  const double arrival_bound = std::max(bound, StartTimeoutS(task));
  // The field the bound came from, for the messages below.
  const char* bound_field =
      StartTimeoutS(task) >= bound ? "recovery.start_timeout_s" : "recovery.health_check_s";
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                            std::chrono::duration<double>(arrival_bound));
  while (true) {
    const double left =
        std::chrono::duration<double>(deadline - std::chrono::steady_clock::now()).count();
    absl::StatusOr<GrpcKvStore::Arrivals> arrivals =
        store.WaitIndexed(kArrivedPrefix, task.world_size(), std::clamp(left, 0.0, 1.0));
    // DEADLINE_EXCEEDED: the controller was unreachable for the slice; anything else (e.g. the
    // attempt is over) ends the check.
    if (!arrivals.ok() && !absl::IsDeadlineExceeded(arrivals.status())) return arrivals.status();
    if (arrivals.ok() && arrivals->complete) break;
    progress.Emit("health_check", 0);
    if (left > 1.0) continue;
    if (!arrivals.ok()) {
      return absl::DeadlineExceededError(
          absl::StrFormat("health check: the peers' arrival could not be read within %.0f s of "
                          "this rank (%s): %s",
                          arrival_bound, bound_field, arrivals.status().message()));
    }
    const size_t missing = task.world_size() - arrivals->present;
    std::string named = absl::StrJoin(arrivals->missing, ", ");
    if (missing > arrivals->missing.size()) {
      absl::StrAppend(&named, ", ... (", missing - arrivals->missing.size(), " more)");
    }
    return absl::DeadlineExceededError(
        absl::StrFormat("health check: rank%s %s did not arrive within %.0f s of this rank (%s)",
                        missing == 1 ? "" : "s", named, arrival_bound, bound_field));
  }
  // The check's collectives run where the job's will: on the rank's device (resources.device),
  // NCCL between GPUs, so a GPU or link that cannot carry a collective fails here, before any
  // model is built. Connecting is start-up too (NCCL's initialisation takes seconds at scale).
  absl::StatusOr<std::unique_ptr<comm::Communicator>> group = ConnectWorldGroup(
      task, *rendezvous, "health/group", arrival_bound, bound,
      [&progress] { progress.Emit("health_check", 0); }, dev);
  if (!group.ok()) {
    return absl::Status(
        group.status().code(),
        absl::StrCat("health check: connecting to the other ranks: ", group.status().message()));
  }
  comm::CommcheckOptions options;
  options.min_bytes = 4096;
  options.max_bytes = 65536;
  options.step_factor = 16;
  options.iters = 1;
  options.warmup_iters = 0;
  options.rounds = 1;
  options.timeout_s = bound;
  if (absl::Status s = comm::RunCommcheck(**group, dev, options, nullptr); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("health check: ", s.message()));
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  spdlog::info(
      "health check passed: {} ranks arrived, commcheck collectives verified on {} ({:.2f} s)",
      task.world_size(), dev.name(), seconds);
  return absl::OkStatus();
}

}  // namespace furnace::worker
