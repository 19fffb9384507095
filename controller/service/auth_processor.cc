#include "controller/service/auth_processor.h"

#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "grpc/grpc_security_constants.h"
#include "runtime/base/log_text.h"
#include "spdlog/spdlog.h"
#include "transport/credentials.h"

namespace furnace::controller {
namespace {

constexpr absl::string_view kJobService = "/furnace.v1.JobService/";
constexpr absl::string_view kAgentService = "/furnace.v1.AgentService/";
constexpr absl::string_view kBearer = "Bearer ";

// Compares in time that depends on the lengths only, not on where the first difference is.
bool SameSecret(absl::string_view a, absl::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

// "JobService/SubmitJob" from "/furnace.v1.JobService/SubmitJob".
std::string ShortName(absl::string_view method) {
  const size_t dot = method.rfind('.');
  return std::string(dot == absl::string_view::npos ? method : method.substr(dot + 1));
}

// The token of an `authorization: Bearer <token>` header, or empty.
absl::string_view BearerToken(const std::optional<std::string>& header) {
  if (!header || !absl::StartsWith(*header, kBearer)) return {};
  return absl::string_view(*header).substr(kBearer.size());
}

const transport::TokenEntry* FindToken(const AuthPolicy& policy, absl::string_view token) {
  const transport::TokenEntry* found = nullptr;
  for (const auto& entry : policy.tokens) {
    if (SameSecret(entry.token, token)) found = &entry;  // no early exit: same time for all
  }
  return found;
}

AuthDecision Refuse(grpc::StatusCode code, std::string message, std::string identity = "") {
  return {grpc::Status(code, std::move(message)), std::move(identity), ""};
}

// Whether `method` is a JobService method that changes state (not read-only, not a check).
bool ChangesJobState(absl::string_view method) {
  if (!absl::StartsWith(method, kJobService)) return false;
  method.remove_prefix(kJobService.size());
  const auto is = [&](const char* m) { return method == m; };
  return std::none_of(std::begin(kReadOnlyJobMethods), std::end(kReadOnlyJobMethods), is) &&
         std::none_of(std::begin(kCheckOnlyJobMethods), std::end(kCheckOnlyJobMethods), is);
}

AuthDecision AuthorizeAgent(const AuthPolicy& policy, const AuthRequest& request,
                            const std::string& name) {
  if (!request.peer_certificate_verified) {
    return Refuse(grpc::StatusCode::UNAUTHENTICATED,
                  absl::StrCat(name,
                               " needs a client certificate signed by the controller's CA "
                               "(furnace-worker --tls-cert/--tls-key)"));
  }
  if (!policy.join_token.empty()) {
    const absl::string_view token = BearerToken(request.authorization);
    if (token.empty() || !SameSecret(token, policy.join_token)) {
      return Refuse(grpc::StatusCode::UNAUTHENTICATED,
                    absl::StrCat(name, " needs the join token (furnace-worker --join-token-file)"));
    }
  }
  const std::string id = request.worker_id.empty() ? "unknown" : request.worker_id;
  if (absl::StartsWith(request.peer_common_name, transport::kWorkerCertPrefix)) {
    // A host's own certificate: its workers, and no other's.
    const absl::string_view host = absl::string_view(request.peer_common_name)
                                       .substr(std::strlen(transport::kWorkerCertPrefix));
    if (host.empty() || (request.worker_id != host &&
                         !absl::StartsWith(request.worker_id, absl::StrCat(host, "/")))) {
      return Refuse(grpc::StatusCode::PERMISSION_DENIED,
                    absl::StrCat(name, ": the certificate of ", request.peer_common_name,
                                 " may act only as worker ", host, " or ", host,
                                 "/<slot>, not as `", id, "`"));
    }
  }
  return {grpc::Status::OK, "agent:" + id, "agent"};
}

}  // namespace

AuthDecision Authorize(const AuthPolicy& policy, const AuthRequest& request) {
  const std::string name = ShortName(request.method);
  if (absl::StartsWith(request.method, kAgentService)) {
    return AuthorizeAgent(policy, request, name);
  }
  if (policy.tokens.empty()) return {grpc::Status::OK, "anonymous", "anonymous"};

  bool read_only = false;
  if (absl::StartsWith(request.method, kJobService)) {
    const absl::string_view method = absl::string_view(request.method).substr(kJobService.size());
    read_only = std::any_of(std::begin(kReadOnlyJobMethods), std::end(kReadOnlyJobMethods),
                            [&](const char* m) { return method == m; });
  }
  const char* needed = read_only ? "read or admin" : "admin";
  const absl::string_view token = BearerToken(request.authorization);
  if (token.empty()) {
    return Refuse(grpc::StatusCode::UNAUTHENTICATED,
                  absl::StrCat(name, " needs a token with role ", needed,
                               " (furnace --token-file FILE, or FURNACE_TOKEN)"));
  }
  const transport::TokenEntry* entry = FindToken(policy, token);
  if (entry == nullptr) {
    return Refuse(grpc::StatusCode::UNAUTHENTICATED,
                  absl::StrCat(name, ": the token is not in the controller's --token-file (",
                               needed, " needed)"));
  }
  if (!read_only && entry->role != transport::Role::kAdmin) {
    return Refuse(grpc::StatusCode::PERMISSION_DENIED,
                  absl::StrCat(name, " needs role admin; the token of `", entry->name,
                               "` has role ", transport::RoleName(entry->role)),
                  entry->name);
  }
  return {grpc::Status::OK, entry->name, transport::RoleName(entry->role)};
}

AuthRefusals::AuthRefusals(const Clock& clock) : clock_(clock) {}

void AuthRefusals::Record(const AuthRequest& request, const AuthDecision& decision) {
  if (!ChangesJobState(request.method)) return;
  const absl::string_view method = absl::string_view(request.method).substr(kJobService.size());
  Entry e;
  e.unix_time = clock_.UnixSeconds();
  e.action = method == "SubmitJob"   ? "submit"
             : method == "CancelJob" ? "cancel"
                                     : std::string(method);
  // Who: the token's name when it is known; never the secret itself.
  e.identity = !decision.identity.empty()                   ? decision.identity
               : BearerToken(request.authorization).empty() ? "(no token)"
                                                            : "(a token not in --token-file)";
  std::string message = decision.status.error_message();
  std::lock_guard<std::mutex> lock(mu_);
  const double now = clock_.MonotonicSeconds();
  if (updated_ >= 0) tokens_ = std::min(kBurst, tokens_ + (now - updated_) / kIntervalS);
  updated_ = now;
  if (tokens_ < 1) {
    ++left_out_;
    return;
  }
  tokens_ -= 1;
  if (left_out_ > 0) {
    absl::StrAppend(&message, " (", left_out_, " earlier refused call(s) not recorded: at most ",
                    kBurst, ", then one per ", kIntervalS, " s)");
    left_out_ = 0;
  }
  e.outcome = absl::Status(static_cast<absl::StatusCode>(decision.status.error_code()), message);
  entries_.push_back(std::move(e));
}

std::vector<AuthRefusals::Entry> AuthRefusals::Take() {
  std::lock_guard<std::mutex> lock(mu_);
  return std::exchange(entries_, {});
}

grpc::Status TokenAuthProcessor::Process(const InputMetadata& auth_metadata,
                                         grpc::AuthContext* context,
                                         OutputMetadata* consumed_auth_metadata,
                                         OutputMetadata* /*response_metadata*/) {
  AuthRequest request;
  const auto text = [](const grpc::string_ref& s) { return std::string(s.data(), s.size()); };
  if (auto it = auth_metadata.find(":path"); it != auth_metadata.end()) {
    request.method = text(it->second);
  }
  if (auto it = auth_metadata.find(transport::kAuthorizationKey); it != auth_metadata.end()) {
    request.authorization = text(it->second);
    consumed_auth_metadata->insert({text(it->first), text(it->second)});
  }
  if (auto it = auth_metadata.find(transport::kWorkerIdKey); it != auth_metadata.end()) {
    request.worker_id = text(it->second);
  }
  request.peer_certificate_verified = context->IsPeerAuthenticated();
  if (request.peer_certificate_verified) {
    if (const std::vector<grpc::string_ref> names =
            context->FindPropertyValues(GRPC_X509_CN_PROPERTY_NAME);
        !names.empty()) {
      request.peer_common_name = text(names.front());
    }
  }
  AuthDecision decision = Authorize(policy_, request);
  if (!decision.status.ok()) {
    // The method and the worker id are what the caller sent: escaped, they cannot forge a line.
    spdlog::warn(
        "refused {} from {}: {}", request.method.empty() ? "a call" : EscapeForLog(request.method),
        request.worker_id.empty() ? "a client" : "worker " + EscapeForLog(request.worker_id),
        EscapeForLog(decision.status.error_message()));
    if (refusals_ != nullptr) refusals_->Record(request, decision);
    return decision.status;
  }
  // The AuthContext is the connection's, shared by every call on it (grpc/grpc#28809): a property
  // added stays for all later calls, and adding one per call grew it without bound (an agent's
  // heartbeats) while other calls' handlers read it. So the caller is recorded once, by the
  // connection's first call, and a connection carries one caller: a later call on it with other
  // credentials is refused rather than audited under the first caller's name.
  const std::vector<grpc::string_ref> recorded = context->FindPropertyValues(kIdentityProperty);
  if (recorded.empty()) {
    context->AddProperty(kIdentityProperty, decision.identity);
    context->AddProperty(kRoleProperty, decision.role);
  } else if (text(recorded.front()) != decision.identity) {
    const std::string why =
        absl::StrCat(ShortName(request.method), ": this connection carries the credentials of ",
                     text(recorded.front()), ", not of ", decision.identity,
                     " (one caller per connection: open another channel)");
    spdlog::warn("refused {}: {}", EscapeForLog(request.method), EscapeForLog(why));
    const grpc::Status refused(grpc::StatusCode::PERMISSION_DENIED, why);
    if (refusals_ != nullptr) refusals_->Record(request, {refused, decision.identity, ""});
    return refused;
  }
  return grpc::Status::OK;
}

}  // namespace furnace::controller
