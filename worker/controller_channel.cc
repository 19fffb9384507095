#include "worker/controller_channel.h"

#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/support/channel_arguments.h"
#include "runtime/base/status.h"
#include "transport/credentials.h"
#include "transport/token_file.h"

namespace furnace::worker {
namespace {

std::shared_ptr<grpc::Channel> MakeChannel(
    const std::string& address, const std::shared_ptr<grpc::ChannelCredentials>& credentials) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 200);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 200);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  return grpc::CreateCustomChannel(address, credentials, args);
}

}  // namespace

std::shared_ptr<grpc::Channel> MakeControllerChannel(const std::string& address) {
  return MakeChannel(address, grpc::InsecureChannelCredentials());
}

absl::StatusOr<std::shared_ptr<grpc::Channel>> MakeControllerChannel(
    const std::string& address, const furnace::v1::ChannelSecurity& security,
    const std::string& worker_id) {
  transport::ClientSecurity client;
  client.tls = {security.tls_ca(), security.tls_cert(), security.tls_key()};
  if (!security.join_token_file().empty()) {
    ASSIGN_OR_RETURN(client.token,
                     transport::ReadClientToken(security.join_token_file(), "--join-token-file"));
  }
  if (client.tls.enabled()) client.worker_id = worker_id;
  ASSIGN_OR_RETURN(auto credentials, transport::MakeChannelCredentials(client));
  return MakeChannel(address, credentials);
}

}  // namespace furnace::worker
