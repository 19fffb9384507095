#include "worker/rank_stop_signal.h"

#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <system_error>
#include <thread>

#include "spdlog/spdlog.h"

namespace furnace::worker {
namespace {

std::atomic<train::StopToken*> g_target{nullptr};
static_assert(std::atomic<train::StopToken*>::is_always_lock_free);

// Async-signal-safe: lock-free atomics, sigaction and kill only.
void ActOnStopSignal() {
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

void OnStopSignal(int) { ActOnStopSignal(); }

}  // namespace

void InstallStopSignal() {
  // For the threads that already run (OpenBLAS's, started at load time), which the mask below
  // does not reach: without a handler, SIGUSR1 delivered to one would end the process.
  struct sigaction action {};
  action.sa_handler = OnStopSignal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  if (::sigaction(SIGUSR1, &action, nullptr) != 0) {
    spdlog::warn("SIGUSR1 handler not installed ({}): a stop will not keep the progress",
                 std::strerror(errno));
    return;
  }
  sigset_t usr1;
  sigemptyset(&usr1);
  sigaddset(&usr1, SIGUSR1);
  if (const int err = ::pthread_sigmask(SIG_BLOCK, &usr1, nullptr); err != 0) {
    spdlog::warn("SIGUSR1 not blocked ({}): it may interrupt a blocking call", std::strerror(err));
    return;
  }
  // Every thread started from here on (the training loop's, NCCL's and Gloo's, the watchdog's)
  // inherits the mask, so none has a call cut short by EINTR (poll, epoll_wait and nanosleep
  // return it whatever SA_RESTART says); this one takes the signal.
  try {
    std::thread([usr1] {
      while (true) {
        int signo = 0;
        if (::sigwait(&usr1, &signo) == 0 && signo == SIGUSR1) ActOnStopSignal();
      }
    }).detach();
  } catch (const std::system_error& e) {
    // No thread to take it: the handler does, on whichever thread the signal lands.
    ::pthread_sigmask(SIG_UNBLOCK, &usr1, nullptr);
    spdlog::warn("SIGUSR1 thread not started ({}): a stop may interrupt a blocking call", e.what());
  }
}

void SetStopSignalTarget(train::StopToken* token) { g_target.store(token); }

void IgnoreStopSignal() {
  static train::StopToken after_the_loop;  // requests nobody reads
  g_target.store(&after_the_loop);
}

}  // namespace furnace::worker
