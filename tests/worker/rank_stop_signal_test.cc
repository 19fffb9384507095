// SIGUSR1 on a rank (worker/rank_stop_signal.h): it asks the training loop's StopToken for a
// checkpointed stop without interrupting a blocking call of any thread the rank started, and ends
// a rank that has no loop to ask as SIGTERM does. Each case runs in a child process: the signal
// set-up is process-wide and starts a thread of its own.
#include "worker/rank_stop_signal.h"

#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <thread>

#include "gtest/gtest.h"
#include "runtime/train/trainer.h"

namespace furnace::worker {
namespace {

constexpr int kInterrupted = 2;
constexpr int kNotAsked = 3;

// Runs `child` in a forked process and returns its wait status.
template <typename F>
int InChild(F child) {
  const pid_t pid = fork();
  if (pid == 0) _exit(child());
  int status = 0;
  EXPECT_EQ(waitpid(pid, &status, 0), pid);
  return status;
}

// A poll() sleeping in the main thread (in a rank, the training loop waiting on a collective) and
// in a thread started after the set-up (NCCL's or Gloo's) ran through a SIGUSR1 sent meanwhile:
// poll returns EINTR whatever SA_RESTART says, so a handler run on either thread cut it short.
TEST(RankStopSignalTest, AsksTheLoopToStopWithoutInterruptingABlockingCall) {
  const int status = InChild([] {
    InstallStopSignal();
    train::StopToken token;
    SetStopSignalTarget(&token);
    int fds[2];
    if (pipe(fds) != 0) return 1;
    const auto sleep_in_poll = [&] {
      pollfd p{fds[0], POLLIN, 0};
      return poll(&p, 1, 400) < 0 && errno == EINTR;
    };
    bool other_interrupted = false;
    std::thread other([&] { other_interrupted = sleep_in_poll(); });
    std::thread sender([] {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      kill(getpid(), SIGUSR1);
    });
    const bool main_interrupted = sleep_in_poll();
    sender.join();
    other.join();
    if (main_interrupted || other_interrupted) return kInterrupted;
    return token.checkpointed_stop_requested() ? 0 : kNotAsked;
  });
  ASSERT_TRUE(WIFEXITED(status)) << status;
  EXPECT_NE(WEXITSTATUS(status), kInterrupted) << "a blocking call returned EINTR";
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

TEST(RankStopSignalTest, WithNoLoopToAskTheRankEndsAsSigtermEndsIt) {
  const int status = InChild([] {
    InstallStopSignal();
    kill(getpid(), SIGUSR1);
    std::this_thread::sleep_for(std::chrono::seconds(10));
    return 0;
  });
  ASSERT_TRUE(WIFSIGNALED(status)) << status;
  EXPECT_EQ(WTERMSIG(status), SIGTERM);
}

TEST(RankStopSignalTest, AfterTheLoopTheSignalIsIgnored) {
  const int status = InChild([] {
    InstallStopSignal();
    IgnoreStopSignal();
    kill(getpid(), SIGUSR1);
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    return 0;
  });
  ASSERT_TRUE(WIFEXITED(status)) << status;
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

}  // namespace
}  // namespace furnace::worker
