// Who may call what on the controller's gRPC server. Installed on the TLS server credentials
// (grpc::AuthMetadataProcessor runs before every call; tokens are only accepted over TLS), it:
//   - JobService: with a --token-file, demands `authorization: Bearer <token>` of a listed token;
//     the read role may call the read-only methods (kReadOnlyJobMethods), everything else needs
//     admin. Without a token file JobService is open (identity `anonymous`).
//   - AgentService: demands a client certificate verified against --tls-ca (the credentials
//     request one and verify it when presented, but cannot require it, or the CLI would need one:
//     transport/credentials.h) and, with a --join-token-file, the join token. A certificate whose
//     common name is `furnace-worker:<host>` (transport::kWorkerCertPrefix; `furnace certs init
//     --worker-host`) may act only as the workers of that host (worker id `<host>` or
//     `<host>/<slot>`): PERMISSION_DENIED otherwise. Any other certificate (one shared by the
//     fleet) may act as any worker.
//   - any other service: admin (when tokens are on).
// No token -> UNAUTHENTICATED; a token without the role -> PERMISSION_DENIED; each message names
// the method and the role or credential it needs. A call let through carries the AuthContext
// property `furnace.identity` (the token's name, or `agent:<worker id>`, or `anonymous`), read
// with CallerIdentity (caller_identity.h), and `furnace.role`. Both are the connection's (gRPC's
// AuthContext is per connection): set by its first call, and a later call with other credentials
// is refused (PERMISSION_DENIED: one caller per connection).
// Refused calls of the JobService methods that change state are also recorded, rate limited, for
// the audit log (AuthRefusals below).
// Thread-safe: the policy is immutable after construction.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "grpcpp/security/auth_metadata_processor.h"
#include "runtime/base/clock.h"
#include "transport/token_file.h"

namespace furnace::controller {

inline constexpr char kIdentityProperty[] = "furnace.identity";
inline constexpr char kRoleProperty[] = "furnace.role";

// The JobService methods the read role may call. A method not listed needs admin, so a new RPC is
// admin-only until someone decides it is read-only.
inline constexpr const char* kReadOnlyJobMethods[] = {
    "ListJobs", "GetJob", "ListWorkers", "GetLogs", "GetJobSeries", "ListAuditEvents"};
// The admin methods that change nothing (a dry run needs the role its real call needs, so that it
// answers what the real call would): refused calls of these are not audited either.
inline constexpr const char* kCheckOnlyJobMethods[] = {"CheckJob"};

struct AuthPolicy {
  std::vector<transport::TokenEntry> tokens;  // empty: JobService needs no token
  std::string join_token;                     // empty: AgentService needs only the certificate
};

// One call as the processor sees it.
struct AuthRequest {
  std::string method;                        // ":path", e.g. /furnace.v1.JobService/SubmitJob
  std::optional<std::string> authorization;  // the `authorization` header, if any
  std::string worker_id;                     // the `furnace-worker-id` header, if any
  bool peer_certificate_verified = false;    // a client certificate the CA signed
  std::string peer_common_name;              // its subject's common name, if any
};

struct AuthDecision {
  grpc::Status status;
  // When status is OK; when refused, the token's name if the token is known (a read token's
  // submit), else empty.
  std::string identity;
  std::string role;  // admin | read | agent | anonymous
};

// The decision for one call (pure; the processor below is this plus gRPC's plumbing).
AuthDecision Authorize(const AuthPolicy& policy, const AuthRequest& request);

// The JobService calls that change state (submit, cancel) which the processor refused, for the
// audit log: recorded on gRPC's threads without blocking, written by the controller's main loop
// (Controller::AuditRefused). A flood of refused calls (no token is needed to make one) must not
// push the audit log's real entries out (--audit-keep keeps the newest): it records the first
// kBurst, then one per kIntervalS seconds; the next one recorded says how many it left out.
// Thread-safe.
class AuthRefusals {
 public:
  struct Entry {
    double unix_time = 0;
    std::string identity;  // the token's name when the token is known; else what was presented
    std::string action;    // submit | cancel (the method's name for any other)
    absl::Status outcome;  // the refusal, its message naming what was needed
  };
  static constexpr double kBurst = 100;
  static constexpr double kIntervalS = 10;

  explicit AuthRefusals(const Clock& clock = RealClock());
  void Record(const AuthRequest& request, const AuthDecision& decision);
  // The entries recorded since the last call, oldest first.
  std::vector<Entry> Take();

 private:
  const Clock& clock_;
  std::mutex mu_;
  std::vector<Entry> entries_;  // guarded by mu_
  double tokens_ = kBurst;      // guarded by mu_
  double updated_ = -1;         // guarded by mu_ (monotonic seconds; < 0: never)
  uint64_t left_out_ = 0;       // guarded by mu_: refusals not recorded since the last one was
};

class TokenAuthProcessor : public grpc::AuthMetadataProcessor {
 public:
  // `refusals` (may be null): where refused state-changing JobService calls are recorded.
  explicit TokenAuthProcessor(AuthPolicy policy, std::shared_ptr<AuthRefusals> refusals = nullptr)
      : policy_(std::move(policy)), refusals_(std::move(refusals)) {}
  bool IsBlocking() const override { return false; }
  grpc::Status Process(const InputMetadata& auth_metadata, grpc::AuthContext* context,
                       OutputMetadata* consumed_auth_metadata,
                       OutputMetadata* response_metadata) override;

 private:
  const AuthPolicy policy_;
  const std::shared_ptr<AuthRefusals> refusals_;
};

}  // namespace furnace::controller
