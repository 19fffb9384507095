#include "transport/listen_address.h"

#include <arpa/inet.h>

#include <optional>
#include <string>

namespace furnace::transport {
namespace {

// The host of host:port, [v6]:port or a gRPC ipv4:/ipv6: target; nullopt when it does not parse
// or is a gRPC address list (comma-separated: gRPC dials the next when one fails).
std::optional<std::string> HostOf(std::string_view address) {
  std::string_view host = address;
  if (host.starts_with("ipv4:") || host.starts_with("ipv6:")) host.remove_prefix(5);
  if (host.find(',') != std::string_view::npos) return std::nullopt;
  if (host.starts_with("[")) {
    const size_t close = host.find(']');
    if (close == std::string_view::npos) return std::nullopt;
    host = host.substr(1, close - 1);
  } else {
    const size_t colon = host.rfind(':');
    if (colon != std::string_view::npos) host = host.substr(0, colon);
  }
  return std::string(host);
}

}  // namespace

bool IsLoopbackAddress(std::string_view address) {
  if (address.starts_with("unix:") || address.starts_with("unix-abstract:")) return true;
  // A list is not taken to be loopback, whatever its first address.
  const std::optional<std::string> host = HostOf(address);
  if (!host) return false;
  if (*host == "localhost") return true;
  in_addr v4{};
  if (inet_pton(AF_INET, host->c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  in6_addr v6{};
  if (inet_pton(AF_INET6, host->c_str(), &v6) == 1) return IN6_IS_ADDR_LOOPBACK(&v6);
  return false;
}

bool IsWildcardAddress(std::string_view address) {
  if (address.starts_with("unix:") || address.starts_with("unix-abstract:")) return false;
  const std::optional<std::string> host = HostOf(address);
  if (!host) return false;
  if (host->empty()) return true;
  // inet_aton, not inet_pton: the resolver gRPC listens through reads "0" as 0.0.0.0 too.
  in_addr v4{};
  if (inet_aton(host->c_str(), &v4) != 0) return v4.s_addr == INADDR_ANY;
  in6_addr v6{};
  if (inet_pton(AF_INET6, host->c_str(), &v6) != 1) return false;
  if (IN6_IS_ADDR_UNSPECIFIED(&v6)) return true;
  return IN6_IS_ADDR_V4MAPPED(&v6) && v6.s6_addr32[3] == 0;
}

}  // namespace furnace::transport
