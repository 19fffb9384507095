// Emulated nodes (bench/parm/two_nodes.sh): node k is the network namespace furnace_n<k> with the
// address 10.77.0.<k + 1>; the namespaces are joined by a rate-limited veth pair. A forked rank
// enters its node's namespace before it creates any socket, then binds Gloo to the node's address,
// so traffic between ranks of one node stays on that namespace's loopback route and traffic
// between nodes crosses the limited link. Rendezvous goes through a FileKvStore, which files make
// visible from every namespace.
//
// Thread-safety: EnterNode moves the calling thread (and the threads it starts later) only; call
// it in a freshly forked, single-threaded rank. Errors: NotFound when the namespace does not exist
// (two_nodes.sh up has not run), PermissionDenied / Internal for the system call's failure.
#pragma once

#include <string>

#include "absl/status/statusor.h"

namespace furnace::bench {

inline constexpr int kMaxEmulatedNodes = 2;

std::string NodeNamespace(int node);  // "furnace_n<node>"
std::string NodeAddress(int node);    // "10.77.0.<node + 1>"

// Enters node `node`'s namespace; returns the address to bind to.
absl::StatusOr<std::string> EnterNode(int node);

// Whether every emulated node's namespace exists; otherwise `why` says what is missing.
bool NodesExist(std::string* why);

}  // namespace furnace::bench
