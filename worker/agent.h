// The worker agent: one per slot. It registers with the controller, heart-beats, receives rank
// commands on a server stream, runs each rank under a RankSupervisor, and forwards rank reports,
// telemetry and log lines to the controller.
//
// Why it is shaped this way: the controller may restart at any time, so nothing the agent does for
// a rank depends on the controller being reachable. Ranks keep running while the agent
// re-registers (0.2..2 s backoff), listing them in RegisterRequest.running so the controller can
// re-attach. RankReports (started / exited) wait in an ordered queue and are re-sent until the
// controller acks them, also across re-registrations. Telemetry and log lines go through bounded
// drop-oldest queues flushed every flush interval (the controller's RegisterResponse
// telemetry_flush_s, else flush_interval_s), so a slow controller costs data, never a blocked rank.
// Step records the controller acknowledged are held until it says their step is stored, and sent
// again after a new registration (unsettled_records.h): a controller killed while it merged a
// step gets them back.
//
// Heartbeat reconciliation: a controller answers each heartbeat with the ranks its records place
// on this worker (HeartbeatResponse.ranks). A rank the agent runs, listed in that heartbeat, that
// the controller does not want (its attempt is over, or the controller does not know it) is
// stopped: a StopRank command lost on a broken stream no longer leaves an orphan rank holding the
// worker. A rank the controller has seen start here and still believes alive, which the agent
// does not run, is reported ended: its stored exit report is sent again (the controller lost it,
// e.g. it refused it or restarted before writing it), or, for a rank the agent never had, a
// RANK_EXITED report with EXIT_KIND_LOST; otherwise such a rank kept its worker busy and its
// attempt waiting forever. Each such rank is answered once per registration.
// A rank that has ended, whose exit report the controller acknowledged and that the controller no
// longer lists, is forgotten: its entry (the task) and its task file go, so an agent that runs for
// months does not grow with every attempt it ever ran. Its key and exit report stay among the
// newest kForgottenKept forgotten ones: a repeated start of it is still recognised, a late stop
// answered by its report, and a controller that lost the report (it restarted before writing it)
// and lists the rank again gets the report again.
//
// Threads: Run() is the registration/heartbeat loop and starts three more (command stream,
// report sender, telemetry/log flusher); each supervised rank has its own thread.
// Ownership: the agent owns its supervisors and their ranks; the stub is shared.
// Thread-safety: Shutdown() may be called from any thread (not from a signal handler); the other
// public methods are for the owner thread and tests.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "furnace/v1/agent.grpc.pb.h"
#include "runtime/base/clock.h"
#include "worker/bounded_queue.h"
#include "worker/rank_supervisor.h"
#include "worker/unsettled_records.h"

namespace grpc {
class ClientContext;
class Status;
}  // namespace grpc

