// ProcSample: what /proc says about one process (the controller) at an instant: CPU seconds
// (utime + stime of all its threads), resident memory, threads, and the bytes and write calls it
// has issued (/proc/<pid>/io: wchar and syscw count SQLite's WAL and database writes; write_bytes
// what reached the block layer). The difference of two samples is the load of a window.
// Free functions; any thread. Errors: NotFound when the process is gone or /proc is unreadable.
#pragma once

#include <cstdint>

#include "absl/status/statusor.h"

namespace furnace::bench {

struct ProcSample {
  double mono_s = 0;            // when it was read (steady clock)
  double cpu_s = 0;             // utime + stime
  uint64_t rss_bytes = 0;       // VmRSS
  uint64_t rss_peak_bytes = 0;  // VmHWM: the most it has been resident since it started
  uint64_t threads = 0;
  uint64_t wchar = 0;        // bytes passed to write(2)-like calls
  uint64_t syscw = 0;        // write(2)-like calls
  uint64_t write_bytes = 0;  // bytes sent to the storage layer
};

absl::StatusOr<ProcSample> SampleProcess(int pid);

}  // namespace furnace::bench
