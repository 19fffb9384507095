// Runs a shell command line to its end, for the tests that drive a built binary as a user would:
// its exit code, the signal that ended it if any, and its output (stdout and stderr together).
#pragma once

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <string>

namespace furnace::testing_util {

struct CommandResult {
  int exit_code = -1;  // -1: did not exit normally
  int signal = 0;      // the signal that ended it (a crash), else 0
  std::string output;  // stdout and stderr
};

inline CommandResult RunCommand(const std::string& command_line) {
  CommandResult run;
  FILE* pipe = popen((command_line + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return run;
  std::array<char, 512> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), pipe)) > 0) run.output.append(buf.data(), n);
  const int status = pclose(pipe);
  if (WIFEXITED(status)) run.exit_code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) run.signal = WTERMSIG(status);
  return run;
}

}  // namespace furnace::testing_util
