#include "worker/rank_stop_signal.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>

#include "spdlog/spdlog.h"

namespace furnace::worker {
namespace {

std::atomic<train::StopToken*> g_target{nullptr};
static_assert(std::atomic<train::StopToken*>::is_always_lock_free);

// Async-signal-safe: lock-free atomics, sigaction and kill only.
void OnStopSignal(int) {
  if (train::StopToken* token = g_target.load()) {
    token->RequestCheckpointedStop();
    return;
  }
  // No step to keep: end as SIGTERM ends the rank (it has no handler for it).
  struct sigaction term {};
  term.sa_handler = SIG_DFL;
  sigemptyset(&term.sa_mask);
  ::sigaction(SIGTERM, &term, nullptr);
  ::kill(::getpid(), SIGTERM);
}

}  // namespace

void InstallStopSignal() {
  struct sigaction action {};
  action.sa_handler = OnStopSignal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;  // a blocking call the signal lands in resumes where it can
  if (::sigaction(SIGUSR1, &action, nullptr) != 0) {
    spdlog::warn("SIGUSR1 handler not installed ({}): a stop will not keep the progress",
                 std::strerror(errno));
  }
}

void SetStopSignalTarget(train::StopToken* token) { g_target.store(token); }

void IgnoreStopSignal() {
  static train::StopToken after_the_loop;  // requests nobody reads
  g_target.store(&after_the_loop);
}

}  // namespace furnace::worker
