#include "controller/service/caller_identity.h"

#include "controller/service/auth_processor.h"
#include "transport/listen_address.h"

namespace furnace::controller {

std::string CallerIdentity(const grpc::ServerContext& context) {
  const std::shared_ptr<const grpc::AuthContext> auth = context.auth_context();
  if (auth != nullptr) {
    const std::vector<grpc::string_ref> values = auth->FindPropertyValues(kIdentityProperty);
    if (!values.empty()) return std::string(values.front().data(), values.front().size());
  }
  return transport::IsLoopbackAddress(context.peer()) ? "local" : "anonymous";
}

}  // namespace furnace::controller
