#include "tests/runtime/parallel/two_node_topology.h"

#include <unistd.h>

#include <cstdlib>

#include "absl/strings/str_cat.h"

namespace furnace::testing {
namespace {

std::string Script() { return FURNACE_TWO_NODES_SCRIPT; }

}  // namespace

std::unique_ptr<TwoNodes> TwoNodes::Up(const std::string& rate, std::string* why) {
  if (geteuid() != 0) {
    *why = "not root: network namespaces cannot be made";
    return nullptr;
  }
  if (std::system("command -v ip >/dev/null 2>&1 && command -v tc >/dev/null 2>&1") != 0) {
    *why = "iproute2 (ip, tc) not found";
    return nullptr;
  }
  const std::string up = absl::StrCat(Script(), " up --rate ", rate, " >/dev/null 2>&1");
  if (std::system(up.c_str()) != 0) {
    *why = absl::StrCat("`", Script(), " up` failed");
    std::system(absl::StrCat(Script(), " down >/dev/null 2>&1").c_str());
    return nullptr;
  }
  std::unique_ptr<TwoNodes> nodes(new TwoNodes());
  if (!TwoNodesAvailable(why)) return nullptr;  // the destructor tears down what was made
  return nodes;
}

TwoNodes::~TwoNodes() {
  const int rc = std::system(absl::StrCat(Script(), " down >/dev/null 2>&1").c_str());
  (void)rc;  // nothing to do about a failed teardown in a destructor
}

bool TwoNodesAvailable(std::string* why) { return bench::NodesExist(why); }

}  // namespace furnace::testing
