#include "controller/cli/client.h"

#include <chrono>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "furnace/v1/controller.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "transport/channel_arguments.h"

namespace furnace::cli {

namespace {

// What gRPC's UNAVAILABLE says went wrong, in words a user can act on. gRPC words a failed
// connection "failed to connect to all addresses; last error: UNKNOWN: ipv4:H:P: <why>": a TLS
// handshake that failed must not read as a controller that is not running.
std::string Unreachable(const std::string& message, const std::string& address) {
  std::string why = message;
  if (const size_t last = why.rfind("last error: "); last != std::string::npos) {
    why = why.substr(last + 12);
  }
  // "UNKNOWN: ipv4:127.0.0.1:7070: Ssl handshake failed: ..." -> "Ssl handshake failed: ...".
  if (const size_t at = why.find(address); at != std::string::npos) {
    why = why.substr(at + address.size());
    if (absl::StartsWith(why, ": ")) why = why.substr(2);
  }
  const std::string lower = absl::AsciiStrToLower(message);
  const std::string tls =
      absl::StrCat("TLS handshake with the controller at ", address, " failed: ");
  if (absl::StrContains(lower, "wrong version number")) {
    return absl::StrCat(tls,
                        "it does not speak TLS (a plaintext controller: drop --tls-ca and "
                        "FURNACE_TLS_CA, or start it with --tls-cert/--tls-key/--tls-ca) (",
                        why, ")");
  }
  if (absl::StrContains(lower, "certificate verify failed")) {
    return absl::StrCat(tls,
                        "its certificate failed verification: not signed by the CA given "
                        "(--tls-ca or FURNACE_TLS_CA), expired or not yet valid (",
                        why, ")");
  }
  if (absl::StrContains(lower, "peer name") || absl::StrContains(lower, "hostname")) {
    return absl::StrCat(tls, "its certificate does not name ", address,
                        " (furnace certs init --host NAME) (", why, ")");
  }
  if (absl::StrContains(lower, "handshake")) return absl::StrCat(tls, why);
  if (absl::StrContains(lower, "socket closed") || absl::StrContains(lower, "connection reset")) {
    return absl::StrCat("the controller at ", address,
                        " closed the connection before answering (one that runs with TLS needs "
                        "--tls-ca or FURNACE_TLS_CA) (",
                        why, ")");
  }
  return absl::StrCat("cannot reach the controller at ", address,
                      " (is furnace-controller running? pass --controller)");
}

}  // namespace

absl::Status FromGrpcStatus(const grpc::Status& status, const std::string& rpc,
                            const std::string& address) {
  if (status.ok()) return absl::OkStatus();
  const auto code = static_cast<absl::StatusCode>(status.error_code());
  switch (status.error_code()) {
    case grpc::StatusCode::UNAVAILABLE:
      return absl::UnavailableError(Unreachable(status.error_message(), address));
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return absl::DeadlineExceededError(
          absl::StrCat("the controller at ", address, " did not answer ", rpc, " in time"));
    case grpc::StatusCode::INVALID_ARGUMENT:
    case grpc::StatusCode::NOT_FOUND:
      return absl::Status(code, status.error_message());
    default:
      return absl::Status(code, absl::StrCat(rpc, " failed: ", status.error_message()));
  }
}

namespace {

// No limit on an answer's size (gRPC's default is 4 MiB): a long job's whole series (`furnace
// report` asks for every step) is larger, and the controller bounds the rest (a page of logs is
// at most a MiB, log_store.h). Reconnects as the agents do (transport/channel_arguments.h), so
// `watch`, `logs --follow` and `submit --watch` ride out a controller restart (poll_outage.h).
grpc::ChannelArguments ChannelArguments() {
  grpc::ChannelArguments args = transport::ControllerChannelArguments();
  args.SetMaxReceiveMessageSize(-1);
  return args;
}

class GrpcJobClient : public JobClient {
 public:
  GrpcJobClient(std::string address, std::shared_ptr<grpc::ChannelCredentials> credentials,
                double deadline_s)
      : address_(std::move(address)),
        credentials_(std::move(credentials)),
        deadline_s_(deadline_s),
        stub_(NewStub()) {}

