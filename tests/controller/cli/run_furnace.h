// Runs the built `furnace` binary (FURNACE_CLI_BINARY) with a command line, for the tests that
// drive the real process: its exit code, the signal that ended it if any, and its output.
#pragma once

#include <string>

#include "tests/testing/run_command.h"

namespace furnace::cli::testing {

using RunResult = testing_util::CommandResult;

inline RunResult RunFurnace(const std::string& args) {
  return testing_util::RunCommand(std::string(FURNACE_CLI_BINARY) + " " + args);
}

}  // namespace furnace::cli::testing
