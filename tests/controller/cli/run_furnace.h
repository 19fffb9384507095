// Runs the built `furnace` binary (FURNACE_CLI_BINARY) with a command line, for the tests that
// drive the real process: its exit code, the signal that ended it if any, and its output.
#pragma once

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <string>

namespace furnace::cli::testing {

struct RunResult {
  int exit_code = -1;  // -1: did not exit normally
  int signal = 0;      // the signal that ended it (a crash), else 0
  std::string output;  // stdout and stderr
};

inline RunResult RunFurnace(const std::string& args) {
  const std::string command = std::string(FURNACE_CLI_BINARY) + " " + args + " 2>&1";
  RunResult run;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return run;
  std::array<char, 512> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), pipe)) > 0) run.output.append(buf.data(), n);
  const int status = pclose(pipe);
  if (WIFEXITED(status)) run.exit_code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) run.signal = WTERMSIG(status);
  return run;
}

}  // namespace furnace::cli::testing
