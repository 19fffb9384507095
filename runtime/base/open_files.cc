#include "runtime/base/open_files.h"

#include <sys/resource.h>

#include <cerrno>
#include <cstring>
#include <fstream>

#include "absl/strings/str_cat.h"

namespace furnace {
namespace {

// The kernel's bound on a process's descriptors: setrlimit refuses a soft limit above it, and
// RLIM_INFINITY is above it.
rlim_t KernelMaxOpen() {
  std::ifstream in("/proc/sys/fs/nr_open");
  uint64_t n = 0;
  return in >> n && n > 0 ? static_cast<rlim_t>(n) : rlim_t{1} << 20;
}

}  // namespace

absl::StatusOr<OpenFileLimit> RaiseOpenFileLimit() {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0) {
    return absl::InternalError(absl::StrCat("getrlimit(RLIMIT_NOFILE): ", std::strerror(errno)));
  }
  OpenFileLimit out;
  out.before = limit.rlim_cur;
  const rlim_t target = limit.rlim_max == RLIM_INFINITY ? KernelMaxOpen() : limit.rlim_max;
  if (limit.rlim_cur != RLIM_INFINITY && limit.rlim_cur < target) {
    rlimit raised = limit;
    raised.rlim_cur = target;
    if (setrlimit(RLIMIT_NOFILE, &raised) != 0) {
      return absl::InternalError(absl::StrCat("setrlimit(RLIMIT_NOFILE) to ", target, ": ",
                                              std::strerror(errno), " (the limit stays ",
                                              limit.rlim_cur, ")"));
    }
    limit = raised;
  }
  out.soft = limit.rlim_cur;
  out.hard = limit.rlim_max;
  return out;
}

std::string DescribeOpenFileLimit(const OpenFileLimit& limit) {
  if (limit.soft == limit.before) {
    return absl::StrCat(limit.soft, " open files (",
                        limit.soft == limit.hard ? "the hard limit" : "the soft limit", ")");
  }
  return absl::StrCat(limit.soft, " open files (soft limit raised from ", limit.before,
                      " to the hard limit)");
}

}  // namespace furnace
