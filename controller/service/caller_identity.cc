#include "controller/service/caller_identity.h"

#include "controller/service/auth_processor.h"
#include "transport/credentials.h"
#include "transport/listen_address.h"

namespace furnace::controller {

std::string PeerHost(const std::string& peer) {
  if (peer.rfind("ipv4:", 0) != 0 && peer.rfind("ipv6:", 0) != 0) return peer;
  const size_t colon = peer.rfind(':');
  const size_t bracket = peer.rfind(']');
  if (colon <= 4 || (bracket != std::string::npos && colon < bracket)) return peer;
  return peer.substr(0, colon);
}

std::string CallerIdentity(const grpc::ServerContext& context) {
  const std::shared_ptr<const grpc::AuthContext> auth = context.auth_context();
  if (auth != nullptr) {
    const std::vector<grpc::string_ref> values = auth->FindPropertyValues(kIdentityProperty);
    if (!values.empty()) return std::string(values.front().data(), values.front().size());
  }
  return transport::IsLoopbackAddress(context.peer()) ? "local" : PeerHost(context.peer());
}

std::string CallerWorker(const grpc::ServerContext& context) {
  const auto& metadata = context.client_metadata();
  const auto it = metadata.find(transport::kWorkerIdKey);
  return it == metadata.end() ? "" : std::string(it->second.data(), it->second.size());
}

}  // namespace furnace::controller
