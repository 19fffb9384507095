// AgentServer: the AgentService (every agent's registration, heartbeats, command stream, rank
// reports, telemetry, logs and its ranks' rendezvous) on gRPC's completion-queue API, over several
// completion queues, each with a thread of its own. A thin adapter: every call is translated to a
// Controller call, absl::Status to grpc::Status (the code numbers are the same); no logic lives
// here.
//
// Why completion queues, not the callback API (bench/controlplane/REPORT.md): Debian's gRPC 1.51
// is built with its debug checks on, and every completion on a completion queue then scans the
// queue's list of outstanding operations (cq_check_tag, under the queue's lock). The callback API
// puts every call of the process on one shared queue, so at 12,288 agents (each with an open
// command stream: 12,288 operations outstanding for good) every completion scanned ~12,000 entries
// under one lock, and a job start (tens of thousands of completions) stalled heartbeats for over
// 10 s: every agent was declared lost. With kQueues queues each holds 1/kQueues of the calls.
// No call holds a thread while it waits either: a waiting KvGet or KvSet is finished from the
// rendezvous' or the group commit's callback, and an idle command stream leaves a wake-up with the
// WorkerRegistry.
//
// Where the work runs: Heartbeat (never waits: Controller::TryHeartbeat), KvSet and KvGet (the
// rendezvous fences without the state mutex) run on the queue's thread. Register, ReportRank,
// PushTelemetry and PushLogs need the state mutex, which a transition holds while it is written,
// so they run on a HandlerPool of kHandlerThreads; past kMaxQueuedCalls a call is refused with
// UNAVAILABLE (agents retry), which bounds the memory of a controller that falls behind.
//
// Ownership and threading: owns the service, its queues and threads and the pool; the Controller
// must outlive it. Construct, build the server, Start(), and Stop(server) before the server and
// the Controller go away; Stop shuts the server down.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "controller/service/controller.h"
#include "controller/service/handler_pool.h"
#include "furnace/v1/agent.grpc.pb.h"
#include "grpcpp/grpcpp.h"

namespace furnace::controller {

class AgentServer {
 public:
  static constexpr size_t kQueues = 8;
  static constexpr size_t kHandlerThreads = 4;  // the state mutex serialises them anyway
  // Calls queued for the pool beyond which more are refused; a job start of 12,288 ranks queues
  // about one report each.
  static constexpr size_t kMaxQueuedCalls = 32768;

  // Registers the service on `builder` and adds its completion queues.
  AgentServer(Controller& controller, grpc::ServerBuilder& builder, size_t queues = kQueues);
  ~AgentServer();  // Stop must have run
  AgentServer(const AgentServer&) = delete;
  AgentServer& operator=(const AgentServer&) = delete;

  // After builder.BuildAndStart(): starts the queues' threads and asks for the first calls.
  void Start();
  // Shuts `server` down (its calls get until `deadline`), waits until every call handed to the
  // Controller has been answered, then shuts the queues down and joins their threads.
  void Stop(grpc::Server& server, std::chrono::system_clock::time_point deadline);

  // The pieces of a call (agent_server.cc), reached through these.
  Controller& controller() { return c_; }
  HandlerPool& pool() { return pool_; }
  furnace::v1::AgentService::AsyncService& service() { return service_; }
  bool stopping() const { return stopping_.load(); }
  // Every call object counts from the moment it is requested until its last operation (Finish)
  // has been started, so the queues are shut down only once nothing can start an operation on
  // them.
  void Enter();
  void Leave();

 private:
  Controller& c_;
  furnace::v1::AgentService::AsyncService service_;
  std::vector<std::unique_ptr<grpc::ServerCompletionQueue>> queues_;
  std::vector<std::thread> threads_;
  HandlerPool pool_;
  std::atomic<bool> stopping_{false};
  std::mutex mu_;
  std::condition_variable idle_;
  int64_t calls_ = 0;  // guarded by mu_
  bool started_ = false;
};

}  // namespace furnace::controller