  absl::StatusOr<v1::SubmitJobResponse> SubmitJob(const v1::SubmitJobRequest& request) override {
    return Call<v1::SubmitJobResponse>("SubmitJob", request, &v1::JobService::Stub::SubmitJob);
  }
  absl::StatusOr<v1::SubmitJobResponse> CheckJob(const v1::SubmitJobRequest& request) override {
    return Call<v1::SubmitJobResponse>("CheckJob", request, &v1::JobService::Stub::CheckJob);
  }
  absl::StatusOr<v1::ListJobsResponse> ListJobs() override {
    return Call<v1::ListJobsResponse>("ListJobs", v1::ListJobsRequest(),
                                      &v1::JobService::Stub::ListJobs);
  }
  absl::StatusOr<v1::JobDetail> GetJob(const std::string& job_id) override {
    v1::GetJobRequest request;
    request.set_job_id(job_id);
    return Call<v1::JobDetail>("GetJob", request, &v1::JobService::Stub::GetJob);
  }
  absl::StatusOr<v1::CancelJobResponse> CancelJob(const std::string& job_id) override {
    v1::CancelJobRequest request;
    request.set_job_id(job_id);
    return Call<v1::CancelJobResponse>("CancelJob", request, &v1::JobService::Stub::CancelJob);
  }
  absl::StatusOr<v1::ListWorkersResponse> ListWorkers() override {
    return Call<v1::ListWorkersResponse>("ListWorkers", v1::ListWorkersRequest(),
                                         &v1::JobService::Stub::ListWorkers);
  }
  absl::StatusOr<v1::GetLogsResponse> GetLogs(const v1::GetLogsRequest& request) override {
    return Call<v1::GetLogsResponse>("GetLogs", request, &v1::JobService::Stub::GetLogs);
  }
  absl::StatusOr<v1::JobSeries> GetJobSeries(const v1::GetJobSeriesRequest& request) override {
    return Call<v1::JobSeries>("GetJobSeries", request, &v1::JobService::Stub::GetJobSeries);
  }
  absl::StatusOr<v1::ListAuditEventsResponse> ListAuditEvents(
      const v1::ListAuditEventsRequest& request) override {
    return Call<v1::ListAuditEventsResponse>("ListAuditEvents", request,
                                             &v1::JobService::Stub::ListAuditEvents);
  }

 private:
  template <typename Response, typename Request, typename Method>
  absl::StatusOr<Response> Call(const char* rpc, const Request& request, Method method) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::duration_cast<std::chrono::system_clock::duration>(
                             std::chrono::duration<double>(deadline_s_)));
    Response response;
    const grpc::Status status = (stub_.get()->*method)(&context, request, &response);
    // Unreachable (a controller restarting): the next call goes on a new channel, which connects
    // at once. The old one reconnected only about 5 s after the controller listened again (seen
    // with gRPC 1.51 and GRPC_ARG_MIN_RECONNECT_BACKOFF_MS 5000), half the 10 s a poll rides out
    // (poll_outage.h).
    if (status.error_code() == grpc::StatusCode::UNAVAILABLE) stub_ = NewStub();
    if (!status.ok()) return FromGrpcStatus(status, rpc, address_);
    return response;
  }
  std::unique_ptr<v1::JobService::Stub> NewStub() const {
    return v1::JobService::NewStub(
        grpc::CreateCustomChannel(address_, credentials_, ChannelArguments()));
  }

  std::string address_;
  std::shared_ptr<grpc::ChannelCredentials> credentials_;
  double deadline_s_;
  std::unique_ptr<v1::JobService::Stub> stub_;
};

}  // namespace

std::unique_ptr<JobClient> NewGrpcJobClient(const std::string& address, double deadline_s) {
  return NewGrpcJobClient(address, grpc::InsecureChannelCredentials(), deadline_s);
}

std::unique_ptr<JobClient> NewGrpcJobClient(const std::string& address,
                                            std::shared_ptr<grpc::ChannelCredentials> credentials,
                                            double deadline_s) {
  return std::make_unique<GrpcJobClient>(address, credentials, deadline_s);
}

}  // namespace furnace::cli
