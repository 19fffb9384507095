#include "worker/controller_channel.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "runtime/base/status.h"
#include "transport/channel_arguments.h"
#include "transport/credentials.h"
#include "transport/token_file.h"

namespace furnace::worker {
namespace {

std::shared_ptr<grpc::Channel> MakeChannel(
    const std::string& address, const std::shared_ptr<grpc::ChannelCredentials>& credentials) {
  return grpc::CreateCustomChannel(address, credentials, transport::ControllerChannelArguments());
}

}  // namespace

std::shared_ptr<grpc::Channel> MakeControllerChannel(const std::string& address) {
  return MakeChannel(address, grpc::InsecureChannelCredentials());
}

absl::StatusOr<std::string> SourceAddressToward(const std::string& address) {
  std::string host = address, port = "0";
  if (host.starts_with("ipv4:") || host.starts_with("ipv6:") || host.starts_with("dns:")) {
    host = host.substr(host.find(':') + 1);
    // dns:///name:port, or dns://resolver/name:port: the name after the authority.
    if (host.starts_with("//")) host = host.substr(std::min(host.size(), host.find('/', 2) + 1));
  }
  host = host.substr(0, host.find(','));  // ipv4:a:p,b:p: the first address
  if (std::count(host.begin(), host.end(), ':') > 1 && !host.starts_with("[")) {
    // A bare IPv6 address, no port.
  } else if (host.starts_with("[")) {
    const size_t close = host.find(']');
    if (close == std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat("'", address, "': no closing ']'"));
    }
    if (close + 1 < host.size() && host[close + 1] == ':') port = host.substr(close + 2);
    host = host.substr(1, close - 1);
  } else if (const size_t colon = host.rfind(':'); colon != std::string::npos) {
    port = host.substr(colon + 1);
    host = host.substr(0, colon);
  }
  addrinfo hints{};
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  if (const int rc = getaddrinfo(host.c_str(), port.c_str(), &hints, &found); rc != 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot resolve '", host, "' (", address, "): ", gai_strerror(rc)));
  }
  std::string error = "no address";
  for (const addrinfo* a = found; a != nullptr; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    sockaddr_storage local{};
    socklen_t length = sizeof(local);
    char text[INET6_ADDRSTRLEN] = {};
    const bool ok = ::connect(fd, a->ai_addr, a->ai_addrlen) == 0 &&
                    ::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &length) == 0 &&
                    getnameinfo(reinterpret_cast<sockaddr*>(&local), length, text, sizeof(text),
                                nullptr, 0, NI_NUMERICHOST) == 0;
    if (!ok) error = std::strerror(errno);  // (getnameinfo of a numeric host does not fail)
    ::close(fd);
    if (ok) {
      freeaddrinfo(found);
      return std::string(text);
    }
  }
  freeaddrinfo(found);
  return absl::UnavailableError(absl::StrCat("no route toward ", address, ": ", error));
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
