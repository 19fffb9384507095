// Parsing a daemon's command line (furnace-controller, furnace-worker) with CLI11, and what it
// exits with: the same contract as `furnace` (controller/cli/exit_codes.h) for what the two share.
// CLI11's own codes (105 for a value out of range, 109 for an unknown option, 110 for an unknown
// --config key) mean nothing to a script or a service manager, so every bad option is 2.
#pragma once

#include <cmath>
#include <iostream>
#include <optional>
#include <sstream>
#include <string>

#include "CLI/CLI.hpp"

namespace furnace {

inline constexpr int kDaemonExitUsage = 2;  // a bad option, --config file or value

// A number in [min, max], and finite: CLI::Range lets nan through (both of its comparisons are
// false), and a nan --worker-timeout turned failure detection off.
inline CLI::Validator FiniteRange(double min, double max) {
  std::ostringstream text;
  text << "[" << min << ", " << max << "]";
  const std::string range = text.str();
  return CLI::Validator(
      [min, max, range](std::string& text) -> std::string {
        double value = 0;
        if (!CLI::detail::lexical_cast(text, value)) return "Value " + text + " is not a number";
        if (!std::isfinite(value) || value < min || value > max) {
          return "Value " + text + " not in range " + range;
        }
        return "";
      },
      "NUMBER in " + range);
}

// A number of seconds that is 0 (the feature is off: "never") or in [min, max], and finite:
// --forget-ended-jobs, --keep-rank-logs (a retention shorter than `min` would delete what an
// operator still looks at).
inline CLI::Validator ZeroOrSeconds(double min, double max) {
  std::ostringstream text;
  text << "allowed: 0 (never) or " << min << " to " << max << " seconds";
  const std::string allowed = text.str();
  return CLI::Validator(
      [min, max, allowed](std::string& text) -> std::string {
        double value = 0;
        if (!CLI::detail::lexical_cast(text, value) || !std::isfinite(value) ||
            (value != 0 && value < min) || value > max) {
          return allowed;
        }
        return "";
      },
      "SECONDS");
}

// Adds `--version` to `app` (prints "<name> <version>", the version of the build that `furnace
// --version` prints) and parses argv. nullopt: parsed, run. Otherwise the exit code: 0 after
// --help or --version (printed to `out`), kDaemonExitUsage after a bad option (CLI11's message,
// and for an unknown option the hint to --help, to `err`).
std::optional<int> ParseDaemonFlags(CLI::App& app, const std::string& name, int argc,
                                    const char* const* argv, std::ostream& out = std::cout,
                                    std::ostream& err = std::cerr);

}  // namespace furnace
