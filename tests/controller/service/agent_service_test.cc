// The AgentService (AgentServer: completion queues) against a real Controller on loopback:
// registration, heartbeats with the rank view, rank reports, telemetry and the rendezvous through
// the handler pool; the indexed arrival barrier answers who is missing and completes every waiting
// rank when the last one arrives; and thousands of waiting KvGets hold no thread each.
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <condition_variable>
#include <fstream>
#include <future>
#include <mutex>
#include <string>
#include <thread>

#include "controller/service/agent_server.h"
#include "controller/service/server_security.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/controller/service/controller_on_temp_dir.h"
#include "transport/credentials.h"
#include "transport/dev_certs.h"
#include "transport/token_file.h"

namespace furnace::controller {
namespace {

using ::testing::ElementsAre;

constexpr int kRanks = 4;

// This process's thread count (/proc/self/status).
int Threads() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("Threads:", 0) == 0) return std::stoi(line.substr(8));
  }
  return -1;
}

class AgentServiceTest : public ControllerOnTempDir {
 protected:
  void SetUp() override {
    StartController("furnace-agent-service-test");
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    agents_ = std::make_unique<AgentServer>(*c_, builder);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    agents_->Start();
    stub_ = v1::AgentService::NewStub(grpc::CreateChannel("127.0.0.1:" + std::to_string(port),
                                                          grpc::InsecureChannelCredentials()));
  }
  void TearDown() override {
    c_->Shutdown(false);  // ends the rendezvous waits, as the daemon does before the server
    agents_->Stop(*server_, std::chrono::system_clock::now() + std::chrono::seconds(5));
    server_.reset();
    agents_.reset();
    ControllerOnTempDir::TearDown();
  }

  static std::string Id(int slot) { return "h/" + std::to_string(slot); }

  std::unique_ptr<grpc::ClientContext> Context(double seconds = 10) {
    auto context = std::make_unique<grpc::ClientContext>();
    context->set_deadline(std::chrono::system_clock::now() +
                          std::chrono::milliseconds(static_cast<int>(seconds * 1000)));
    return context;
  }

  // kRanks workers registered, a commcheck job placed on them, every rank started.
  void StartJob() {
    for (int s = 0; s < kRanks; ++s) {
      v1::RegisterRequest r;
      r.set_worker_id(Id(s));
      r.set_host("127.0.0.1");
      r.set_slot(s);
      r.set_device_kind("cpu");
      r.set_pid(100 + s);
      r.set_instance_id("i0");
      v1::RegisterResponse resp;
      ASSERT_TRUE(stub_->Register(Context().get(), r, &resp).ok());
      sessions_[s] = resp.session_id();
    }
    auto id = c_->Submit("name: t\nkind: commcheck\nparallel: {dp: 4}\n", "t.yaml");
    ASSERT_TRUE(id.ok()) << id.status();
    job_ = *id;
    for (int s = 0; s < kRanks; ++s) {
      auto cmds = c_->NextCommands(Id(s), sessions_[s], 0.0);
      ASSERT_TRUE(cmds.ok() && cmds->size() == 1) << cmds.status();
      v1::RankReport report;
      report.set_worker_id(Id(s));
      report.set_job_id(job_);
      report.set_attempt(1);
      report.set_rank((*cmds)[0].start().rank());
      report.set_event(v1::RANK_STARTED);
      v1::Ack ack;
      ASSERT_TRUE(stub_->ReportRank(Context().get(), report, &ack).ok());
    }
    auto d = c_->GetJob(job_);
    ASSERT_TRUE(d.ok());
    ASSERT_EQ(d->summary().state(), v1::JOB_RUNNING);
  }

  grpc::Status Arrive(uint32_t rank) {
    v1::KvSetRequest set;
    set.mutable_scope()->set_job_id(job_);
    set.mutable_scope()->set_attempt(1);
    set.set_key("health/arrived/" + std::to_string(rank));
    set.set_value("1");
    v1::Ack ack;
    return stub_->KvSet(Context().get(), set, &ack);
  }