namespace furnace::worker {

struct AgentOptions {
  std::string controller = "127.0.0.1:7070";  // also handed to ranks lacking controller_address
  uint32_t slot = 0;
  std::string host = "127.0.0.1";  // address peers use to reach this worker's ranks
  std::string worker_id;           // "" = "<hostname>/<slot>"
  std::string work_dir;            // "" = "./worker-<slot>"
  std::string device_kind = "cpu";
  uint64_t device_memory = 0;
  // The rank command; the task file path is appended. Empty = {"/proc/self/exe", "rank", "--task"}.
  std::vector<std::string> rank_command;
  double shutdown_grace_s = 10;  // SIGTERM -> SIGKILL for ranks when the agent shuts down
  double shutdown_flush_s = 3;   // how long shutdown keeps trying to deliver queued reports
  size_t telemetry_capacity = 10000;
  size_t log_capacity = 10000;
  // The same buffers' bounds in bytes (wire size): whichever bound is reached first drops.
  size_t telemetry_bytes = size_t{256} << 20;
  size_t log_bytes = size_t{64} << 20;
  double flush_interval_s = 0.2;  // until a controller says otherwise (RegisterResponse)
  double rpc_timeout_s = 5;       // per unary call
  // The TLS files and join token file the agent dials the controller with; handed to each rank
  // in its RankTask (paths only) for its rendezvous channel. Empty: plaintext.
  furnace::v1::ChannelSecurity channel_security;
  // --data-root / --checkpoint-root, resolved (runtime/base/path_root.h); empty: not confined.
  // Handed to every rank in its task (RankTask.data_root / checkpoint_root): the rank resolves the
  // job's paths under them before it opens anything (worker/train_rank.cc).
  std::string data_root;
  std::string checkpoint_root;
  // --log-level, handed to every rank in its task (RankTask.log_level).
  std::string log_level = "info";
  // --keep-rank-logs: 0 keeps every job's rank logs in work_dir/logs; otherwise a job's are
  // removed once unchanged this long with no rank of it running here (rank_log_retention.h).
  double keep_rank_logs_s = 0;
  // --max-stop-grace: the most of a job's checkpoint.stop_grace_s this agent's own shutdown gives
  // a rank (the service manager's stop timeout must cover it plus shutdown_grace_s).
  double max_stop_grace_s = 60;
};

// Fills worker_id and work_dir defaults.
AgentOptions ResolveAgentOptions(AgentOptions options);

// The agent's work directory holds the task files its ranks start from (the job spec, the paths
// of the TLS files) and their logs: whoever may write it can plant a task or a symlink there, and
// a predictable one in /tmp may be made by someone else first. So a `dir` that exists already
// must be a directory owned by the user the agent runs as and writable by no one else (no group
// or other write bit); FailedPrecondition naming --work-dir, what is wrong and what to do. One
// that does not exist yet is fine: Agent::Run creates it, mode 0700.
absl::Status CheckWorkDir(const std::string& dir);

class Agent {
 public:
  Agent(AgentOptions options, std::shared_ptr<furnace::v1::AgentService::StubInterface> stub,
        const Clock& clock = RealClock());
  ~Agent();
  Agent(const Agent&) = delete;
  Agent& operator=(const Agent&) = delete;

  // Runs until Shutdown(): then stops the ranks (shutdown_grace_s), tries to deliver pending
  // reports for shutdown_flush_s and returns. Errors: only setup failures (work dir unusable).
  absl::Status Run();
  // Makes Run() wind down. Returns immediately.
  void Shutdown();

  const AgentOptions& options() const { return options_; }
  std::vector<furnace::v1::RunningRank> Running() const;
  size_t PendingReports() const;
  // Ranks with an entry: running, or ended and not forgotten yet.
  size_t KnownRanks() const;

 private:
  struct RankEntry {
    furnace::v1::RankTask task;
    std::string task_path;  // its task file (removed with the entry)
    std::unique_ptr<RankSupervisor> supervisor;
    int pid = -1;
    bool exited = false;
    std::optional<furnace::v1::RankReport> exit_report;  // once exited
  };

  void HeartbeatLoop();
  // Tells the controller this agent is shutting down (its ranks' attempts are interrupted, not
  // failed, and nothing is placed on it any more), before the ranks are stopped.
  void SayLeaving();
  bool RegisterOnce();
  void WatchLoop();
  void ReportLoop();
  void FlushLoop();
  bool FlushOnce();
  void HandleCommand(const furnace::v1::AgentCommand& command);
  void HandleStart(furnace::v1::RankTask task);
  void HandleStop(const furnace::v1::StopRank& stop);
  // Acts on the controller's view of this worker's ranks (see the file comment); `sent` is the
  // heartbeat it answers. No-op when the session changed meanwhile.
  void Reconcile(const furnace::v1::HeartbeatRequest& sent,
                 const furnace::v1::HeartbeatResponse& response, uint64_t generation);
  void OnRankExit(const std::string& key, furnace::v1::RankReport report);
  void EnqueueReportLocked(furnace::v1::RankReport report);
  std::vector<furnace::v1::RunningRank> RunningLocked() const;
  void ReapFinished();
  // With keep_rank_logs_s: SweepRankLogs now (Run, before the loops start), and every
  // kRankLogSweepEveryS on a thread of its own until shutdown (a slow disk must not hold the
  // heartbeats back).
  void SweepRankLogsNow();
  void SweepLoop();
  void StopAllRanks();
  absl::Status WriteTaskFile(const furnace::v1::RankTask& task, std::string* path) const;
  // Marks the session dead so HeartbeatLoop registers again.
  void RequestReregisterLocked(uint64_t generation);

