// Commcheck: a cluster communication health check in the spirit of nccl-tests, on any group
// (communicator.h) and the device its buffers live on: Gloo between CPU ranks, NCCL between GPUs
// (a StreamCommunicator, stream_communicator.h), the emulated device's transport in CI.
//
// Every rank of a connected group calls RunCommcheck with the same options. For each round, each
// size (min_bytes, min_bytes*step_factor, ... while <= max_bytes; bytes are the per-rank payload)
// and each collective, it runs warmup_iters + iters calls, checks EVERY call's output (payloads in
// commcheck_payload.h), and times each timed call. After the calls, one small allgather of (mean
// time, error count) makes every rank report the same result: the time is the MAX over ranks, the
// error count the SUM over ranks. Because the result is agreed, every rank stops at the same point
// when a check fails.
//
// Buffers: on `device`, device memory written and read back through Device::Copy on the calling
// thread's current stream (device::StreamScope; none: the device's default stream); on the CPU
// device the payload's host vectors themselves. A call is timed from its start
// until that stream has passed it (a stream communicator returns at enqueue; the stream then
// waits for the collective's completion event), so the time is the collective's own, as
// nccl-tests measures it; filling and checking the payload are outside it.
//
// Bandwidth, as nccl-tests defines it:
//   algbw = size / time / 1e9, where size is the per-rank payload (`bytes`) for allreduce,
//           alltoall and broadcast, and the gathered output (world_size * bytes) for allgather;
//   busbw = algbw * 2(n-1)/n (allreduce), * (n-1)/n (allgather, alltoall), * 1 (broadcast).
// With n = 1 the factor makes busbw 0 for allreduce, allgather and alltoall (no bus traffic).
//
// Collectives: "allreduce" (float32 sum, in place), "allgather" (int32), "alltoall" (int32
// alltoallv with uneven per-peer counts), "broadcast" (int32, root = iteration mod n).
//
// Thread: runs on the calling thread and uses the group exclusively while it runs.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "runtime/comm/communicator.h"
#include "runtime/device/device.h"

namespace furnace::comm {

struct CommcheckOptions {
  uint64_t min_bytes = 4096, max_bytes = 4 << 20;
  uint32_t step_factor = 4, iters = 5, warmup_iters = 1, rounds = 1;
  std::vector<std::string> collectives = {"allreduce", "allgather", "alltoall", "broadcast"};
  // Per collective call; a peer that does not take part fails the call within this. The group's
  // own timeout, which the caller connects it with (GlooOptions.op_timeout_s, the watchdog's of a
  // stream communicator); RunCommcheck only checks it is positive.
  double timeout_s = 30;
};

struct CommResult {
  std::string collective;
  uint64_t bytes;  // per-rank payload
  int world_size;
  double time_s;  // mean per timed call, max over ranks
  double algbw_gbps;
  double busbw_gbps;
  bool verified;    // errors == 0
  uint64_t errors;  // mismatched elements over all calls (warmup included) and all ranks
};

// Called after each (collective, size) result, and at the end of each round (round_done=true,
// result=nullptr).
using CommcheckCallback =
    std::function<absl::Status(uint32_t round, const CommResult* result, bool round_done)>;

// Errors: InvalidArgument for bad options (checked before any communication); DataLoss naming
// collective, size and error count for the first unverified result (after it was passed to the
// callback); the callback's own error, unchanged (this rank stops, its peers will then time out);
// the group's error for a failed call (DeadlineExceeded when a peer did not take part in time,
// Unavailable when it went away), and the device's. on_progress may be empty.
absl::Status RunCommcheck(Communicator& group, device::Device& device,
                          const CommcheckOptions& options, const CommcheckCallback& on_progress);

}  // namespace furnace::comm
