// Rendezvous: the in-memory side of the controller's key-value store for rank processes, one set
// of keys per scope (job, attempt). Waits are callbacks: a KvGet that waits for its keys holds no
// thread (the gRPC adapter finishes the call from the callback), because at thousands of ranks a
// thread per waiting call was thousands of threads (bench/controlplane/REPORT.md). Closing a scope
// (its attempt is over) ends its waits and refuses it from then on, so a rank of a failed attempt
// can never read keys of the next one.
//
// Two kinds of wait:
//  - Get: every named key exists; answers their values. A waiter sleeps on the first key it still
//    misses and only a Set of that key looks at it again, and it never re-checks keys it has seen
//    (keys are only dropped by Close): a rendezvous of N ranks costs O(N) wake-ups, not O(N^2).
//  - WaitIndexed: the keys <prefix>0 .. <prefix><count-1> all exist (an arrival barrier); answers
//    how many exist and which are missing, never their values. O(1) on the wire per rank; the
//    scope keeps, per prefix waited on, which indices exist and the first one missing, so each Set
//    costs O(1) and wakes only the waits it completes.
//
// Fencing: a scope is usable only between OpenScope (the JobLifecycle opens it when its attempt
// starts running, and again for a running attempt reloaded after a controller restart) and Close
// (when the attempt ends, whatever the reason). So the check that a call's scope is the job's
// running attempt needs no state mutex: KvSet and KvGet ask the rendezvous alone.
//
// Bounds: a scope is written by its attempt's ranks only (CheckCaller), but a rank runs whatever
// code the job brings, and every key is kept in memory and in the store until the attempt ends.
// So Admit bounds what one attempt may keep, scaled by its ranks (a Gloo group's rendezvous
// stores, per rank, the addresses of all its peers: 136 bytes each; an NCCL id is 128 bytes):
// a key at most kMaxKeyBytes, a value at most 64 KiB + 256 bytes per rank, at most 1,024 + 64
// keys per rank, and at most 64 MiB + 4 of the largest values per rank in all.
//
// What it owns: the scopes' keys and the waits not yet answered, and the DeadlineTimer that ends
// them. Durability is the Controller's: it persists a key before Set makes it visible.
// Thread-safety: every method may be called from any thread. A wait's callback is called exactly
// once, without any lock of the rendezvous held: on the calling thread when the answer is at hand,
// else on the thread of the Set that completes it, of Close or Shutdown, or on the timer's.
// Errors (Get, WaitIndexed): FailedPrecondition for a scope not open (never opened, or closed;
// also for a wait that Close ends); Unavailable once Shutdown ran (the controller is going away:
// clients retry); Get: DeadlineExceeded naming the keys still missing after timeout_s; WaitIndexed:
// InvalidArgument for a count above kMaxIndexedCount, and at the end of timeout_s an answer (not an
// error) with complete false.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "controller/service/deadline_timer.h"

namespace furnace::controller {

class Rendezvous {
 public:
  using Scope = std::pair<std::string, uint32_t>;  // (job id, attempt)
  using Values = absl::StatusOr<std::vector<std::string>>;

  struct Arrivals {
    bool complete = false;  // every key exists
    uint32_t present = 0;   // how many of the keys exist
    std::vector<uint32_t>
        missing;  // the indices still missing, ascending, kMaxMissingListed at most
  };
  static constexpr size_t kMaxMissingListed = 256;
  static constexpr uint32_t kMaxIndexedCount = 1u << 20;  // ranks of one attempt, at most
  // Waits are cut to this (a client re-asks; the timer holds a closure per wait until then).
  static constexpr double kMaxWaitS = 60.0;

