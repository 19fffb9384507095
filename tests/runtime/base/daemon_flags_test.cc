// The daemons' command line (runtime/base/daemon_flags.h): the helper on an app of its own, then
// the two daemons' binaries, which exit before they start anything when their options are bad.
#include "runtime/base/daemon_flags.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "runtime/base/yaml_config.h"
#include "tests/testing/run_command.h"

namespace furnace {
namespace {

struct Parsed {
  std::optional<int> exit;
  std::string out, err;
  int workers = 1;
};

Parsed Parse(const std::vector<std::string>& args) {
  CLI::App app{"daemon"};
  AddYamlConfigOption(app, "config");
  Parsed parsed;
  app.add_option("--workers", parsed.workers, "workers")->check(CLI::Range(1, 8));
  std::vector<const char*> argv = {"daemon"};
  for (const std::string& a : args) argv.push_back(a.c_str());
  std::ostringstream out, err;
  parsed.exit =
      ParseDaemonFlags(app, "furnace-daemon", static_cast<int>(argv.size()), argv.data(), out, err);
  parsed.out = out.str();
  parsed.err = err.str();
  return parsed;
}

std::string WriteConfig(const std::string& name, const std::string& text) {
  const std::string path = ::testing::TempDir() + name;
  std::ofstream(path) << text;
  return path;
}

TEST(DaemonFlags, GoodOptionsRun) {
  const Parsed p = Parse({"--workers", "4"});
  EXPECT_FALSE(p.exit.has_value());
  EXPECT_EQ(p.workers, 4);
}

TEST(DaemonFlags, VersionAndHelpExit0) {
  Parsed p = Parse({"--version"});
  EXPECT_EQ(p.exit, 0);
  EXPECT_EQ(p.out, std::string("furnace-daemon ") + FURNACE_VERSION + "\n");
  p = Parse({"--help"});
  EXPECT_EQ(p.exit, 0);
  EXPECT_NE(p.out.find("--workers"), std::string::npos) << p.out;
  EXPECT_NE(p.out.find("--version"), std::string::npos) << p.out;
}

// CLI11 would exit 105, 109 and 110: every one is 2, with CLI11's message.
TEST(DaemonFlags, BadOptionsExit2) {
  Parsed p = Parse({"--workers", "9"});
  EXPECT_EQ(p.exit, kDaemonExitUsage);
  EXPECT_NE(p.err.find("--workers"), std::string::npos) << p.err;
  p = Parse({"--no-such-flag"});
  EXPECT_EQ(p.exit, kDaemonExitUsage);
  EXPECT_NE(p.err.find("--no-such-flag"), std::string::npos) << p.err;
  p = Parse({"--config", WriteConfig("/daemon_flags_unknown.yaml", "wokers: 2\n")});
  EXPECT_EQ(p.exit, kDaemonExitUsage);
  EXPECT_NE(p.err.find("wokers"), std::string::npos) << p.err;
  p = Parse({"--config", WriteConfig("/daemon_flags_range.yaml", "workers: 0\n")});
  EXPECT_EQ(p.exit, kDaemonExitUsage);
}

using Ran = testing_util::CommandResult;

Ran RunBinary(const std::string& binary, const std::string& args) {
  return testing_util::RunCommand(binary + " " + args);
}

// Each of these exits before the daemon opens a port, a state directory or a connection.
TEST(DaemonFlags, DaemonBinariesExit0Or2) {
  const std::string unknown_key = WriteConfig("/daemon_flags_daemon.yaml", "no-such-key: 1\n");
  for (const auto& [binary, name, out_of_range] :
       {std::tuple<std::string, std::string, std::string>{
            FURNACE_CONTROLLER_BIN, "furnace-controller", "--telemetry-flush 99"},
        std::tuple<std::string, std::string, std::string>{FURNACE_WORKER_BIN, "furnace-worker",
                                                          "--device-kind tpu"}}) {
    Ran run = RunBinary(binary, "--version");
    EXPECT_EQ(run.exit_code, 0) << name << ": " << run.output;
    EXPECT_EQ(run.output, name + " " + FURNACE_VERSION + "\n");
    run = RunBinary(binary, "--help");
    EXPECT_EQ(run.exit_code, 0) << name << ": " << run.output;
    run = RunBinary(binary, "--config " + unknown_key);
    EXPECT_EQ(run.exit_code, kDaemonExitUsage) << name << ": " << run.output;
    EXPECT_NE(run.output.find("no-such-key"), std::string::npos) << run.output;
    run = RunBinary(binary, out_of_range);
    EXPECT_EQ(run.exit_code, kDaemonExitUsage) << name << ": " << run.output;
    run = RunBinary(binary, "--no-such-flag");
    EXPECT_EQ(run.exit_code, kDaemonExitUsage) << name << ": " << run.output;
  }
  // A bad option of `furnace-worker rank` is a rank's error (1): its 2 means a job kind not in
  // this build.
  const Ran rank = RunBinary(FURNACE_WORKER_BIN, "rank --task /nonexistent/task.pb");
  EXPECT_EQ(rank.exit_code, 1) << rank.output;
}

// A controller on a wildcard address without --advertise would start, and tell its workers to
// dial 0.0.0.0: refused before it opens a port or its state directory (exit 2, naming the flag).
TEST(DaemonFlags, AWildcardListenWithoutAdvertiseIsRefused) {
  for (const char* wildcard : {"0.0.0.0:17070", "[::]:17070"}) {
    // `timeout`: a controller that accepted the address would run until stopped.
    const Ran run = RunBinary(std::string("timeout 30 ") + FURNACE_CONTROLLER_BIN,
                              std::string("--listen ") + wildcard + " --insecure --state-dir " +
                                  ::testing::TempDir() + "/daemon_flags_never_made");
    EXPECT_EQ(run.exit_code, kDaemonExitUsage) << run.output;
    EXPECT_NE(run.output.find("--advertise"), std::string::npos) << run.output;
    EXPECT_NE(run.output.find(std::string("--listen ") + wildcard), std::string::npos)
        << run.output;
  }
  EXPECT_FALSE(std::filesystem::exists(::testing::TempDir() + "/daemon_flags_never_made"));
}

// An agent whose work directory others may write (they could plant the task files its ranks
// start from) is refused before it dials the controller (exit 2, naming the flag).
TEST(DaemonFlags, AWorkDirOthersMayWriteIsRefused) {
  const std::string open_dir = ::testing::TempDir() + "/daemon_flags_open_work_dir";
  std::filesystem::create_directories(open_dir);
  std::filesystem::permissions(open_dir, std::filesystem::perms::all);  // 0777
  const Ran run =
      RunBinary(std::string("timeout 30 ") + FURNACE_WORKER_BIN, "--work-dir " + open_dir);
  EXPECT_EQ(run.exit_code, kDaemonExitUsage) << run.output;
  EXPECT_NE(run.output.find("--work-dir " + open_dir + ": mode 0777"), std::string::npos)
      << run.output;
  EXPECT_NE(run.output.find("chmod go-w"), std::string::npos) << run.output;
  std::filesystem::remove_all(open_dir);
}

}  // namespace
}  // namespace furnace
