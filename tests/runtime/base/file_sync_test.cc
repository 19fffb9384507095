// RemoveTempFilesOnSignal: a program ended by SIGINT, SIGTERM or SIGHUP while writing through
// CreateTempBeside leaves no temporary file behind, and keeps what it renamed into place. Each case
// runs in a child process, which the signal ends.
#include "runtime/base/file_sync.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/testing/test_dir.h"

namespace furnace {
namespace {

namespace fs = std::filesystem;

class FileSyncTest : public ::testing::Test {
 protected:
  std::vector<std::string> Files() const {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(dir_.path())) {
      names.push_back(e.path().filename());
    }
    std::sort(names.begin(), names.end());
    return names;
  }

  // How a child treats signals before its body runs.
  struct ChildSignals {
    bool handler = true;  // RemoveTempFilesOnSignal installed
    int ignored = 0;      // a signal ignored before that (as nohup starts a program), or 0
  };
  // Runs `body` in a child, which then raises `signal` and exits 0 should it live on; returns its
  // wait status.
  template <typename Body>
  int RunChild(int signal, Body body, ChildSignals signals = {}) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      if (signals.ignored != 0) ::signal(signals.ignored, SIG_IGN);
      if (signals.handler) RemoveTempFilesOnSignal();
      body();
      ::raise(signal);
      ::_exit(0);
    }
    int status = 0;
    ::waitpid(pid, &status, 0);
    return status;
  }
  // A temporary file beside dir/out.bin, in a child (exit code 3 when it cannot be made).
  void MakeTemp() {
    std::string tmp;
    if (!CreateTempBeside(dir_ / "out.bin", &tmp).ok()) ::_exit(3);
  }

  testing_util::TestDir dir_;
};

TEST_F(FileSyncTest, ASignalRemovesTheTemporaryFilesNotYetRenamed) {
  for (int signal : {SIGINT, SIGTERM, SIGHUP}) {
    const int status = RunChild(signal, [&] {
      // Renamed into place: kept.
      if (!WriteFileAtomically(dir_ / "done.txt", "whole\n").ok()) ::_exit(1);
      // Removed by its writer: forgotten.
      std::string abandoned;
      absl::StatusOr<std::FILE*> a = CreateTempBeside(dir_ / "abandoned.bin", &abandoned);
      if (!a.ok()) ::_exit(2);
      std::fclose(*a);
      RemoveTemp(abandoned);
      // In the making when the signal comes: two of them.
      for (const char* name : {"out.bin", "out.idx"}) {
        std::string tmp;
        absl::StatusOr<std::FILE*> f = CreateTempBeside(dir_ / name, &tmp);
        if (!f.ok()) ::_exit(3);
        std::fputs("half", *f);
        std::fflush(*f);
      }
    });
    ASSERT_TRUE(WIFSIGNALED(status)) << "signal " << signal << ": status " << status;
    EXPECT_EQ(WTERMSIG(status), signal);  // ended by the signal itself, as without the handler
    EXPECT_EQ(Files(), std::vector<std::string>{"done.txt"}) << "signal " << signal;
    fs::remove(dir_ / "done.txt");
  }
}

// A signal the program was started ignoring (nohup) stays ignored: the run goes on, and what it
// writes is its own to finish.
TEST_F(FileSyncTest, ASignalIgnoredAtStartStaysIgnored) {
  const int status = RunChild(SIGHUP, [&] { MakeTemp(); }, {.handler = true, .ignored = SIGHUP});
  ASSERT_TRUE(WIFEXITED(status)) << status;
  EXPECT_EQ(WEXITSTATUS(status), 0);
  EXPECT_EQ(Files().size(), 1u);
}

// Without the handler (a daemon's choice), a signal leaves the file: the handler is what removes
// it.
TEST_F(FileSyncTest, WithoutTheHandlerTheTemporaryFileStays) {
  const int status = RunChild(SIGTERM, [&] { MakeTemp(); }, {.handler = false});
  ASSERT_TRUE(WIFSIGNALED(status)) << status;
  const std::vector<std::string> files = Files();
  ASSERT_EQ(files.size(), 1u);
  EXPECT_EQ(files[0].rfind("out.bin.tmp.", 0), 0u) << files[0];
}

}  // namespace
}  // namespace furnace
