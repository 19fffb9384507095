// Thin gRPC adapters: translate each RPC to a Controller call and absl::Status to grpc::Status
// (the code numbers are the same). No logic lives here.
#pragma once

#include "controller/service/controller.h"
#include "controller/service/handler_pool.h"
#include "furnace/v1/agent.grpc.pb.h"
#include "furnace/v1/controller.grpc.pb.h"

namespace furnace::controller {

class JobServiceImpl final : public furnace::v1::JobService::Service {
 public:
  explicit JobServiceImpl(Controller& controller) : c_(controller) {}
  grpc::Status SubmitJob(grpc::ServerContext*, const furnace::v1::SubmitJobRequest*,
                         furnace::v1::SubmitJobResponse*) override;
  grpc::Status ListJobs(grpc::ServerContext*, const furnace::v1::ListJobsRequest*,
                        furnace::v1::ListJobsResponse*) override;
  grpc::Status GetJob(grpc::ServerContext*, const furnace::v1::GetJobRequest*,
                      furnace::v1::JobDetail*) override;
  grpc::Status CancelJob(grpc::ServerContext*, const furnace::v1::CancelJobRequest*,
                         furnace::v1::CancelJobResponse*) override;
  grpc::Status ListWorkers(grpc::ServerContext*, const furnace::v1::ListWorkersRequest*,
                           furnace::v1::ListWorkersResponse*) override;
  grpc::Status GetLogs(grpc::ServerContext*, const furnace::v1::GetLogsRequest*,
                       furnace::v1::GetLogsResponse*) override;
  grpc::Status GetJobSeries(grpc::ServerContext*, const furnace::v1::GetJobSeriesRequest*,
                            furnace::v1::JobSeries*) override;
  grpc::Status ListAuditEvents(grpc::ServerContext*, const furnace::v1::ListAuditEventsRequest*,
                               furnace::v1::ListAuditEventsResponse*) override;

 private:
  Controller& c_;
};

// Every AgentService method is on the callback API, so no call holds a thread while it waits:
// every agent holds a command stream and beats once a second, and at job start thousands of ranks
// report, set keys and wait at their rendezvous at once; the synchronous API spent a thread on
// each (6,314 threads at 12,288 agents, bench/controlplane/REPORT.md). Heartbeats and command
// streams run on gRPC's threads (they never wait for the state mutex: Controller::TryHeartbeat,
// WorkerRegistry), as do KvSet and KvGet (the rendezvous fences without it) and finish from their
// callbacks (the group commit's, the rendezvous'). Register, ReportRank, PushTelemetry and
// PushLogs need the state mutex, which a transition holds while it is written, so their bodies
// run on a HandlerPool of kHandlerThreads, queued as closures (a few threads: the mutex
// serialises them anyway, and more only switch more); past kMaxQueuedCalls a call is refused with
// UNAVAILABLE (agents retry), which bounds the memory of a controller that falls behind.
class AgentServiceImpl final : public furnace::v1::AgentService::CallbackService {
 public:
  static constexpr size_t kHandlerThreads = 4;
  // Calls queued for the pool beyond which more are refused (HandlerPool: load shedding); a job
  // start of 12,288 ranks queues about one report each.
  static constexpr size_t kMaxQueuedCalls = 32768;
  explicit AgentServiceImpl(Controller& controller)
      : c_(controller), pool_(kHandlerThreads, kMaxQueuedCalls) {}
  grpc::ServerUnaryReactor* Register(grpc::CallbackServerContext*,
                                     const furnace::v1::RegisterRequest*,
                                     furnace::v1::RegisterResponse*) override;
  grpc::ServerUnaryReactor* Heartbeat(grpc::CallbackServerContext*,
                                      const furnace::v1::HeartbeatRequest*,
                                      furnace::v1::HeartbeatResponse*) override;
  grpc::ServerWriteReactor<furnace::v1::AgentCommand>* WatchCommands(
      grpc::CallbackServerContext*, const furnace::v1::WatchCommandsRequest*) override;
  grpc::ServerUnaryReactor* ReportRank(grpc::CallbackServerContext*, const furnace::v1::RankReport*,
                                       furnace::v1::Ack*) override;
  grpc::ServerUnaryReactor* PushTelemetry(grpc::CallbackServerContext*,
                                          const furnace::v1::TelemetryBatch*,
                                          furnace::v1::Ack*) override;
  grpc::ServerUnaryReactor* PushLogs(grpc::CallbackServerContext*, const furnace::v1::LogBatch*,
                                     furnace::v1::Ack*) override;
  grpc::ServerUnaryReactor* KvSet(grpc::CallbackServerContext*, const furnace::v1::KvSetRequest*,
                                  furnace::v1::Ack*) override;
  grpc::ServerUnaryReactor* KvGet(grpc::CallbackServerContext*, const furnace::v1::KvGetRequest*,
                                  furnace::v1::KvGetResponse*) override;

 private:
  Controller& c_;
  HandlerPool pool_;  // its threads end (running what is queued) before c_ may go away
};

}  // namespace furnace::controller