  v1::KvGetRequest Barrier(double timeout_s, const std::string& prefix = "health/arrived/") {
    v1::KvGetRequest get;
    get.mutable_scope()->set_job_id(job_);
    get.mutable_scope()->set_attempt(1);
    get.set_indexed_prefix(prefix);
    get.set_indexed_count(kRanks);
    get.set_timeout_s(timeout_s);
    return get;
  }

  std::unique_ptr<AgentServer> agents_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<v1::AgentService::Stub> stub_;
  std::map<int, std::string> sessions_;
  std::string job_;
};

TEST_F(AgentServiceTest, HeartbeatsCarryTheRankViewAndAStaleSessionIsToldToRegister) {
  StartJob();
  v1::HeartbeatRequest beat;
  beat.set_worker_id(Id(1));
  beat.set_session_id(sessions_[1]);
  v1::HeartbeatResponse resp;
  ASSERT_TRUE(stub_->Heartbeat(Context().get(), beat, &resp).ok());
  EXPECT_FALSE(resp.reregister());
  EXPECT_TRUE(resp.reconcile());  // the state mutex was free
  ASSERT_EQ(resp.ranks_size(), 1);
  EXPECT_EQ(resp.ranks(0).job_id(), job_);
  EXPECT_TRUE(resp.ranks(0).wanted());
  EXPECT_TRUE(resp.ranks(0).started());
  beat.set_session_id("old");
  ASSERT_TRUE(stub_->Heartbeat(Context().get(), beat, &resp).ok());
  EXPECT_TRUE(resp.reregister());
}

TEST_F(AgentServiceTest, IndexedBarrierSaysWhoIsMissingThenCompletesEveryWaiter) {
  StartJob();
  for (uint32_t r : {0u, 1u, 3u}) ASSERT_TRUE(Arrive(r).ok());
  v1::KvGetResponse partial;
  ASSERT_TRUE(stub_->KvGet(Context().get(), Barrier(0.2), &partial).ok());
  EXPECT_FALSE(partial.complete());
  EXPECT_EQ(partial.present(), 3u);
  EXPECT_THAT(partial.missing(), ElementsAre(2u));
  EXPECT_EQ(partial.values_size(), 0);

  // Every rank waits; the last arrival answers them all.
  std::mutex mu;
  std::condition_variable cv;
  int answered = 0, complete = 0;
  struct Call {
    std::unique_ptr<grpc::ClientContext> context;
    v1::KvGetRequest request;
    v1::KvGetResponse response;
  };
  std::vector<Call> calls(kRanks);
  for (Call& call : calls) {
    call.context = Context(30);
    call.request = Barrier(20);
    stub_->async()->KvGet(call.context.get(), &call.request, &call.response,
                          [&, &call = call](grpc::Status s) {
                            std::lock_guard<std::mutex> lock(mu);
                            ++answered;
                            if (s.ok() && call.response.complete()) ++complete;
                            cv.notify_all();
                          });
  }
  ASSERT_TRUE(Arrive(2).ok());
  std::unique_lock<std::mutex> lock(mu);
  ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(10), [&] { return answered == kRanks; }));
  EXPECT_EQ(complete, kRanks);
}

