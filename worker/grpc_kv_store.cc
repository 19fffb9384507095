#include "worker/grpc_kv_store.h"

#include <algorithm>
#include <chrono>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "grpcpp/grpcpp.h"
#include "runtime/base/status.h"

namespace furnace::worker {
namespace {

constexpr double kMinBackoffS = 0.1;
constexpr double kMaxBackoffS = 1.0;

void SetDeadline(grpc::ClientContext* context, double seconds) {
  context->set_deadline(std::chrono::system_clock::now() +
                        std::chrono::duration_cast<std::chrono::milliseconds>(
                            std::chrono::duration<double>(seconds)));
}

// Runs `call` until it is not UNAVAILABLE or `deadline_s` (monotonic) passes; `call` gets the
// seconds left. Returns the last status.
template <typename Call>
grpc::Status RetryUnavailable(const Clock& clock, double deadline_s, Call call) {
  double backoff = kMinBackoffS;
  while (true) {
    const double left = deadline_s - clock.MonotonicSeconds();
    grpc::Status status = call(std::max(left, 0.0));
    if (status.error_code() != grpc::StatusCode::UNAVAILABLE) return status;
    const double left_after = deadline_s - clock.MonotonicSeconds();
    if (left_after <= 0) return status;
    std::this_thread::sleep_for(std::chrono::duration<double>(std::min(backoff, left_after)));
    backoff = std::min(kMaxBackoffS, backoff * 2);
  }
}

}  // namespace

absl::Status FromGrpcStatus(const grpc::Status& status, const std::string& what) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                      absl::StrCat(what, ": ", status.error_message()));
}

GrpcKvStore::GrpcKvStore(std::shared_ptr<furnace::v1::AgentService::StubInterface> stub,
                         furnace::v1::KvScope scope, double set_timeout_s, const Clock& clock)
    : stub_(std::move(stub)),
      scope_(std::move(scope)),
      set_timeout_s_(set_timeout_s),
      clock_(clock) {}

absl::Status GrpcKvStore::Set(const std::string& key, const std::string& value) {
  furnace::v1::KvSetRequest request;
  *request.mutable_scope() = scope_;
  request.set_key(key);
  request.set_value(value);
  const double deadline = clock_.MonotonicSeconds() + set_timeout_s_;
  const grpc::Status status = RetryUnavailable(clock_, deadline, [&](double left) {
    furnace::v1::Ack ack;
    grpc::ClientContext context;
    SetDeadline(&context, std::max(left, 0.05));
    return stub_->KvSet(&context, request, &ack);
  });
  return FromGrpcStatus(status, absl::StrCat("rendezvous KvSet ", key));
}

absl::Status GrpcKvStore::KvGet(furnace::v1::KvGetRequest& request,
                                furnace::v1::KvGetResponse& response, double timeout_s,
                                const std::string& what) {
  const double deadline = clock_.MonotonicSeconds() + std::max(timeout_s, 0.0);
  const grpc::Status status = RetryUnavailable(clock_, deadline, [&](double left) {
    request.set_timeout_s(left);
    response.Clear();
    grpc::ClientContext context;
    SetDeadline(&context, left + kDeadlineSlackS);
    return stub_->KvGet(&context, request, &response);
  });
  if (status.error_code() == grpc::StatusCode::UNAVAILABLE) {
    return absl::DeadlineExceededError(absl::StrCat(what,
                                                    ": the controller stayed unreachable for ",
                                                    timeout_s, " s: ", status.error_message()));
  }
  return FromGrpcStatus(status, what);
}

absl::StatusOr<std::vector<std::string>> GrpcKvStore::Get(const std::vector<std::string>& keys,
                                                          double timeout_s) {
  furnace::v1::KvGetRequest request;
  *request.mutable_scope() = scope_;
  for (const std::string& key : keys) request.add_keys(key);
  furnace::v1::KvGetResponse response;
  const std::string what = absl::StrCat("rendezvous KvGet [", absl::StrJoin(keys, ", "), "]");
  RETURN_IF_ERROR(KvGet(request, response, timeout_s, what));
  if (response.values_size() != static_cast<int>(keys.size())) {
    return absl::InternalError(absl::StrCat(what, ": the controller returned ",
                                            response.values_size(), " values for ", keys.size(),
                                            " keys"));
  }
  return std::vector<std::string>(response.values().begin(), response.values().end());
}

absl::StatusOr<GrpcKvStore::Arrivals> GrpcKvStore::WaitIndexed(const std::string& prefix,
                                                               uint32_t count, double timeout_s) {
  furnace::v1::KvGetRequest request;
  *request.mutable_scope() = scope_;
  request.set_indexed_prefix(prefix);
  request.set_indexed_count(count);
  furnace::v1::KvGetResponse response;
  RETURN_IF_ERROR(KvGet(request, response, timeout_s,
                        absl::StrCat("rendezvous: waiting for ", count, " keys ", prefix, "*")));
  Arrivals a;
  a.complete = response.complete();
  a.present = response.present();
  a.missing.assign(response.missing().begin(), response.missing().end());
  return a;
}

}  // namespace furnace::worker
