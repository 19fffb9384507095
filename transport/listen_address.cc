#include "transport/listen_address.h"

#include <arpa/inet.h>

#include <string>

namespace furnace::transport {

bool IsLoopbackAddress(std::string_view address) {
  if (address.starts_with("unix:") || address.starts_with("unix-abstract:")) return true;
  std::string_view host = address;
  if (host.starts_with("ipv4:") || host.starts_with("ipv6:")) host.remove_prefix(5);
  // gRPC's ipv4:/ipv6: targets may list several addresses (comma-separated), and gRPC dials the
  // next when one fails: a list is not taken to be loopback, whatever its first address.
  if (host.find(',') != std::string_view::npos) return false;
  if (host.starts_with("[")) {
    const size_t close = host.find(']');
    if (close == std::string_view::npos) return false;
    host = host.substr(1, close - 1);
  } else {
    const size_t colon = host.rfind(':');
    if (colon != std::string_view::npos) host = host.substr(0, colon);
  }
  if (host == "localhost") return true;
  const std::string text(host);
  in_addr v4{};
  if (inet_pton(AF_INET, text.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  in6_addr v6{};
  if (inet_pton(AF_INET6, text.c_str(), &v6) == 1) return IN6_IS_ADDR_LOOPBACK(&v6);
  return false;
}

}  // namespace furnace::transport
