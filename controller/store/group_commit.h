// GroupCommit: many threads' small writes to the JobStore in few transactions. A caller's writes
// run inside a transaction shared with every call that arrived while the previous one was being
// committed; the call returns once that transaction is committed (so a reply sent after it still
// promises durability). At thousands of agents this turns a step's telemetry batches, or a job
// start's rendezvous keys, from thousands of commits (each an fsync under synchronous=FULL, ~10 ms
// on a plain disk) into a few (bench/controlplane/REPORT.md).
//
// Threading: Run may be called from any thread; the caller that finds no commit in progress
// writes the waiting batch, the others wait for it. Errors: a failed write or commit rolls the
// transaction back and fails every call in it (each caller's client retries).
#pragma once

#include <condition_variable>
#include <functional>
#include <mutex>
#include <vector>

#include "absl/status/status.h"
#include "controller/store/job_store.h"

namespace furnace::controller {

class GroupCommit {
 public:
  explicit GroupCommit(JobStore& store) : store_(store) {}

  // Runs `write` (calls on the store) in a shared transaction; its status, or the commit's.
  absl::Status Run(const std::function<absl::Status()>& write);

 private:
  struct Pending {
    const std::function<absl::Status()>* write;
    absl::Status status;
    bool done = false;
  };

  JobStore& store_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Pending*> waiting_;  // guarded by mu_
  bool committing_ = false;        // a caller is writing a batch; guarded by mu_
};

}  // namespace furnace::controller
