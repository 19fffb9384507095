// Fleet: N simulated worker agents driving a real furnace-controller over a few gRPC channels
// with the asynchronous client API on a few completion queues (a thread each), so one process
// holds thousands of agents. Not the callback API: Debian's gRPC checks, on every completion, the
// list of operations outstanding on its queue, and the callback API has one queue for the whole
// process, where 12,288 open command streams made each completion scan 12,288 entries
// (controller/service/agent_server.h says the same of the controller's side).
//
// Each agent does what worker/agent.cc does on the wire: Register; one WatchCommands stream; a
// Heartbeat every heartbeat interval (the agents' phases spread evenly over the interval) naming
// the rank it runs; on a start command ReportRank(RANK_STARTED) and the rendezvous of a rank's
// health check (worker/health_check.cc: KvSet health/arrived/<rank>, then an indexed KvGet for
// every rank's key, in 1 s slices until all arrived); once every rank has arrived, one
// PushTelemetry per training step with that step's record (the agent flushes every flush interval,
// the controller's --telemetry-flush, 0.2 s by default, so a step's records arrive spread over
// that interval after the step ends); on a stop command
// ReportRank(RANK_EXITED, STOPPED). Silence() stops some idle agents dead (no heartbeat, stream
// cancelled), like a host that went away.
//
// Threading: the public methods are called from one driver thread; the queues' threads run the
// replies. An agent's rank state is guarded by its own mutex; counters are atomics.
// Errors: every RPC's status lands in the LatencyBook (a failure is counted there, never fatal).
#pragma once

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "bench/controlplane/latency_book.h"
#include "furnace/v1/agent.grpc.pb.h"
#include "furnace/v1/controller.grpc.pb.h"
#include "transport/credentials.h"

namespace furnace::bench {

struct FleetOptions {
  std::string address;  // the controller's gRPC address
  uint32_t agents = 1024;
  uint32_t channels = 8;  // agents are spread over this many HTTP/2 connections
  uint32_t queues = 8;    // ... and over this many completion queues
  double step_s = 2.0;    // seconds per training step once the job runs
  // The agents' telemetry flush interval (worker/agent.h) until the controller tells its own
  // (RegisterResponse.telemetry_flush_s, the controller's --telemetry-flush).
  double flush_s = 0.2;
  double rpc_timeout_s = 10.0;          // client deadline of a unary call
  std::string host_prefix = "loadgen";  // worker ids are "<prefix>-<i / 8>/<i % 8>"
  // What the agents' channels present (transport/credentials.h, as furnace-worker does): TLS
  // files (empty: plaintext) and the join token; and the JobService channel's (the CLI's): the
  // same CA and an admin token for Submit and Cancel when the controller has a --token-file.
  transport::TlsFiles tls;
  std::string join_token;
  std::string admin_token;
};

class CommandStream;

struct SimAgent {
  uint32_t index = 0;
  std::string worker_id;
  std::string session_id;           // written once by Register before anything else runs
  std::atomic<bool> silent{false};  // Silence()d: sends nothing any more
  std::mutex mu;
  bool has_rank = false;  // the fields below name it; guarded by mu
  std::string job_id;
  uint32_t attempt = 0, rank = 0, world = 0;
  bool arrived_all = false;         // its health-check rendezvous is through
  double last_heartbeat_sent = 0;   // steady clock
  CommandStream* stream = nullptr;  // live WatchCommands stream, if any
};

class Fleet {
 public:
  // Fails (InvalidArgument naming the file) when the TLS files or tokens cannot be used.
  static absl::StatusOr<std::unique_ptr<Fleet>> Create(FleetOptions options, LatencyBook& book);
  Fleet(FleetOptions options, LatencyBook& book,
        std::shared_ptr<grpc::ChannelCredentials> agent_credentials,
        std::shared_ptr<grpc::ChannelCredentials> job_credentials);
  ~Fleet();