  // What one attempt may keep (the file comment says why these numbers).
  static constexpr size_t kMaxKeyBytes = 1024;
  static constexpr size_t kBaseValueBytes = size_t{64} << 10;
  static constexpr size_t kValueBytesPerRank = 256;
  static constexpr size_t kBaseKeys = 1024;
  static constexpr size_t kKeysPerRank = 64;
  static constexpr size_t kBaseBytes = size_t{64} << 20;
  static constexpr size_t kValuesPerRank = 4;
  struct Limits {
    size_t ranks = 0;
    size_t value_bytes = 0;  // one value
    size_t keys = 0;         // keys of the attempt
    size_t bytes = 0;        // its keys and values together
  };
  static Limits LimitsFor(size_t ranks);

  Rendezvous() = default;
  ~Rendezvous();  // Shutdown, then the timer stops
  Rendezvous(const Rendezvous&) = delete;
  Rendezvous& operator=(const Rendezvous&) = delete;

  // Makes the scope usable; nothing for one closed before (a closed scope never opens again).
  // `workers`: the workers the attempt's ranks were placed on, the only ones whose calls may use
  // the scope (CheckCaller).
  void OpenScope(const Scope& scope, std::set<std::string> workers);
  // FailedPrecondition unless the scope is open (see the errors above).
  absl::Status CheckOpen(const Scope& scope);
  // CheckOpen, and PermissionDenied when `worker` (the caller's, caller_identity.h: empty when it
  // names none) holds no rank of the scope's attempt: one worker cannot read or write another
  // job's rendezvous keys.
  absl::Status CheckCaller(const Scope& scope, const std::string& worker);
  // Reserves room for `key` holding a value of `value_bytes` in the open scope, before the value
  // is persisted and Set: ResourceExhausted, naming the limit and the attempt, when the key, the
  // value, the scope's keys or its bytes would go past the scope's Limits (LimitsFor the ranks it
  // was opened with: one a worker); FailedPrecondition for a scope not open. A key set again
  // counts once, at its latest size.
  absl::Status Admit(const Scope& scope, const std::string& key, size_t value_bytes);
  // Ignored for a scope not open.
  void Set(const Scope& scope, const std::string& key, const std::string& value);
  // Values in key order, once every key exists (at most timeout_s; <= 0: as they are now).
  void Get(const Scope& scope, const std::vector<std::string>& keys, double timeout_s,
           std::function<void(Values)> done);
  // Once the keys <prefix>0 .. <prefix><count-1> all exist, or timeout_s has passed (<= 0: now).
  // An index is its canonical decimal (no sign, no leading zero): "<prefix>01" is no index.
  void WaitIndexed(const Scope& scope, const std::string& prefix, uint32_t count, double timeout_s,
                   std::function<void(absl::StatusOr<Arrivals>)> done);
  // Whether the key exists now (false for a scope not open).
  bool Has(const Scope& scope, const std::string& key);
  // Drops the scope's keys and ends its waits; the scope is refused from then on.
  void Close(const Scope& scope);
  // Ends every wait with Unavailable and answers every later one so at once (the controller
  // stops; ranks retry against the next one).
  void Shutdown();

 private:
  struct KeyWait;
  struct IndexedWait;
  struct IndexedGroup;
  struct ScopeState;
  // The open scope's state; null when it is not open.
  std::shared_ptr<ScopeState> Find(const Scope& scope);
  // Why Find gave null.
  absl::Status Refused(const Scope& scope);
  // Whether `scope` was closed (closed_through_); mu_ held.
  bool ClosedLocked(const Scope& scope) const;
  // The answers of waits ended by `fail` (Close, Shutdown), to be called without the lock.
  static std::vector<std::function<void()>> EndAll(ScopeState& state, const absl::Status& fail);

  std::mutex mu_;
  std::map<Scope, std::shared_ptr<ScopeState>> scopes_;  // the open ones; guarded by mu_
  // Per job, the latest attempt closed: it and every earlier one are over (the lifecycle opens
  // only the next attempt, or at a controller's start the running one), so one number per job,
  // not one entry per attempt ever closed. Guarded by mu_.
  std::map<std::string, uint32_t> closed_through_;
  bool shut_down_ = false;  // guarded by mu_
  DeadlineTimer timer_;     // last member: destroyed first, after Shutdown answered every wait
};

}  // namespace furnace::controller
