// Communicator: one process group (a set of ranks that run collectives together) behind one small
// interface, with a Gloo implementation (CPU, TCP; gloo_communicator.h), an NCCL implementation
// (GPU; nccl_communicator.h, built only with CUDA) and an in-process fake (local_communicator.h)
// whose "ranks" are threads, for tests where the logic, not the transport, is the point. On a
// discrete device a rank's groups wrap them: stream_communicator.h (NCCL, or the emulated device's
// transport: collectives on their own streams, ordered by events) or device_staging.h (host
// transports with device buffers).
//
// Contract shared by every implementation:
//   * Every rank of the group calls the same collectives in the same order with matching sizes;
//     sizes may be 0 (a no-op that still synchronises where the collective does).
//   * Buffers are host memory for Gloo and the fake, device memory for NCCL. Element type of the
//     reductions is fp32; the data-movement collectives work on bytes.
//   * Results are deterministic: the same inputs give bit-identical outputs on every call, and a
//     reduction's result is bit-identical on every rank of the group.
//   * Every call returns a Status; a failure names the operation, the group and the peer when
//     known. After a failure or Abort() every later call fails fast with the same (sticky) error.
//     A peer that dies or stops makes the others fail within the timeout (DeadlineExceeded or
//     Unavailable) instead of hanging.
//   * Byte accounting (counters()): each call adds the bytes THIS rank hands to the collective, the
//     logical payload, not the wire traffic of the algorithm:
//       all_reduce: count*4; reduce_scatter: size*count_per_rank*4 (its whole input);
//       all_gather: its own contribution; all_to_all: sum of its send sizes (the chunk to itself
//       included); broadcast: the message size (on every rank); send: the bytes sent; recv: the
//       bytes received; barrier: 0 (calls are counted).
//     So per step the counts are a pure function of shapes and routing, and tests compare them
//     with the analytical count exactly. Each successful call also adds its wall time on this
//     rank (from entry to return: waiting for the peers included; for NCCL, the time to enqueue
//     the operation on the stream, not its execution).
//   * While a call blocks it is marked in ProcessInFlight() (in_flight.h: op, group, since when),
//     so a watchdog can name the collective a stuck rank waits in (Gloo and the local fake; NCCL
//     enqueues and returns, its waits are on the stream: the StreamCommunicator around it marks
//     each collective from its enqueue until its stream has passed it, comm_watchdog.h).
//
// Thread-safety: one thread at a time per Communicator (the rank's compute thread); counters()
// may be read from any thread. Sends are buffered: Send copies the payload and returns; the bytes
// go out in the background; WaitSends() waits until every send so far has been delivered (call it
// before the step ends; PostSends() puts back any a transport holds on their way without
// waiting). Recv blocks until the message has arrived.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace furnace::comm {

enum class CollectiveOp {
  kAllReduce = 0,
  kReduceScatter,
  kAllGather,
  kAllToAll,
  kBroadcast,
  kSend,
  kRecv,
  kBarrier,
};
inline constexpr int kNumCollectiveOps = 8;
// "all_reduce", "reduce_scatter", "all_gather", "all_to_all", "broadcast", "send", "recv",
// "barrier": the label values of furnace_comm_bytes_total.
const char* CollectiveOpName(CollectiveOp op);

// Bytes, calls and wall time per collective. Relaxed atomics: exact once the calls have returned.
class CommCounters {
 public:
  void Add(CollectiveOp op, int64_t bytes, double seconds) {
    bytes_[static_cast<int>(op)].fetch_add(bytes, std::memory_order_relaxed);
    calls_[static_cast<int>(op)].fetch_add(1, std::memory_order_relaxed);
    nanos_[static_cast<int>(op)].fetch_add(static_cast<int64_t>(seconds * 1e9),
                                           std::memory_order_relaxed);
  }
  int64_t bytes(CollectiveOp op) const {
    return bytes_[static_cast<int>(op)].load(std::memory_order_relaxed);
  }
  int64_t calls(CollectiveOp op) const {
    return calls_[static_cast<int>(op)].load(std::memory_order_relaxed);
  }
  double seconds(CollectiveOp op) const {
    return nanos_[static_cast<int>(op)].load(std::memory_order_relaxed) * 1e-9;
  }
  void Reset() {
    for (auto& b : bytes_) b.store(0);
    for (auto& c : calls_) c.store(0);
    for (auto& n : nanos_) n.store(0);
  }