TEST_F(AgentServiceTest, AClosedAttemptIsRefusedAndANamedKeyWaitStillWorks) {
  StartJob();
  ASSERT_TRUE(Arrive(0).ok());
  v1::KvGetRequest get;
  get.mutable_scope()->set_job_id(job_);
  get.mutable_scope()->set_attempt(1);
  get.add_keys("health/arrived/0");
  get.set_timeout_s(1);
  v1::KvGetResponse values;
  ASSERT_TRUE(stub_->KvGet(Context().get(), get, &values).ok());
  EXPECT_THAT(values.values(), ElementsAre("1"));
  get.add_keys("never");
  get.set_timeout_s(0.1);
  EXPECT_EQ(stub_->KvGet(Context().get(), get, &values).error_code(),
            grpc::StatusCode::DEADLINE_EXCEEDED);
  ASSERT_TRUE(c_->Cancel(job_).ok());
  EXPECT_EQ(stub_->KvGet(Context().get(), Barrier(1), &values).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(Arrive(1).error_code(), grpc::StatusCode::FAILED_PRECONDITION);
}

TEST_F(AgentServiceTest, TelemetryIsTakenInAtOnceAndWrittenBehind) {
  StartJob();
  for (uint32_t r = 0; r < kRanks; ++r) {
    v1::TelemetryBatch batch;
    batch.set_worker_id(Id(static_cast<int>(r)));  // each rank's own worker pushes its record
    v1::TelemetryRecord* rec = batch.add_records();
    rec->set_job_id(job_);
    rec->set_attempt(1);
    rec->set_rank(r);
    rec->set_step(1);
    rec->set_phase("running");
    rec->mutable_train()->set_loss(2.0 + r);
    v1::TelemetryAck ack;
    ASSERT_TRUE(stub_->PushTelemetry(Context().get(), batch, &ack).ok());
  }
  // Taken in: the step every rank completed is aggregated in memory at once...
  auto d = c_->GetJob(job_);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(c_->Metrics().jobs.at(0).last.step(), 1u);
  // ...and rank 0's raw record and the step reach the store behind it.
  v1::GetJobSeriesRequest req;
  req.set_job_id(job_);
  absl::StatusOr<v1::JobSeries> series;
  for (int i = 0; i < 1000; ++i) {
    series = c_->GetJobSeries(req);
    d = c_->GetJob(job_);
    ASSERT_TRUE(series.ok() && d.ok());
    if (series->steps_size() == 1 && d->has_telemetry()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_EQ(series->steps_size(), 1);
  EXPECT_EQ(series->steps(0).ranks(), static_cast<uint32_t>(kRanks));
  EXPECT_DOUBLE_EQ(series->steps(0).loss(), 3.5);
  EXPECT_DOUBLE_EQ(d->telemetry().loss(), 2.0);
}

// Reports and telemetry from many threads at once: every call is answered once, and every step
// completed by every rank is aggregated.
TEST_F(AgentServiceTest, ConcurrentTelemetryAndReportsAreAllTakenIn) {
  StartJob();
  constexpr int kSteps = 200;
  std::atomic<int> answered{0};
  std::vector<std::thread> ranks;
  for (uint32_t r = 0; r < kRanks; ++r) {
    ranks.emplace_back([&, r] {
      for (int step = 1; step <= kSteps; ++step) {
        v1::TelemetryBatch batch;
        batch.set_worker_id(Id(static_cast<int>(r)));
        v1::TelemetryRecord* rec = batch.add_records();
        rec->set_job_id(job_);
        rec->set_attempt(1);
        rec->set_rank(r);
        rec->set_step(step);
        rec->set_phase("running");
        rec->mutable_train()->set_loss(1.0);
        std::promise<absl::Status> taken;
        c_->PushTelemetry(batch, [&](absl::Status s) { taken.set_value(s); });
        EXPECT_TRUE(taken.get_future().get().ok());
        ++answered;
        v1::RankReport again;  // a re-sent start report changes nothing, and is answered
        again.set_worker_id(Id(static_cast<int>(r)));
        again.set_job_id(job_);
        again.set_attempt(1);
        again.set_rank(r);
        again.set_event(v1::RANK_STARTED);
        EXPECT_TRUE(c_->ReportRank(again).ok());
      }
    });
  }
  for (auto& t : ranks) t.join();
  EXPECT_EQ(answered.load(), kRanks * kSteps);
  EXPECT_EQ(c_->Metrics().jobs.at(0).last.step(), static_cast<uint64_t>(kSteps));
  EXPECT_EQ(c_->Metrics().jobs.at(0).last.ranks(), static_cast<uint32_t>(kRanks));
}

// 2,000 ranks wait at a barrier at once (more than a synchronous server would give threads to):
// the process keeps a bounded number of threads, and every wait is answered at its timeout.
TEST_F(AgentServiceTest, ThousandsOfWaitingCallsHoldNoThreadEach) {
  StartJob();
  constexpr int kWaits = 2000;
  std::mutex mu;
  std::condition_variable cv;
  int answered = 0, incomplete = 0;
  struct Call {
    std::unique_ptr<grpc::ClientContext> context;
    v1::KvGetRequest request;
    v1::KvGetResponse response;
  };
  std::vector<Call> calls(kWaits);
  const int before = Threads();
  for (Call& call : calls) {
    call.context = Context(30);
    call.request = Barrier(2.0, "never/");
    stub_->async()->KvGet(call.context.get(), &call.request, &call.response,
                          [&, &call = call](grpc::Status s) {
                            std::lock_guard<std::mutex> lock(mu);
                            ++answered;
                            if (s.ok() && !call.response.complete()) ++incomplete;
                            cv.notify_all();
                          });
  }
  int during = 0;
  {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait_for(lock, std::chrono::milliseconds(1000), [&] { return answered > 0; });
    during = Threads();
    ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(30), [&] { return answered == kWaits; }));
  }
  EXPECT_EQ(incomplete, kWaits);
  EXPECT_LT(during - before, 100) << "threads before " << before << ", while waiting " << during;
}

// Over TLS, with a host's own worker certificate (certs init --worker-host h): the processor lets
// it act only as the workers of host h, and each call must be about the worker its credentials
// name, so one worker cannot register, report or push as another.
class SecureAgentServiceTest : public ControllerOnTempDir {
 protected:
  void SetUp() override {
    StartController("furnace-secure-agent-test");
    certs_ = dir_ / "certs";
    transport::DevCertsOptions dev;
    dev.dir = certs_.string();
    dev.worker_hosts = {"h"};
    ASSERT_TRUE(transport::WriteDevCerts(dev).ok());
    ControllerFlags flags;
    flags.listen = "127.0.0.1:0";
    flags.tls_ca = (certs_ / "ca.pem").string();
    flags.tls_cert = (certs_ / "controller.pem").string();
    flags.tls_key = (certs_ / "controller.key").string();
    flags.join_token_file = (certs_ / "join.token").string();
    auto security = MakeServerSecurity(flags);
    ASSERT_TRUE(security.ok()) << security.status();
    grpc::ServerBuilder builder;
    builder.AddListeningPort(flags.listen, security->credentials, &port_);
    agents_ = std::make_unique<AgentServer>(*c_, builder);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    agents_->Start();
  }
  void TearDown() override {
    c_->Shutdown(false);
    agents_->Stop(*server_, std::chrono::system_clock::now() + std::chrono::seconds(5));
    server_.reset();
    agents_.reset();
    ControllerOnTempDir::TearDown();
  }

  // A stub with `cert` (worker.pem: the fleet's; worker-h.pem: host h's) saying it is `header_id`.
  std::unique_ptr<v1::AgentService::Stub> Stub(const std::string& cert,
                                               const std::string& header_id) {
    transport::ClientSecurity s;
    s.tls = {(certs_ / "ca.pem").string(), (certs_ / (cert + ".pem")).string(),
             (certs_ / (cert + ".key")).string()};
    s.token = *transport::ReadClientToken((certs_ / "join.token").string(), "t");
    s.worker_id = header_id;
    auto credentials = transport::MakeChannelCredentials(s);
    EXPECT_TRUE(credentials.ok()) << credentials.status();
    return v1::AgentService::NewStub(
        grpc::CreateChannel("localhost:" + std::to_string(port_), *credentials));
  }
  static grpc::Status Register(v1::AgentService::Stub& stub, const std::string& worker_id) {
    v1::RegisterRequest r;
    r.set_worker_id(worker_id);
    r.set_host("127.0.0.1");
    r.set_device_kind("cpu");
    r.set_pid(100);
    r.set_instance_id("i0");
    v1::RegisterResponse resp;
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    return stub.Register(&context, r, &resp);
  }

  std::filesystem::path certs_;
  int port_ = 0;
  std::unique_ptr<AgentServer> agents_;
  std::unique_ptr<grpc::Server> server_;
};

TEST_F(SecureAgentServiceTest, AWorkerActsOnlyAsItself) {
  EXPECT_TRUE(Register(*Stub("worker-h", "h/0"), "h/0").ok());
  // Host h's certificate saying it is a worker of host g: refused before any handler.
  const grpc::Status other_host = Register(*Stub("worker-h", "g/0"), "g/0");
  EXPECT_EQ(other_host.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(other_host.error_message(),
              ::testing::HasSubstr("the certificate of furnace-worker:h may act only as worker h "
                                   "or h/<slot>, not as `g/0`"));
  // (A name that only starts with the host's is another host.)
  EXPECT_EQ(Register(*Stub("worker-h", "hh/0"), "hh/0").error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  // Credentials of h/0, a call for h/1: refused by the handler.
  const grpc::Status other_worker = Register(*Stub("worker-h", "h/0"), "h/1");
  EXPECT_EQ(other_worker.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(other_worker.error_message(),
              ::testing::HasSubstr("the call is for worker `h/1` but comes with the credentials "
                                   "of agent:h/0"));
  EXPECT_TRUE(Register(*Stub("worker-h", "h/1"), "h/1").ok());
  // The fleet's shared certificate may be any worker, but still only the one it says it is.
  EXPECT_TRUE(Register(*Stub("worker", "g/0"), "g/0").ok());
  EXPECT_EQ(Register(*Stub("worker", "g/0"), "g/1").error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
}

// A rendezvous is its attempt's workers' only: another worker (with its own credentials) can
// neither write nor read its keys.
TEST_F(SecureAgentServiceTest, ARendezvousIsItsWorkersOnly) {
  ASSERT_TRUE(Register(*Stub("worker-h", "h/0"), "h/0").ok());
  auto job = c_->Submit("name: t\nkind: commcheck\nparallel: {dp: 1}\n", "t.yaml");
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_TRUE(Register(*Stub("worker", "g/0"), "g/0").ok());  // after: holds no rank of it
  auto set = [&](const std::string& cert, const std::string& worker) {
    v1::KvSetRequest r;
    r.mutable_scope()->set_job_id(*job);
    r.mutable_scope()->set_attempt(1);
    r.set_key("nccl/id");
    r.set_value(worker);
    v1::Ack ack;
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    return Stub(cert, worker)->KvSet(&context, r, &ack);
  };
  EXPECT_TRUE(set("worker-h", "h/0").ok());
  const grpc::Status foreign = set("worker", "g/0");
  EXPECT_EQ(foreign.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(foreign.error_message(),
              ::testing::HasSubstr("worker g/0 holds no rank of attempt 1 of job " + *job));
  v1::KvGetRequest get;
  get.mutable_scope()->set_job_id(*job);
  get.mutable_scope()->set_attempt(1);
  get.add_keys("nccl/id");
  v1::KvGetResponse got;
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  EXPECT_EQ(Stub("worker", "g/0")->KvGet(&context, get, &got).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  grpc::ClientContext own;
  own.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  ASSERT_TRUE(Stub("worker-h", "h/0")->KvGet(&own, get, &got).ok());
  ASSERT_EQ(got.values_size(), 1);
  EXPECT_EQ(got.values(0), "h/0");
}

}  // namespace
}  // namespace furnace::controller
