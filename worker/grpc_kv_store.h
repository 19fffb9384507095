// comm::KvStore over the controller's rendezvous store (AgentService KvSet/KvGet), scoped by
// (job, attempt). Rank processes use it to publish and find Gloo addresses (and, later, the NCCL
// unique id).
//
// The controller may restart while ranks rendezvous: UNAVAILABLE is retried with backoff
// (0.1..1 s) until the call's overall timeout. FAILED_PRECONDITION means the controller fenced this
// attempt (it is over); it is returned as is and never retried, so a stale rank gives up at once.
// Get's DEADLINE_EXCEEDED (the controller's, naming the missing keys, or ours when the retries ran
// out) and every other error are returned as well. WaitIndexed is the arrival barrier of a whole
// attempt (worker/health_check.cc) at O(1) bytes per rank.
//
// Ownership: shares the stub. Thread-safety: all methods may be called concurrently (gRPC stubs
// are thread-safe; the store has no other state).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "furnace/v1/agent.grpc.pb.h"
#include "runtime/base/clock.h"
#include "runtime/comm/kv_store.h"

namespace furnace::worker {

class GrpcKvStore : public comm::KvStore {
 public:
  // set_timeout_s bounds Set including its retries.
  GrpcKvStore(std::shared_ptr<furnace::v1::AgentService::StubInterface> stub,
              furnace::v1::KvScope scope, double set_timeout_s = 30,
              const Clock& clock = RealClock());

  absl::Status Set(const std::string& key, const std::string& value) override;
  absl::StatusOr<std::vector<std::string>> Get(const std::vector<std::string>& keys,
                                               double timeout_s) override;

  // An arrival barrier (KvGetRequest.indexed_*): waits until the keys <prefix>0 ..
  // <prefix><count-1> all exist, at most timeout_s, without naming them on the wire. The end of
  // timeout_s is an answer (complete false, with what is missing), not an error; errors as Get's.
  struct Arrivals {
    bool complete = false;
    uint32_t present = 0;
    std::vector<uint32_t> missing;  // ascending; the first 256 at most
  };
  absl::StatusOr<Arrivals> WaitIndexed(const std::string& prefix, uint32_t count, double timeout_s);

  // How much longer than the server-side wait the gRPC deadline of a KvGet is.
  static constexpr double kDeadlineSlackS = 2.0;

 private:
  // One KvGet wait of up to timeout_s (retried while the controller is unreachable; still
  // unreachable at the end: DeadlineExceeded), its errors prefixed with `what`.
  absl::Status KvGet(furnace::v1::KvGetRequest& request, furnace::v1::KvGetResponse& response,
                     double timeout_s, const std::string& what);

  const std::shared_ptr<furnace::v1::AgentService::StubInterface> stub_;
  const furnace::v1::KvScope scope_;
  const double set_timeout_s_;
  const Clock& clock_;
};

// grpc::Status -> absl::Status (the codes are the same numbers).
absl::Status FromGrpcStatus(const grpc::Status& status, const std::string& what);

}  // namespace furnace::worker
