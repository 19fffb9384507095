// The controller's gRPC server limits (server_security.h: ConfigureServerLimits): a request above
// --max-request-bytes is refused with RESOURCE_EXHAUSTED before any handler runs, one below it is
// served; with the daemon's own builder settings and AgentService, over loopback.
#include <grpcpp/grpcpp.h>

#include "controller/service/agent_server.h"
#include "controller/service/server_security.h"
#include "gtest/gtest.h"
#include "tests/controller/service/controller_on_temp_dir.h"

namespace furnace::controller {
namespace {

class ServerLimitsTest : public ControllerOnTempDir {
 protected:
  void SetUp() override {
    StartController("furnace-server-limits-test");
    ControllerFlags flags;
    flags.max_request_bytes = uint64_t{2} << 20;  // the smallest the flag allows
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    ConfigureServerLimits(builder, flags);
    agents_ = std::make_unique<AgentServer>(*c_, builder);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    agents_->Start();
    grpc::ChannelArguments args;
    args.SetMaxSendMessageSize(64 << 20);
    stub_ = v1::AgentService::NewStub(grpc::CreateCustomChannel(
        "127.0.0.1:" + std::to_string(port), grpc::InsecureChannelCredentials(), args));
  }
  void TearDown() override {
    agents_->Stop(*server_, std::chrono::system_clock::now() + std::chrono::seconds(5));
    server_.reset();
    agents_.reset();
    ControllerOnTempDir::TearDown();
  }

  grpc::Status PushLogs(size_t bytes) {
    v1::LogBatch batch;
    batch.set_worker_id("h/0");
    v1::LogLine* line = batch.add_lines();
    line->set_job_id("no-such-job");  // served (and ignored) when it gets through
    line->set_text(std::string(bytes, 'x'));
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    v1::Ack ack;
    return stub_->PushLogs(&context, batch, &ack);
  }

  std::unique_ptr<AgentServer> agents_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<v1::AgentService::Stub> stub_;
};

TEST_F(ServerLimitsTest, ARequestAboveMaxRequestBytesIsRefused) {
  const grpc::Status big = PushLogs(3 << 20);
  EXPECT_EQ(big.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << big.error_message();
  const grpc::Status small = PushLogs(1 << 20);
  EXPECT_TRUE(small.ok()) << small.error_message();
}

}  // namespace
}  // namespace furnace::controller
