// GroupCommit: many callers' small writes to the JobStore in few transactions, written by a thread
// of its own. A write runs inside a transaction shared with every write queued while the previous
// transaction was being committed; its callback is called once that transaction is committed (so
// a reply sent from it still promises durability). At thousands of agents this turns a step's
// telemetry batches, or a job start's rendezvous keys, from thousands of commits (each an fsync
// under synchronous=FULL, ~10 ms on a plain disk) into a few, and no caller's thread waits for
// the disk: an asynchronous RPC finishes from the callback
// (bench/controlplane/REPORT.md).
//
// What it owns: the committer thread and the writes queued for it.
// Threading: Submit and Run may be called from any thread (not from a callback: Run would wait on
// itself). Writes run on the committer thread, in the order they were queued, one transaction at a
// time; callbacks run there too, after the commit, in queue order.
// Errors: a failed write or commit rolls the transaction back and fails every write in it (each
// caller's client retries). Destruction commits what is queued, then stops.
#pragma once

#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "controller/store/job_store.h"

namespace furnace::controller {

class GroupCommit {
 public:
  using Write = std::function<absl::Status()>;  // calls on the store
  using Done = std::function<void(absl::Status)>;

  explicit GroupCommit(JobStore& store);
  ~GroupCommit();
  GroupCommit(const GroupCommit&) = delete;
  GroupCommit& operator=(const GroupCommit&) = delete;

  // Queues `write`; `done` gets its status, or its transaction's.
  void Submit(Write write, Done done);
  // Submit and wait for it.
  absl::Status Run(Write write);
  // Transactions run so far (committed or rolled back), for tests.
  uint64_t commits() const;
  // Writes queued and not yet started (a write-behind caller bounds its backlog with it).
  size_t queued() const;

 private:
  struct Pending {
    Write write;
    Done done;
  };
  void Loop();

  JobStore& store_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Pending> queue_;  // guarded by mu_
  bool stopping_ = false;       // guarded by mu_
  uint64_t commits_ = 0;        // guarded by mu_
  std::thread thread_;          // last: starts once the rest exists
};

}  // namespace furnace::controller
