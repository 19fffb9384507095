#include "bench/distributed/fork_ranks.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <thread>

#include "absl/strings/str_cat.h"

namespace furnace::bench {

std::vector<std::string> RunForked(int world, const std::function<int(int rank)>& body,
                                   double deadline_s) {
  std::fflush(stdout);
  std::fflush(stderr);
  std::vector<pid_t> pids(world, -1);
  std::vector<std::string> failed(world);
  int left = 0;
  for (int r = 0; r < world; ++r) {
    const pid_t pid = fork();
    if (pid == 0) {
      const int code = body(r);
      std::fflush(stdout);
      std::fflush(stderr);
      _exit(code);
    }
    if (pid < 0) {
      failed[r] = "fork failed";
    } else {
      pids[r] = pid;
      ++left;
    }
  }
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::milliseconds(static_cast<int64_t>(deadline_s * 1000));
  while (left > 0) {
    for (int r = 0; r < world; ++r) {
      if (pids[r] <= 0) continue;
      int status = 0;
      if (waitpid(pids[r], &status, WNOHANG) != pids[r]) continue;
      if (!WIFEXITED(status)) {
        failed[r] = absl::StrCat("killed by signal ", WTERMSIG(status));
      } else if (WEXITSTATUS(status) != 0) {
        failed[r] = absl::StrCat("exited with ", WEXITSTATUS(status));
      }
      pids[r] = -1;
      --left;
    }
    if (left > 0 && std::chrono::steady_clock::now() > deadline) {
      for (int r = 0; r < world; ++r) {
        if (pids[r] <= 0) continue;
        kill(pids[r], SIGKILL);
        waitpid(pids[r], nullptr, 0);
        failed[r] = "hung; killed";
      }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return failed;
}

}  // namespace furnace::bench
