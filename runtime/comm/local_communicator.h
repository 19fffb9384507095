// The Communicator contract (communicator.h) inside one process: the "ranks" of a LocalGroup are
// threads, one per member, for tests where the logic, not the transport, is the point.
//
// Every collective is a rendezvous on the group's shared state: each member posts its arguments
// in a slot and waits at an entry barrier; once all have arrived, each computes its own result
// into a scratch buffer by reading the others' inputs (reductions summed in rank order 0..size-1,
// so every rank gets the same bits), waits at an exit barrier (so no input goes away while it is
// still read), then copies the result into its output (in-place and aliased buffers are fine).
// A member first checks its own arguments as the Gloo and NCCL communicators do
// (collective_checks.h: null buffers, negative sizes, size vectors of the wrong length, a root
// or peer out of range); a bad call fails the group at once. Arguments are then checked after the
// entry barrier against every member's slot, so a mismatch (different collectives, sizes that do
// not agree) fails on all members alike. Send copies the
// payload into a FIFO mailbox per (source, destination, tag) and returns; Recv waits for it.
//
// Failures are group-wide and sticky: the first one (a mismatch, a timeout, Abort on any member)
// is recorded on the group, wakes every member blocked at an entry barrier or in Recv, and every
// later call of every member returns it. Timeouts: a member that waits longer than timeout_s at
// an entry barrier or in Recv fails with DeadlineExceeded naming the op, the group and the ranks
// it waited for. Abort(reason): Cancelled "aborted: <reason> ...". The exit barrier is not
// interruptible (every member has passed the entry barrier and only copies memory), so a
// collective that got past its entry barrier completes.
//
// Byte counters follow communicator.h and are added when a call succeeds.
//
// Ownership: LocalGroup and its members share the group state, so members may outlive the group.
// Thread-safety: each member is driven by one thread at a time; Abort, AsyncError and counters()
// may be called from any thread.
#pragma once

#include <memory>
#include <string>

#include "runtime/comm/communicator.h"

namespace furnace::comm {

struct LocalGroupOptions {
  std::string name = "local";  // appears in every error message, e.g. "tp[0,1]"
  double timeout_s = 30;       // per call, at an entry barrier or in Recv
};

class LocalGroup {
 public:
  // A group of `size` members (none if size < 1).
  explicit LocalGroup(int size, LocalGroupOptions options = {});

  int size() const;
  // The communicator of member `rank`. Each rank can be taken once; nullptr for a rank out of
  // [0, size) or already taken.
  std::unique_ptr<Communicator> Member(int rank);

  struct State;  // implementation detail, defined in local_communicator.cc

 private:
  std::shared_ptr<State> state_;
};

}  // namespace furnace::comm
