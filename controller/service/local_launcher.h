// LocalLauncher: the embedded default (`--local-workers N`). It keeps N `furnace-worker` daemons
// running on this machine, one per slot, and respawns one that dies (after a short delay, so a
// worker that cannot start does not spin). Worker pids are recorded in the job store so a
// controller restarted on the same state dir adopts the workers that are still alive instead of
// starting a second set; adopted workers are watched with kill(pid, 0) since they are not our
// children.
//
// Threading: Start() spawns a monitor thread; Stop() terminates the workers and joins it.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "controller/service/controller.h"

namespace furnace::controller {

struct LocalLauncherOptions {
  uint32_t workers = 0;
  std::string worker_binary;       // path to furnace-worker
  std::string controller_address;  // what the workers dial
  std::string state_dir;           // workers get <state_dir>/workers/slot-<i>
  std::string log_level = "info";
  // Passed on to every worker after the flags above: the controller's TLS files, join token file
  // and --insecure (main.cc), so local workers dial it the way it listens.
  std::vector<std::string> extra_args;
  // The controller's --data-root / --checkpoint-root, passed on: workers on this machine confine
  // the ranks' files to the same directories (empty: not confined).
  std::string data_root;
  std::string checkpoint_root;
  // Passed to every worker as --max-stop-grace and --shutdown-grace: at shutdown its agent gives a
  // train rank up to the first to save the step in progress, then the second before SIGKILL.
  double rank_checkpoint_grace_s = 60;
  double rank_term_grace_s = 10;
};

class LocalLauncher {
 public:
  LocalLauncher(const LocalLauncherOptions& options, Controller& controller);
  ~LocalLauncher();
  void Start();
  // How long Stop() waits for a worker: its agent's stop of its ranks (the checkpoint grace, then
  // the term grace) and the few seconds it takes to deliver their last reports.
  double StopTimeoutS() const;
  // Sends SIGTERM to every worker and waits for them up to StopTimeoutS(), then SIGKILL (their
  // ranks die with them). `hurry` is polled while waiting: once it says true, the workers still
  // running get SIGKILL at once (the step their ranks were saving is lost).
  void Stop(const std::function<bool()>& hurry = [] { return false; });

 private:
  struct Slot {
    pid_t pid = -1;
    bool adopted = false;   // not our child: watched with kill(pid, 0)
    double restart_at = 0;  // monotonic seconds
  };
  void Monitor();
  pid_t Spawn(uint32_t slot);
  bool Alive(uint32_t slot);

  const LocalLauncherOptions options_;
  Controller& controller_;
  std::vector<Slot> slots_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// Finds furnace-worker next to the running executable.
std::string DefaultWorkerBinary();

}  // namespace furnace::controller
