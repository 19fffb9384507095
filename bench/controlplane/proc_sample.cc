#include "bench/controlplane/proc_sample.h"

#include <unistd.h>

#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "bench/common/stats.h"

namespace furnace::bench {

absl::StatusOr<ProcSample> SampleProcess(int pid) {
  ProcSample s;
  s.mono_s = Now();
  const std::string dir = absl::StrCat("/proc/", pid, "/");
  std::ifstream stat(dir + "stat");
  std::string line;
  if (!std::getline(stat, line)) return absl::NotFoundError(absl::StrCat("no process ", pid));
  // Fields after the command name (which may hold spaces): state is field 3, utime 14, stime 15,
  // num_threads 20.
  std::istringstream rest(line.substr(line.rfind(')') + 2));
  std::string field;
  const double tick = static_cast<double>(sysconf(_SC_CLK_TCK));
  for (int i = 3; rest >> field; ++i) {
    if (i == 14 || i == 15) s.cpu_s += std::stod(field) / tick;
    if (i == 20) s.threads = std::stoull(field);
  }
  std::ifstream status(dir + "status");
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) s.rss_bytes = std::stoull(line.substr(6)) * 1024;
    if (line.rfind("VmHWM:", 0) == 0) s.rss_peak_bytes = std::stoull(line.substr(6)) * 1024;
  }
  std::ifstream io(dir + "io");
  while (std::getline(io, line)) {
    std::istringstream in(line);
    std::string key;
    uint64_t value = 0;
    in >> key >> value;
    if (key == "wchar:") s.wchar = value;
    if (key == "syscw:") s.syscw = value;
    if (key == "write_bytes:") s.write_bytes = value;
  }
  return s;
}

}  // namespace furnace::bench
