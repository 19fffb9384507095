// WorkerRegistry: the worker agents this controller knows, their sessions, heartbeats and command
// queues. A worker is ready (free), busy (holds a rank, or is draining one) or lost (silent too
// long, or its agent said it is leaving: WorkerInfo.left; it must register again).
//
// What it owns: the workers' records and each worker's session id and queue of commands not yet
// delivered. A record is written behind: a change of state or rank marks it (Persist) and Flush
// writes every marked record in one transaction (the Controller calls it every tick), because at
// thousands of agents a transaction (an fsync) per registration or placed rank held the state
// mutex for minutes (bench/controlplane/REPORT.md).
//
// Threading: two halves.
//  - The records (Find, FindOrAdd, workers(), Assign, Free, MarkLost, Slots, Flush...) are
//    externally synchronised: only the Controller calls them, holding its state mutex, because
//    they change together with the jobs' ranks.
//  - Sessions, liveness and queues (NewSession, EndSession, HasSession, Beat, Touch, Enqueue,
//    NextCommands, TakeCommands, Requeue) never need the state mutex: a heartbeat or an agent's
//    command stream must not wait behind a job's transition (bench/controlplane/REPORT.md). They
//    are sharded by worker: a shared lock on the map of mailboxes (exclusive only to add a worker
//    never seen), then the worker's own mailbox mutex; the time a worker was last heard from is an
//    atomic (Liveness) that the records read. Lock order: state mutex, then the map's, then a
//    mailbox's.
// Errors: a failed write of worker records is logged and retried at the next Flush: the record is
// advisory (the attempts say which worker holds which rank, and a restarted controller rebuilds
// the rest from them and from the agents' re-registration).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <shared_mutex>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "controller/store/job_store.h"
#include "controller/store/placement.h"
#include "furnace/v1/agent.pb.h"
#include "furnace/v1/controller.pb.h"
#include "runtime/base/clock.h"

namespace furnace::controller {

// When a worker was last heard from: written by its heartbeats and other calls without the state
// mutex, read by failure detection under it.
struct Liveness {
  std::atomic<double> mono{0};
  std::atomic<double> unix_s{0};
  // The worker has a session (HasSession), readable from its record without the map's lock.
  std::atomic<bool> in_session{false};
  // What the agent's last heartbeat said of its rank's silence (RunningRank.silent_s): which rank,
  // how long it had sent nothing, and when that heartbeat came (monotonic). Reset at Register.
  struct RankSilence {
    std::string job_id;
    uint32_t attempt = 0;
    uint32_t rank = 0;
    double silent_s = 0;
    double at = 0;
  };
  void SetSilence(RankSilence s) {
    std::lock_guard<std::mutex> lock(silence_mu);
    silence = std::move(s);
  }
  RankSilence Silence() const {
    std::lock_guard<std::mutex> lock(silence_mu);
    return silence;
  }
  mutable std::mutex silence_mu;
  RankSilence silence;  // guarded by silence_mu
  void Set(double mono_s, double unix_time) {
    mono.store(mono_s, std::memory_order_relaxed);
    unix_s.store(unix_time, std::memory_order_relaxed);
  }
};

struct Worker {
  furnace::v1::WorkerInfo info;    // info.last_seen_unix is filled in from `seen` when copied out
  std::shared_ptr<Liveness> seen;  // never null (FindOrAdd, Load); shared with its mailbox
  bool has_rank = false;           // info.job_id()/rank() and attempt name it
  uint32_t attempt = 0;
  // Its agent registered without the rank it holds, which is not ended in the records: the rank
  // ended while the controller was away, its exit report still to come (the time limit waits for
  // it). In memory only; set by Register, meaningful while has_rank.
  bool exit_owed = false;
};

class WorkerRegistry {
 public:
  WorkerRegistry(JobStore& store, const Clock& clock);

  // --- Records (caller holds the Controller's state mutex) ----------------------------------
  // Workers known from the store at start: each gets the full timeout from now to register again;
  // which rank it holds is rebuilt from the jobs' attempts (the one source of truth).
  void Load(std::vector<furnace::v1::WorkerInfo> workers);
  Worker* Find(const std::string& worker_id);
  Worker& FindOrAdd(const std::string& worker_id);
  std::map<std::string, Worker>& workers() { return workers_; }
  const std::map<std::string, Worker>& workers() const { return workers_; }
  // The record as `furnace workers` shows it (with the time it was last heard from).
  static furnace::v1::WorkerInfo Info(const Worker& worker);
  // Workers of a device kind that are not lost.
  uint32_t CountUsable(const std::string& device_kind) const;
  // Every worker as placement sees it (free: ready, no rank, registered in this run).
  std::vector<WorkerSlot> Slots() const;
  // The worker now holds `rank` of the job's `attempt` (busy; persisted).
  void Assign(Worker& worker, const std::string& job_id, uint32_t attempt, uint32_t rank);
  // Frees the worker if it still holds exactly that rank (its exit was reported).
  void Free(const std::string& worker_id, const std::string& job_id, uint32_t attempt,
            uint32_t rank);
  // Marks the worker lost: no session, no queued commands, no rank (persisted); `left`: its agent
  // said it is shutting down (WorkerInfo.left). Returns the rank it held, so the caller can end
  // it; has_rank false when it held none or was already lost.
  struct Held {
    bool has_rank = false;
    std::string job_id;
    uint32_t attempt = 0;
    uint32_t rank = 0;
  };
  Held MarkLost(Worker& worker, bool left = false);
  // Drops a lost worker's record (the next Flush deletes its row) and its mailbox, so a returning
  // agent registers as a new worker. No-op for a worker that is not lost.
  void Forget(const std::string& worker_id);
  // Marks the worker's record to be written by the next Flush.
  void Persist(const Worker& worker);
  // Writes the marked records in one transaction (deletes the forgotten ones' rows); they stay
  // marked when it fails. `state_lock` holds the state mutex: the records are copied under it and
  // written without it, and it is held again on return. Writes land in the order their copies
  // were taken, whoever flushes (the ticker, FlushNow).
  void Flush(std::unique_lock<std::mutex>& state_lock);
  // The same while keeping the state mutex: for records that must be in the store before what
  // follows (a placement's, before its start commands go out).
  void FlushNow();

