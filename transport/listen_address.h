// The listen rule of both daemons: an address other people's machines can reach needs TLS and
// tokens, or an explicit --insecure. This file says which addresses count as loopback, and which
// are wildcards (every interface), which a listener binds to but nobody can dial.
#pragma once

#include <string_view>

namespace furnace::transport {

// True when `address` (host:port, [v6]:port, or a gRPC `unix:` address) can only be reached from
// this machine: localhost, 127.0.0.0/8, ::1, or a Unix socket. 0.0.0.0, [::] and every other
// host are not loopback; an address that does not parse is not either (the rule errs strict).
bool IsLoopbackAddress(std::string_view address);

// True when the host of `address` (host:port or [v6]:port, also with gRPC's ipv4:/ipv6: prefix)
// is the unspecified address: 0.0.0.0 (in any form inet_aton reads, such as 0), ::, ::ffff:0.0.0.0,
// or nothing at all (":7070"). A listener there binds every interface, but a peer that dials it
// reaches only itself, and no certificate names it.
bool IsWildcardAddress(std::string_view address);

}  // namespace furnace::transport
