// Test helper: runs one real process per rank. RunForked forks `world` children; child r runs
// body(r) and _exit()s with its return value (0 = pass), never returning into gtest. Children
// report what failed on stderr (CHILD_CHECK / CHILD_OK). The parent waits for all of them, up to
// deadline_s, then SIGKILLs stragglers.
//
// Call only from a single-threaded parent (no Gloo context, no threads alive in the test process):
// the children inherit nothing but this thread.
//
// TempDir: a fresh directory (mkdtemp under gtest's temp dir) for one world's rendezvous, made in
// the parent before the fork and removed when the test ends; path() is empty if mkdtemp failed.
#pragma once

#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "gtest/gtest.h"

namespace furnace::comm::forked {

// How one child ended, as waitpid(2) reported it.
struct ChildExit {
  int rank = -1;
  bool exited = false;     // WIFEXITED
  int code = -1;           // WEXITSTATUS when exited
  int signal = 0;          // WTERMSIG when killed
  bool timed_out = false;  // the parent had to kill it
  std::string Describe() const {
    if (timed_out) return absl::StrFormat("rank %d hung and was killed", rank);
    if (exited) return absl::StrFormat("rank %d exited with %d", rank, code);
    return absl::StrFormat("rank %d killed by signal %d", rank, signal);
  }
  bool ok() const { return exited && code == 0; }
};

inline std::vector<ChildExit> RunForked(int world, const std::function<int(int rank)>& body,
                                        double deadline_s = 90) {
  std::fflush(stdout);
  std::fflush(stderr);
  std::vector<pid_t> pids(world, -1);
  for (int rank = 0; rank < world; ++rank) {
    const pid_t pid = fork();
    if (pid == 0) {
      int code = 100;
      try {
        code = body(rank);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "rank %d: exception: %s\n", rank, e.what());
      } catch (...) {
        std::fprintf(stderr, "rank %d: unknown exception\n", rank);
      }
      std::fflush(stderr);
      _exit(code);
    }
    pids[rank] = pid;
  }
  std::vector<ChildExit> exits(world);
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                            std::chrono::duration<double>(deadline_s));
  int left = 0;
  for (int rank = 0; rank < world; ++rank) {
    exits[rank].rank = rank;
    if (pids[rank] > 0) {
      ++left;
    } else {
      exits[rank].code = 101;  // fork failed
      exits[rank].exited = true;
    }
  }
  while (left > 0) {
    for (int rank = 0; rank < world; ++rank) {
      if (pids[rank] <= 0) continue;
      int status = 0;
      const pid_t done = waitpid(pids[rank], &status, WNOHANG);
      if (done != pids[rank]) continue;
      exits[rank].exited = WIFEXITED(status);
      exits[rank].code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
      exits[rank].signal = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
      pids[rank] = -1;
      --left;
    }
    if (left == 0) break;
    if (std::chrono::steady_clock::now() > deadline) {
      for (int rank = 0; rank < world; ++rank) {
        if (pids[rank] <= 0) continue;
        kill(pids[rank], SIGKILL);
        waitpid(pids[rank], nullptr, 0);
        exits[rank].timed_out = true;
        pids[rank] = -1;
      }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return exits;
}

class TempDir {
 public:
  // `prefix` starts the directory's name ("furnace_gloo_comm_").
  explicit TempDir(const std::string& prefix) {
    std::string pattern = ::testing::TempDir() + prefix + "XXXXXX";
    path_ = mkdtemp(pattern.data()) != nullptr ? pattern : "";
  }
  ~TempDir() {
    std::error_code ec;
    if (!path_.empty()) std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace furnace::comm::forked

// In a child: report the failed condition on stderr and return 1 from the body.
#define CHILD_CHECK(rank, cond)                                                              \
  do {                                                                                       \
    if (!(cond)) {                                                                           \
      std::fprintf(stderr, "rank %d: %s:%d: check failed: %s\n", (rank), __FILE__, __LINE__, \
                   #cond);                                                                   \
      return 1;                                                                              \
    }                                                                                        \
  } while (0)

// In a child: the expression's Status must be OK.
#define CHILD_OK(rank, expr)                                                              \
  do {                                                                                    \
    const ::absl::Status child_status_ = (expr);                                          \
    if (!child_status_.ok()) {                                                            \
      std::fprintf(stderr, "rank %d: %s:%d: %s: %s\n", (rank), __FILE__, __LINE__, #expr, \
                   child_status_.ToString().c_str());                                     \
      return 1;                                                                           \
    }                                                                                     \
  } while (0)
