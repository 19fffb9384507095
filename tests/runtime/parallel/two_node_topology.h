// Test helper: two emulated nodes (bench/parm/two_nodes.sh, bench/parm/netns.h) for tests that
// check a layout over a real, rate-limited "inter-node" link. TwoNodes::Up runs the script through
// std::system and the destructor runs `down`; a test that cannot have them (not root, no `ip`, no
// namespaces) gets the reason and GTEST_SKIP()s with it. The namespaces have fixed names, so two
// such tests (or a test and bench/parm/run.sh) must not run at the same time.
//
// EnterNode is bench::EnterNode: a forked rank calls it before it creates any socket.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "bench/parm/netns.h"

namespace furnace::testing {

class TwoNodes {
 public:
  // Brings the nodes up; nullptr with *why set when they cannot be made here.
  static std::unique_ptr<TwoNodes> Up(const std::string& rate, std::string* why);
  ~TwoNodes();  // tears them down
  TwoNodes(const TwoNodes&) = delete;
  TwoNodes& operator=(const TwoNodes&) = delete;

 private:
  TwoNodes() = default;
};

// Whether the namespaces exist now; otherwise *why says what is missing.
bool TwoNodesAvailable(std::string* why);

using bench::EnterNode;

}  // namespace furnace::testing
