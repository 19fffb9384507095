// Runs one rank as a child process and watches it until it is gone.
//
// The child is fork/exec'd from the supervisor's own thread (PR_SET_PDEATHSIG fires when the
// *thread* that forked exits, so the forking thread must live exactly as long as the child does);
// it gets SIGKILL if the agent dies, leads its own process group (signals go to the whole group,
// so helpers the rank spawned die with it), has stdin on /dev/null, stdout and stderr on pipes,
// and the telemetry pipe on fd 3 (worker/telemetry_pipe.h).
//
// The supervisor thread polls the pipes: every output line is appended to the rank's log file and
// handed to the log sink; every telemetry record is handed to the telemetry sink and counts as
// progress. Records of the rank's own watchdog (worker/rank_watchdog.h) are not handed on: a
// heartbeat only says the process is alive; a hang report ("hung in step 12: all_reduce on group
// dp[0,1] (2 ranks) for 8.0 s ...") makes the supervisor kill the group and report EXIT_KIND_HANG
// with that reason. The supervisor's own hang watchdog kills the group when no record at all
// arrived for hang_timeout_s (before the first record, max(hang_timeout_s, start_timeout_s): the
// rank is still starting), or FrozenTimeoutS(hang_timeout_s) once the rank has sent a
// watchdog heartbeat (then only a frozen process goes silent; the reason says whether the kernel
// shows it stopped); measured on the given Clock from the spawn. When the child ends, the
// supervisor kills what is left of its group, reaps it, classifies the end (ExitKind, reason in
// words, failed_unix) and calls the exit sink exactly once, from the supervisor thread. A rank the
// supervisor killed that still has not ended kUnkillableS later (uninterruptible sleep in a
// driver or a hung mount: state D) is reported then, as killed, with its state in the reason: the
// controller recovers the job instead of waiting on it; the supervisor goes on waiting to reap it
// (its slot stays taken until the kernel lets it go), and calls the sink no second time.
//
// Ownership: the supervisor owns the child, its pipes and its thread; destroying it kills the
// child (if still running) and joins the thread (for a stuck child: until the kernel lets it go).
// Sinks are called on the supervisor thread and must not block for long (the rank blocks when its
// pipes fill) nor destroy the supervisor. Thread-safety: Stop, pid, done and exit_report may be
// called from any thread.
#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "furnace/v1/agent.pb.h"
#include "furnace/v1/telemetry.pb.h"
#include "runtime/base/clock.h"
#include "worker/rank_exit.h"
#include "worker/telemetry_pipe.h"

namespace furnace::worker {

// How long a rank that runs its own watchdog may send nothing at all, not even a heartbeat, before
// its agent calls it hung: 1.5 x hang_timeout_s, longer than the rank watchdog's step timeout
// (hang_timeout_s), so that a rank blocked on a frozen peer reports the collective it waits in
// before the peer's agent gives up on the peer.
double FrozenTimeoutS(double hang_timeout_s);

// The job's recovery.start_timeout_s (the spec defaults it; 60 s for a task without one).
double StartTimeoutS(const furnace::v1::RankTask& task);

struct RankLaunch {
  std::string job_id;
  uint32_t attempt = 0;
  uint32_t rank = 0;
  std::vector<std::string> argv;  // argv[0] is the program path (execv, no PATH search)
  std::string log_path;           // created with its parent directories; appended to
  double hang_timeout_s = 0;      // <= 0: no hang watchdog
  // Until its first record the rank is starting (exec, loading its libraries: seconds on a loaded
  // host), and silence ends it only after max(hang_timeout_s, start_timeout_s).
  double start_timeout_s = 0;
};

struct RankSinks {
  std::function<void(furnace::v1::LogLine)> on_log;                // may be empty
  std::function<void(furnace::v1::TelemetryRecord)> on_telemetry;  // may be empty
  std::function<void(const furnace::v1::RankReport&)> on_exit;     // may be empty
};

class RankSupervisor {
 public:
  // Spawns the child and returns once it runs (the exec succeeded) or could not be started.
  // Errors: Internal/NotFound/PermissionDenied with the reason when fork or exec failed,
  // DeadlineExceeded when the exec did not complete within 5 s (a hung file system: the child is
  // killed) (the caller reports EXIT_KIND_LAUNCH); on error no sink is ever called.
  static absl::StatusOr<std::unique_ptr<RankSupervisor>> Start(RankLaunch launch, RankSinks sinks,
                                                               const Clock& clock = RealClock());
  ~RankSupervisor();
  RankSupervisor(const RankSupervisor&) = delete;
  RankSupervisor& operator=(const RankSupervisor&) = delete;

