// The JobService's thin gRPC adapter (the CLI's and the dashboard's calls: few, synchronous API):
// translates each RPC to a Controller call and absl::Status to grpc::Status (the code numbers are
// the same). No logic lives here. The AgentService is agent_server.h.
#pragma once

#include "controller/service/controller.h"
#include "furnace/v1/controller.grpc.pb.h"

namespace furnace::controller {

class JobServiceImpl final : public furnace::v1::JobService::Service {
 public:
  explicit JobServiceImpl(Controller& controller) : c_(controller) {}
  grpc::Status SubmitJob(grpc::ServerContext*, const furnace::v1::SubmitJobRequest*,
                         furnace::v1::SubmitJobResponse*) override;
  grpc::Status CheckJob(grpc::ServerContext*, const furnace::v1::SubmitJobRequest*,
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

}  // namespace furnace::controller