 private:
  std::array<std::atomic<int64_t>, kNumCollectiveOps> bytes_{};
  std::array<std::atomic<int64_t>, kNumCollectiveOps> calls_{};
  std::array<std::atomic<int64_t>, kNumCollectiveOps> nanos_{};
};

// The wall time of one call for CommCounters::Add: constructed at the top of the call.
class CallTimer {
 public:
  CallTimer() : start_(std::chrono::steady_clock::now()) {}
  double Seconds() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }

 private:
  std::chrono::steady_clock::time_point start_;
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;  // 0..size()-1 inside this group
  virtual int size() const = 0;
  // For messages: "tp[2,3]" style, set at creation.
  virtual const std::string& name() const = 0;

  // data (count) summed over the group, in place.
  virtual absl::Status AllReduce(float* data, int64_t count) = 0;
  // in (size * count_per_rank): out (count_per_rank) = sum over ranks of in's chunk rank().
  virtual absl::Status ReduceScatter(const float* in, float* out, int64_t count_per_rank) = 0;
  // Variable chunks: in holds size() chunks of counts[r] floats back to back; out (counts[rank()])
  // = the sum over ranks of their chunk rank(). counts must be equal on every rank.
  virtual absl::Status ReduceScatterV(const float* in, float* out,
                                      const std::vector<int64_t>& counts) = 0;
  // out (size * bytes_per_rank) = every rank's `in` in rank order.
  virtual absl::Status AllGather(const void* in, void* out, int64_t bytes_per_rank) = 0;
  // Variable sizes: out = the ranks' inputs back to back, rank r contributing recv_bytes[r]
  // (recv_bytes[rank()] == in_bytes). recv_bytes must be equal on every rank.
  virtual absl::Status AllGatherV(const void* in, int64_t in_bytes, void* out,
                                  const std::vector<int64_t>& recv_bytes) = 0;
  // in: size() chunks back to back, chunk r (send_bytes[r]) goes to rank r; out: size() chunks
  // back to back, chunk r (recv_bytes[r]) comes from rank r. recv_bytes[r] on this rank must equal
  // send_bytes[this rank] on rank r.
  virtual absl::Status AllToAllV(const void* in, const std::vector<int64_t>& send_bytes, void* out,
                                 const std::vector<int64_t>& recv_bytes) = 0;
  virtual absl::Status Broadcast(void* data, int64_t bytes, int root) = 0;
  // Point to point; messages between a pair with the same tag arrive in order.
  virtual absl::Status Send(const void* data, int64_t bytes, int peer, uint32_t tag) = 0;
  virtual absl::Status Recv(void* data, int64_t bytes, int peer, uint32_t tag) = 0;
  virtual absl::Status WaitSends() = 0;
  // Puts the sends this communicator still holds back on their way, without waiting for them. A
  // transport that posts each Send at once has nothing to do; NCCL holds them until the next call
  // (nccl_communicator.h). Call it after a Send that no other call on this communicator follows
  // soon: the first pipeline stage's forward sends, else posted only at its first backward Recv.
  virtual absl::Status PostSends() = 0;
  virtual absl::Status Barrier() = 0;

  // Makes every pending and later call fail (Cancelled "aborted: <reason>") and releases peers
  // blocked on this rank as far as the transport allows. Safe from any thread.
  virtual void Abort(const std::string& reason) = 0;
  // The sticky first error (OK while healthy). Safe from any thread.
  virtual absl::Status AsyncError() const = 0;

  const CommCounters& counters() const { return counters_; }
  CommCounters& mutable_counters() { return counters_; }

 protected:
  CommCounters counters_;
};

}  // namespace furnace::comm
