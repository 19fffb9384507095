// Thin gRPC adapters: translate each RPC to a Controller call and absl::Status to grpc::Status
// (the code numbers are the same). No logic lives here.
#pragma once

#include "controller/service/controller.h"
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

// Heartbeat and WatchCommands use the callback API: every agent holds a command stream and beats
// once a second, and the synchronous API spends a thread on each open stream and a thread hand-off
// on each call, which at thousands of agents cost more CPU than the work itself
// (bench/controlplane/REPORT.md). Both only take short locks, so they run on gRPC's threads. The
// other methods may wait (a rendezvous KvGet, a commit's fsync) and stay synchronous.
class AgentServiceImpl final : public furnace::v1::AgentService::WithCallbackMethod_Heartbeat<
                                   furnace::v1::AgentService::WithCallbackMethod_WatchCommands<
                                       furnace::v1::AgentService::Service>> {
 public:
  explicit AgentServiceImpl(Controller& controller) : c_(controller) {}
  grpc::Status Register(grpc::ServerContext*, const furnace::v1::RegisterRequest*,
                        furnace::v1::RegisterResponse*) override;
  grpc::ServerUnaryReactor* Heartbeat(grpc::CallbackServerContext*,
                                      const furnace::v1::HeartbeatRequest*,
                                      furnace::v1::HeartbeatResponse*) override;
  grpc::ServerWriteReactor<furnace::v1::AgentCommand>* WatchCommands(
      grpc::CallbackServerContext*, const furnace::v1::WatchCommandsRequest*) override;
  grpc::Status ReportRank(grpc::ServerContext*, const furnace::v1::RankReport*,
                          furnace::v1::Ack*) override;
  grpc::Status PushTelemetry(grpc::ServerContext*, const furnace::v1::TelemetryBatch*,
                             furnace::v1::Ack*) override;
  grpc::Status PushLogs(grpc::ServerContext*, const furnace::v1::LogBatch*,
                        furnace::v1::Ack*) override;
  grpc::Status KvSet(grpc::ServerContext*, const furnace::v1::KvSetRequest*,
                     furnace::v1::Ack*) override;
  grpc::Status KvGet(grpc::ServerContext*, const furnace::v1::KvGetRequest*,
                     furnace::v1::KvGetResponse*) override;

 private:
  Controller& c_;
};

}  // namespace furnace::controller
