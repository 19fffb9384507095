// The listen rule of both daemons: an address other people's machines can reach needs TLS and
// tokens, or an explicit --insecure. This file says which addresses count as loopback.
#pragma once

#include <string_view>

namespace furnace::transport {

// True when `address` (host:port, [v6]:port, or a gRPC `unix:` address) can only be reached from
// this machine: localhost, 127.0.0.0/8, ::1, or a Unix socket. 0.0.0.0, [::] and every other
// host are not loopback; an address that does not parse is not either (the rule errs strict).
bool IsLoopbackAddress(std::string_view address);

}  // namespace furnace::transport