  // Registers every agent (a bounded number in flight); returns how many got a session.
  uint32_t RegisterAll();
  // Opens every registered agent's command stream.
  void OpenStreams();
  // Starts the heartbeat and telemetry schedule (interval from the Register reply).
  void Start();
  // Submits a job; its id, or the controller's error.
  absl::StatusOr<std::string> Submit(const std::string& yaml);
  absl::Status Cancel(const std::string& job_id);
  // Every agent that holds a rank reports its successful exit (the end of a run).
  void Finish();
  // The job's state (JobSummary.state).
  absl::StatusOr<furnace::v1::JobState> JobState(const std::string& job_id);
  // The job's newest aggregated step as the controller reports it (JobSummary.step).
  absl::StatusOr<uint64_t> JobStep(const std::string& job_id);
  // Every worker the controller knows, as `furnace workers` lists them.
  absl::StatusOr<std::vector<furnace::v1::WorkerInfo>> ListWorkers();
  // Stops `n` agents that hold no rank dead; returns them.
  std::vector<SimAgent*> Silence(uint32_t n);
  // Stops the schedule, cancels the streams and waits for every call in flight.
  void Stop();

  uint32_t ranks_started() const { return ranks_started_; }
  uint32_t ranks_arrived() const { return ranks_arrived_; }
  uint32_t ranks_stopped() const { return ranks_stopped_; }
  uint64_t telemetry_records() const { return telemetry_records_; }
  uint64_t reregister_asks() const { return reregister_asks_; }
  // Heartbeats answered with the controller's rank view (it had its state mutex free for them).
  uint64_t heartbeats_with_view() const { return heartbeats_with_view_; }
  double heartbeat_interval_s() const { return heartbeat_interval_s_; }
  double flush_s() const { return flush_s_; }  // as the controller told it
  // When the last rank arrived (steady clock); 0 until then.
  double all_arrived_at() const { return all_arrived_at_; }
  uint64_t last_step() const { return last_step_; }

  // Called by CommandStream.
  void OnCommand(SimAgent& agent, const furnace::v1::AgentCommand& command);
  void OnStreamDone(SimAgent& agent, CommandStream* stream, const grpc::Status& status);

 private:
  // An asynchronous unary call on the agent's queue: prepare(context, request, queue) makes it;
  // done(status, response) says whether it counts as a success.
  template <typename Req, typename Resp, typename Prepare, typename Done>
  void Call(const char* kind, const SimAgent& agent, Prepare prepare, const Req& request,
            double deadline_s, Done done);
  furnace::v1::AgentService::Stub& Stub(const SimAgent& agent) const;
  // GetJob's summary of the job.
  absl::StatusOr<furnace::v1::JobSummary> Summary(const std::string& job_id);
  grpc::CompletionQueue* Queue(const SimAgent& agent) const;
  void Register(SimAgent& agent, std::function<void()> done);
  void Heartbeat(SimAgent& agent);
  void PushStep(SimAgent& agent, uint64_t step);
  void Arrive(SimAgent& agent);
  void WaitPeers(SimAgent& agent);
  void ReportExit(SimAgent& agent, const std::string& job_id, uint32_t attempt, uint32_t rank,
                  furnace::v1::ExitKind kind = furnace::v1::EXIT_KIND_STOPPED);
  // ReportRank over `agent`'s channel; `on_ok` runs on the completion thread when it succeeded.
  void ReportRank(SimAgent& agent, furnace::v1::RankReport report, std::function<void()> on_ok);
  void ScheduleLoop();

  const FleetOptions options_;
  LatencyBook& book_;
  std::vector<std::shared_ptr<grpc::Channel>> channels_;
  std::vector<std::unique_ptr<furnace::v1::AgentService::Stub>> stubs_;
  std::unique_ptr<furnace::v1::JobService::Stub> jobs_;
  std::vector<std::unique_ptr<grpc::CompletionQueue>> queues_;
  std::vector<std::thread> threads_;  // one per queue
  std::vector<std::unique_ptr<SimAgent>> agents_;
  std::atomic<double> heartbeat_interval_s_{1.0};
  std::atomic<double> flush_s_{0.2};

  std::atomic<uint32_t> ranks_started_{0}, ranks_arrived_{0}, ranks_stopped_{0};
  std::atomic<uint32_t> world_{0};
  std::atomic<double> all_arrived_at_{0};
  std::atomic<uint64_t> telemetry_records_{0}, reregister_asks_{0}, last_step_{0};
  std::atomic<uint64_t> heartbeats_with_view_{0};

  std::atomic<bool> stopping_{false};
  std::thread scheduler_;
  std::mutex flight_mu_;
  std::condition_variable flight_cv_;
  int64_t in_flight_ = 0;  // unary calls and streams not yet done; guarded by flight_mu_
};

}  // namespace furnace::bench
