// The Communicator contract (communicator.h) on Gloo over TCP, for CPU ranks and host buffers.
//
// Every collective is Gloo's own algorithm on a fresh tag (all ranks call the same collectives in
// the same order, so tags agree): AllReduce is Gloo's ring all-reduce (each chunk is reduced on one
// rank and then copied, so all ranks hold the same bits); ReduceScatter(V) is Gloo's all-to-all-v
// followed by a local sum in rank order (rank 0's chunk + rank 1's + ...), so it is deterministic
// and the same wherever it runs. Point-to-point uses Gloo unbound buffers on slots of their own
// (one slot per tag, so a pair's messages with one tag stay in order); Send copies the payload and
// posts it, Gloo sends it once the peer posts the matching Recv, and WaitSends waits for them all.
// A send to or receive from this rank itself goes through a local queue.
//
// Failures: a Gloo exception becomes a Status naming the op, the group name, this rank and the
// peer where there is one (DeadlineExceeded for a timeout, Unavailable for a broken connection;
// see gloo_error.h), invalid arguments InvalidArgument. The first failure is sticky: every later
// call returns it at once, and the connections to all peers are closed (hard, RST) so that ranks
// blocked on this one fail promptly instead of waiting out their timeout. Abort(reason) records
// Cancelled("aborted: <reason>") (unless an error came first), releases a Recv or WaitSends that
// is blocked on another thread, and closes the connections; a Gloo collective blocked on another
// thread at that moment is not interruptible and returns the sticky error when its own timeout
// expires.
//
// A group of size 1 has no Gloo context and never touches the store or the network.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "runtime/comm/communicator.h"
#include "runtime/comm/gloo_context.h"
#include "runtime/comm/kv_store.h"

namespace furnace::comm {

// Connects rank `rank` of a group of `size` through `store`, its rendezvous keys scoped under
// `prefix` (so groups "tp/0", "dp/1", ... can share one store; every rank of a group passes the
// same prefix, and a prefix serves one connection attempt). `name` ("tp[0,1]") appears in every
// error message. Of `options`, host, timeout_s (rendezvous, and every later operation unless
// op_timeout_s is set), op_timeout_s and on_wait_tick are used; its rank and size are replaced by
// the arguments. Blocks up to about timeout_s while peers join.
// Errors: InvalidArgument for a bad rank/size/timeout; DeadlineExceeded when peers do not show up;
// Unavailable for store or network failures.
absl::StatusOr<std::unique_ptr<Communicator>> CreateGlooCommunicator(KvStore& store,
                                                                     const std::string& prefix,
                                                                     const std::string& name,
                                                                     int rank, int size,
                                                                     const GlooOptions& options);

}  // namespace furnace::comm