  const AgentOptions options_;
  const std::shared_ptr<furnace::v1::AgentService::StubInterface> stub_;
  const Clock& clock_;

  const std::string instance_id_;  // random per agent process (RegisterRequest.instance_id)
  std::mutex flush_mu_;            // one FlushOnce at a time
  // Batches the controller refused for good, dropped: said at most every kRefusalWarnS (guarded
  // by flush_mu_), with how many records and lines since the last time.
  void NoteRefused(const char* what, int count, const std::string& why);
  double refusal_warned_s_ = -1e300;
  double register_warned_s_ = -1e300;  // a refused registration last said (guarded by mu_)
  // Registrations in a row that found the controller unreachable (UNAVAILABLE, DEADLINE_EXCEEDED):
  // past kUnreachableWarnAfter a warning, at most every kUnreachableWarnS (when it was last said:
  // unreachable_warned_s_), says so with the last error and what to check. Guarded by mu_.
  static constexpr int kUnreachableWarnAfter = 3;
  static constexpr double kUnreachableWarnS = 60;
  int unreachable_registers_ = 0;
  double unreachable_warned_s_ = -1e300;
  // What to check when registrations keep failing as unreachable: the TLS files and dates when
  // the agent dials with TLS, the address and the controller's TLS otherwise.
  std::string UnreachableHint(const grpc::Status& status) const;
  uint64_t refused_records_ = 0, refused_lines_ = 0;

  BoundedQueue<furnace::v1::TelemetryRecord> telemetry_;
  // Step records pushed, held until the controller says their step is stored (guarded by
  // flush_mu_; unsettled_records.h). Pushed again after each new registration
  // (flushed_generation_: the registration FlushOnce last pushed under, guarded by flush_mu_).
  UnsettledRecords unsettled_;
  uint64_t flushed_generation_ = 0;
  // With nothing new to push, how often to ask how far the held records' steps are stored.
  static constexpr double kSettleQueryS = 1.0;
  double last_settle_query_s_ = -1e300;  // guarded by flush_mu_
  // Held records let go past the bounds, as last said (at most once a minute; flush_mu_).
  uint64_t held_dropped_said_ = 0;
  double held_dropped_warned_s_ = -1e300;
  BoundedQueue<furnace::v1::LogLine> logs_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool shutting_down_ = false;         // guarded by mu_: stop registering and watching
  bool stop_senders_ = false;          // guarded by mu_: stop the report sender and flusher
  bool registered_ = false;            // guarded by mu_
  uint64_t generation_ = 0;            // guarded by mu_: +1 per successful registration
  std::string session_id_;             // guarded by mu_
  double heartbeat_interval_s_ = 1.0;  // guarded by mu_
  double flush_interval_s_;            // guarded by mu_; the controller's, else the option
  grpc::ClientContext* watch_context_ = nullptr;     // guarded by mu_: the open command stream
  grpc::ClientContext* register_context_ = nullptr;  // guarded by mu_: a Register in flight
  std::map<std::string, RankEntry> ranks_;           // guarded by mu_, by RankKey
  std::deque<furnace::v1::RankReport> reports_;      // guarded by mu_: oldest first, until acked
  std::set<std::string> reconciled_;  // guarded by mu_: ranks answered this registration
  // Ended ranks forgotten (see the file comment), the newest kForgottenKept; guarded by mu_.
  static constexpr size_t kForgottenKept = 4096;
  std::map<std::string, std::optional<furnace::v1::RankReport>> forgotten_;  // key -> exit report
  std::deque<std::string> forgotten_order_;                                  // oldest first
  // Forgets the ended ranks the controller's view `listed` (RankKeys) does not name.
  void ForgetEndedLocked(const std::set<std::string>& listed);
};

}  // namespace furnace::worker
