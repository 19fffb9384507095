#include "bench/parm/netns.h"

#include <fcntl.h>
#include <sched.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"

namespace furnace::bench {
namespace {

std::string NamespacePath(int node) { return absl::StrCat("/var/run/netns/", NodeNamespace(node)); }

}  // namespace

std::string NodeNamespace(int node) { return absl::StrCat("furnace_n", node); }
std::string NodeAddress(int node) { return absl::StrCat("10.77.0.", node + 1); }

absl::StatusOr<std::string> EnterNode(int node) {
  if (node < 0 || node >= kMaxEmulatedNodes) {
    return absl::InvalidArgumentError(absl::StrCat("no emulated node ", node));
  }
  const std::string path = NamespacePath(node);
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    const std::string what =
        absl::StrCat("open ", path, ": ", std::strerror(err), " (run bench/parm/two_nodes.sh up)");
    return err == ENOENT ? absl::NotFoundError(what) : absl::PermissionDeniedError(what);
  }
  const int rc = setns(fd, CLONE_NEWNET);
  const int err = errno;
  close(fd);
  if (rc != 0) {
    return absl::InternalError(absl::StrCat("setns ", path, ": ", std::strerror(err)));
  }
  return NodeAddress(node);
}

bool NodesExist(std::string* why) {
  for (int node = 0; node < kMaxEmulatedNodes; ++node) {
    std::error_code ec;
    if (!std::filesystem::exists(NamespacePath(node), ec)) {
      if (why != nullptr) *why = absl::StrCat(NamespacePath(node), " does not exist");
      return false;
    }
  }
  return true;
}

}  // namespace furnace::bench
