// GrpcJobClient against an in-process JobService on a local port: the wire path and the mapping of
// the controller's error codes.
#include <memory>

#include "controller/cli/client.h"
#include "controller/cli/exit_codes.h"
#include "furnace/v1/controller.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"

namespace furnace::cli {
namespace {

class FakeJobService final : public v1::JobService::Service {
 public:
  grpc::Status SubmitJob(grpc::ServerContext*, const v1::SubmitJobRequest* request,
                         v1::SubmitJobResponse* response) override {
    if (request->yaml().empty()) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, request->filename() + ": empty");
    }
    response->set_job_id("j-7");
    return grpc::Status::OK;
  }
  grpc::Status GetJob(grpc::ServerContext*, const v1::GetJobRequest* request,
                      v1::JobDetail* response) override {
    if (request->job_id() != "j-7") {
      return grpc::Status(grpc::StatusCode::NOT_FOUND, "no job " + request->job_id());
    }
    response->mutable_summary()->set_job_id("j-7");
    response->mutable_summary()->set_state(v1::JOB_RUNNING);
    return grpc::Status::OK;
  }
  // A long job's series: more than gRPC's default 4 MiB a client takes.
  grpc::Status GetJobSeries(grpc::ServerContext*, const v1::GetJobSeriesRequest* request,
                            v1::JobSeries* response) override {
    response->set_job_id(request->job_id());
    for (int i = 0; i < 20000; ++i) {
      v1::StepRecord* step = response->add_steps();
      step->set_step(static_cast<uint64_t>(i));
      v1::ExpertTokens* layer = step->add_expert_tokens();
      for (int e = 0; e < 64; ++e) layer->add_tokens(1000.0 + e);
    }
    return grpc::Status::OK;
  }
};

class GrpcClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    builder.RegisterService(&service_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    ASSERT_GT(port_, 0);
    client_ = NewGrpcJobClient("127.0.0.1:" + std::to_string(port_), 5.0);
  }
  void TearDown() override {
    if (server_) server_->Shutdown();
  }

  FakeJobService service_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<JobClient> client_;
};

TEST_F(GrpcClientTest, RoundTripAndErrorCodes) {
  auto job = client_->GetJob("j-7");
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->summary().state(), v1::JOB_RUNNING);

  auto missing = client_->GetJob("j-0");
  EXPECT_EQ(missing.status().message(), "no job j-0");
  EXPECT_EQ(ExitCodeForStatus(missing.status()), kExitJobNotFound);

  v1::SubmitJobRequest request;
  request.set_filename("job.yaml");
  auto invalid = client_->SubmitJob(request);
  EXPECT_EQ(invalid.status().message(), "job.yaml: empty");
  EXPECT_EQ(ExitCodeForStatus(invalid.status()), kExitUsage);

  // Not implemented by the fake: UNIMPLEMENTED, an RPC error.
  auto workers = client_->ListWorkers();
  EXPECT_EQ(ExitCodeForStatus(workers.status()), kExitRpcError);
  EXPECT_NE(workers.status().message().find("ListWorkers failed"), std::string::npos);
}

TEST_F(GrpcClientTest, TakesAnAnswerLargerThanGrpcsDefaultLimit) {
  v1::GetJobSeriesRequest request;
  request.set_job_id("j-7");
  auto series = client_->GetJobSeries(request);
  ASSERT_TRUE(series.ok()) << series.status();
  EXPECT_GT(series->ByteSizeLong(), size_t{4} << 20);
  EXPECT_EQ(series->steps_size(), 20000);
}

}  // namespace
}  // namespace furnace::cli
