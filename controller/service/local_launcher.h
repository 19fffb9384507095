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
};

class LocalLauncher {
 public:
  LocalLauncher(const LocalLauncherOptions& options, Controller& controller);
  ~LocalLauncher();
  void Start();
  // Sends SIGTERM to every worker, waits up to grace_s, then SIGKILL.
  void Stop(double grace_s);

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
