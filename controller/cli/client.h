// The CLI's view of the controller's JobService. Commands take a JobClient so tests can hand them
// a fake; GrpcJobClient is the real one. Every call returns an absl::Status whose code is the gRPC
// code and whose message a person can act on (FromGrpcStatus). A JobClient is used from one thread.
#pragma once

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "furnace/v1/controller.pb.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/support/status.h"

namespace furnace::cli {

class JobClient {
 public:
  virtual ~JobClient() = default;
  virtual absl::StatusOr<v1::SubmitJobResponse> SubmitJob(const v1::SubmitJobRequest& request) = 0;
  // SubmitJob's dry run: the controller checks the file and stores nothing.
  virtual absl::StatusOr<v1::SubmitJobResponse> CheckJob(const v1::SubmitJobRequest& request) = 0;
  virtual absl::StatusOr<v1::ListJobsResponse> ListJobs() = 0;
  virtual absl::StatusOr<v1::JobDetail> GetJob(const std::string& job_id) = 0;
  virtual absl::StatusOr<v1::CancelJobResponse> CancelJob(const std::string& job_id) = 0;
  virtual absl::StatusOr<v1::ListWorkersResponse> ListWorkers() = 0;
  virtual absl::StatusOr<v1::GetLogsResponse> GetLogs(const v1::GetLogsRequest& request) = 0;
  virtual absl::StatusOr<v1::JobSeries> GetJobSeries(const v1::GetJobSeriesRequest& request) = 0;
  virtual absl::StatusOr<v1::ListAuditEventsResponse> ListAuditEvents(
      const v1::ListAuditEventsRequest& request) = 0;
};

// A client for the controller at `address` (host:port). Each call has `deadline_s` to complete.
// Creating it does not connect; the first call does. Plaintext, or with `credentials` (TLS and the
// token: transport::MakeChannelCredentials).
std::unique_ptr<JobClient> NewGrpcJobClient(const std::string& address, double deadline_s = 10.0);
std::unique_ptr<JobClient> NewGrpcJobClient(const std::string& address,
                                            std::shared_ptr<grpc::ChannelCredentials> credentials,
                                            double deadline_s = 10.0);

// Turns a gRPC status from `rpc` against `address` into an absl::Status with the same code.
// UNAVAILABLE says the controller cannot be reached and how to point at another one;
// DEADLINE_EXCEEDED says it did not answer in time; INVALID_ARGUMENT and NOT_FOUND keep the
// controller's message verbatim (it is meant for the user); others name the RPC.
absl::Status FromGrpcStatus(const grpc::Status& status, const std::string& rpc,
                            const std::string& address);

}  // namespace furnace::cli
