// The open-file limit of the daemons and the rank program. Each holds many descriptors at once:
// the controller a socket per agent connection (thousands of agents) beside its SQLite files and
// rank logs, an agent pipes and log files per rank, a rank a descriptor per data file it reads
// (two per indexed dataset of a blend) beside its sockets. The soft limit systemd and login
// shells give (1024) runs out long before the hard limit does, and then accept() and open() fail
// with EMFILE. So each raises its soft limit to the hard limit at start; the hard limit is the
// administrator's to set (LimitNOFILE= in the systemd units, `ulimit -Hn`). Thread-safe.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace furnace {

struct OpenFileLimit {
  uint64_t before = 0;  // the soft limit found
  uint64_t soft = 0;    // the soft limit now
  uint64_t hard = 0;
};

// Raises RLIMIT_NOFILE's soft limit to its hard limit (where the hard limit is unlimited, to the
// kernel's per-process maximum, /proc/sys/fs/nr_open). Internal naming the call and errno when the
// limit cannot be read or set; the limit then stays as it was.
absl::StatusOr<OpenFileLimit> RaiseOpenFileLimit();

// "1048576 open files (soft limit raised from 1024 to the hard limit)", or "... (the hard limit)".
std::string DescribeOpenFileLimit(const OpenFileLimit& limit);

}  // namespace furnace
