// The Communicator contract (communicator.h) on NCCL, for GPU ranks and device buffers. Built only
// with FURNACE_ENABLE_CUDA.
//
// Stream contract: every operation is enqueued on the stream given at creation and returns once
// NCCL has enqueued it; its result is ready for work enqueued later on that stream, and its
// buffers must stay valid until the stream gets there. "Recv blocks" therefore means blocks in
// stream order. Barrier and WaitSends are the host-side sync points: they also wait (polling, at
// most timeout_s) until the stream has drained, so a dead or stalled peer shows up there as
// DeadlineExceeded (the communicator is then aborted) or as NCCL's asynchronous error.
//
// How each op maps: AllReduce, ReduceScatter, AllGather, Broadcast are NCCL's own; Barrier is a
// 1-element all-reduce followed by the stream wait; AllToAllV is a group of ncclSend/ncclRecv (the
// chunk to itself a device copy); AllGatherV is a group of one ncclBroadcast per rank;
// ReduceScatterV pads every chunk to the largest count, runs ncclReduceScatter and copies this
// rank's part out (no kernel of our own; costs (size * max_count) floats of scratch and traffic).
// Reductions use NCCL's order, not rank order: deterministic for a fixed NCCL version, topology
// and size, and each result element is computed once and copied, so every rank has the same bits;
// but the bits can differ from the Gloo implementation's.
//
// Point to point: Send copies the payload into a stream-ordered device buffer and queues it; the
// queue is posted, in one NCCL group, with the next Recv (so a ring of Send-then-Recv does not
// deadlock), before the next collective, at PostSends (alone, not waited for), or at WaitSends.
// NCCL has no tags: messages between a pair are matched in the order they are posted, so a receiver
// must receive a peer's messages in the order they were sent (and with the same sizes); the tag is
// accepted for interface parity.
//
// Errors: NCCL and CUDA failures become Statuses naming the op, the group and this rank
// (InvalidArgument for misuse, Unavailable for system/remote errors, Internal otherwise). The first
// error is sticky. Abort(reason) (any thread) records Cancelled("aborted: <reason>") and calls
// ncclCommAbort, which also unblocks kernels of this communicator still on the stream.
//
// Thread-safety: one thread at a time for the operations; Abort and AsyncError from any thread.
#pragma once

#include <cuda_runtime.h>

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "runtime/comm/communicator.h"
#include "runtime/comm/kv_store.h"

namespace furnace::comm {

struct NcclOptions {
  int device = 0;                 // CUDA ordinal of this rank; made current on every call
  cudaStream_t stream = nullptr;  // where everything is enqueued; not owned, must outlive
  // Bounds rendezvous (the unique id, the communicator's init) and every host-side wait.
  double timeout_s = 300;
  // Called at least once a second while the rendezvous waits (the worker's progress heartbeat).
  std::function<void()> on_wait_tick;
};

// Rank 0 creates the NCCL unique id and publishes it through `store` under "<prefix>/nccl_id";
// the others wait for it there (at most timeout_s). Blocks until every rank has joined.
// Errors: InvalidArgument for a bad rank/size/timeout; DeadlineExceeded when the id or the peers
// do not show up; the mapped NCCL/CUDA error otherwise.
absl::StatusOr<std::unique_ptr<Communicator>> CreateNcclCommunicator(KvStore& store,
                                                                     const std::string& prefix,
                                                                     const std::string& name,
                                                                     int rank, int size,
                                                                     const NcclOptions& options);

}  // namespace furnace::comm