  // Asks the rank to stop: SIGTERM to its group now, SIGKILL after grace_s. The exit is then
  // reported as EXIT_KIND_STOPPED with `reason`. With checkpoint_grace_s > 0, a stop that keeps
  // the progress: SIGUSR1 to the rank first (worker/rank_stop_signal.h: it stops after its step
  // in progress with a checkpoint), SIGTERM only if it still runs checkpoint_grace_s later, then
  // SIGKILL grace_s after that. Repeated calls only bring the signals forward.
  void Stop(double grace_s, const std::string& reason, double checkpoint_grace_s = 0);
  // Blocks until the exit sink has returned: the child is reaped, or it is stuck (SIGKILL did not
  // end it in kUnkillableS; the thread goes on waiting to reap it, and the destructor would wait
  // with it: a caller that must not block, such as an agent that exits, releases the supervisor).
  void Wait();
  // No sink is called after this returns (one being called finishes first): for an owner that
  // goes while the supervisor's thread still runs (a stuck rank's, released by an exiting agent).
  void DetachSinks();

  int pid() const { return pid_; }
  const RankLaunch& launch() const { return launch_; }
  bool done() const { return done_.load(); }
  // Reported as ended, but SIGKILL has not ended it yet (kUnkillableS): it still holds its
  // device. False again once it is reaped.
  bool stuck() const { return stuck_.load(); }
  // Set once done().
  std::optional<furnace::v1::RankReport> exit_report() const;
  // Seconds since the rank's last record of any kind (a log line, telemetry, its watchdog's
  // heartbeat), once it runs its watchdog (before, silence means nothing: it may be starting) and
  // until it is done: a live rank's is at most its heartbeat period (1 s); a frozen one's grows
  // (the agent reports it with each heartbeat, so the controller can tell a frozen rank from the
  // peers that hang waiting for it).
  std::optional<double> SilentSeconds() const;

 private:
  RankSupervisor(RankLaunch launch, RankSinks sinks, const Clock& clock);
  void ThreadMain(std::promise<absl::Status>* started);
  absl::Status Spawn();
  void Supervise();
  void ReadStream(int index);
  void EmitLine(std::string_view line);
  void OnWatchdogRecord(const furnace::v1::RankWatchdogRecord& watchdog);
  void KillGroup(int signal);
  // The exit sink has returned (the child reaped or stuck): wakes Wait.
  void Settle();
  // Calls `call(sinks_)` unless DetachSinks came first (under sinks_mu_: never while mu_ is held,
  // since the sinks take their owner's locks, which call Stop).
  template <typename Call>
  void CallSinks(Call&& call) {
    std::lock_guard<std::mutex> lock(sinks_mu_);
    if (!sinks_detached_) call(sinks_);
  }
  furnace::v1::RankReport Classify(int wait_status);

  const RankLaunch launch_;
  const RankSinks sinks_;
  const Clock& clock_;
  std::thread thread_;
  int pid_ = -1;
  std::atomic<bool> done_{false};
  std::atomic<bool> stuck_{false};

  // Owned by the supervisor thread.
  struct Stream {
    int fd = -1;
    std::string partial;  // output streams: bytes after the last newline
  };
  Stream streams_[3];  // stdout, stderr, telemetry
  int log_fd_ = -1;
  double last_record_s_ = 0;  // any record, watchdog heartbeats included
  // What SilentSeconds reads, from any thread.
  std::atomic<double> last_record_shared_s_{0};
  std::atomic<bool> watchdog_heard_{false};
  bool has_watchdog_ = false;        // the rank sent a watchdog record
  bool any_record_ = false;          // the rank sent a record: it has started
  bool hang_from_rank_ = false;      // the rank's watchdog reported the hang
  bool hang_in_collective_ = false;  // ... while a collective was in flight (waiting on peers)
  std::string hang_reason_;          // its reason; else what /proc said about the silent process
  double failed_unix_ = 0;           // when the failure happened, as seen from here
  std::optional<uint64_t> last_step_;
  std::string last_message_;
  std::optional<uint64_t> oom_kills_at_start_;
  std::string cgroup_events_path_;
  bool hung_ = false;
  double hang_for_s_ = 0;
  bool term_sent_ = false;
  bool usr1_sent_ = false;
  std::optional<double> killed_at_s_;  // when the supervisor first sent the group SIGKILL
  bool reported_ = false;              // the exit sink was called (early, for an unkillable rank)
  // Whether a stop had been asked for when the exit was noticed: a stop that comes in the drain
  // after it (the controller stopping a failed rank's peers) does not make the rank's own end,
  // a crash or a success, read "stopped".
  bool stopped_before_exit_ = false;
  TelemetryDecoder decoder_;
  bool telemetry_corrupt_ = false;

  mutable std::mutex mu_;
  std::optional<double> stop_deadline_s_;          // guarded by mu_: SIGKILL at this time
  std::optional<double> term_at_s_;                // guarded by mu_: SIGTERM at this time
  bool checkpoint_first_ = false;                  // guarded by mu_: SIGUSR1 before SIGTERM
  std::string stop_reason_;                        // guarded by mu_
  bool stop_requested_ = false;                    // guarded by mu_
  std::optional<furnace::v1::RankReport> report_;  // guarded by mu_
  bool settled_ = false;                           // guarded by mu_: see Settle
  std::mutex sinks_mu_;
  bool sinks_detached_ = false;  // guarded by sinks_mu_
  std::condition_variable settled_cv_;
};

}  // namespace furnace::worker