  // --- Sessions, liveness and command queues (thread-safe, no state mutex needed) -------------
  // Heard from the worker (any RPC): its silence starts again. Nothing for a worker never seen.
  void Touch(const std::string& worker_id);
  // A heartbeat: when `session_id` is the worker's current session, records it as heard from now
  // (and what it says of its rank's silence) and returns true; false otherwise (the
  // agent must register again).
  bool Beat(const std::string& worker_id, const std::string& session_id,
            Liveness::RankSilence silence = {});
  // Starts a new session for the worker (ending any older command stream), optionally dropping
  // the commands queued for the old agent process; returns the session id.
  std::string NewSession(const std::string& worker_id, bool drop_commands);
  // Ends the session and drops the queued commands (the worker must register again).
  void EndSession(const std::string& worker_id);
  bool HasSession(const std::string& worker_id) const;
  // Workers with a mailbox: heard from in this controller run (or loaded from the store) and not
  // forgotten. Lock-free.
  uint64_t MailboxCount() const { return mailboxes_.load(std::memory_order_relaxed); }
  bool IsSession(const std::string& worker_id, const std::string& session_id) const;
  void Enqueue(const std::string& worker_id, furnace::v1::AgentCommand command);
  // Waits up to wait_s for commands of this session. FailedPrecondition when the session is not
  // the worker's current one.
  absl::StatusOr<std::vector<furnace::v1::AgentCommand>> NextCommands(const std::string& worker_id,
                                                                      const std::string& session_id,
                                                                      double wait_s);
  // Puts back commands of `session_id` that could not be delivered (front of the queue, same
  // order); dropped when that session is no longer the worker's current one.
  void Requeue(const std::string& worker_id, const std::string& session_id,
               std::vector<furnace::v1::AgentCommand> commands);
  // NextCommands without waiting, for a stream that must not hold a thread (agent_server.cc):
  // the queued commands, or none and `wake` is kept, to be called (once, without the registry's
  // lock held) when a command is queued or the session changes or ends. A later call replaces it.
  // FailedPrecondition when the session is not the worker's current one.
  using Wake = std::function<void()>;
  absl::StatusOr<std::vector<furnace::v1::AgentCommand>> TakeCommands(const std::string& worker_id,
                                                                      const std::string& session_id,
                                                                      Wake wake);

 private:
  struct Mailbox {
    std::mutex mu;           // guards the fields below (liveness is atomic)
    std::string session_id;  // empty until it registers with this controller run (or when lost)
    std::deque<furnace::v1::AgentCommand> commands;
    // The worker's command stream waits here: a command or a session change wakes that worker's
    // stream only (thousands of streams wait at once; one shared variable woke them all).
    std::condition_variable cv;
    Wake wake;  // TakeCommands' waiting stream, if any
    const std::shared_ptr<Liveness> seen = std::make_shared<Liveness>();
  };
  // Calls the mailbox's Wake (taken out under its mutex, called after it is released).
  static void CallWake(Wake wake) {
    if (wake) wake();
  }
  // The worker's mailbox, or null when it has none (shared lock on the map). Shared: a caller's
  // mailbox stays valid when Forget drops it from the map.
  std::shared_ptr<Mailbox> FindMailbox(const std::string& worker_id) const;
  // The worker's mailbox, created when missing (exclusive lock on the map for that).
  std::shared_ptr<Mailbox> MailboxOf(const std::string& worker_id);

  JobStore& store_;
  const Clock& clock_;
  std::map<std::string, Worker> workers_;  // guarded by the caller's state mutex
  std::set<std::string> dirty_;            // records not written yet; guarded likewise
  // Held from a Flush's copy to the end of its write (taken under the state mutex).
  std::mutex write_order_mu_;

  mutable std::shared_mutex mail_mu_;  // guards the map's structure; each Mailbox guards itself
  std::map<std::string, std::shared_ptr<Mailbox>> mail_;  // erased by Forget
  const std::string instance_id_;  // distinguishes sessions across controller restarts
  std::atomic<uint64_t> session_counter_{0};
  std::atomic<uint64_t> mailboxes_{0};
};

}  // namespace furnace::controller
