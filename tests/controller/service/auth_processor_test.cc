// The controller's transport security end to end on loopback: the server credentials and auth
// processor that furnace-controller builds from its flags (server_security.h), against clients
// with and without certificates and tokens; and Authorize's decisions alone.
#include "controller/service/auth_processor.h"

#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "controller/service/caller_identity.h"
#include "controller/service/server_security.h"
#include "furnace/v1/agent.grpc.pb.h"
#include "furnace/v1/controller.grpc.pb.h"
#include "transport/credentials.h"
#include "transport/dev_certs.h"
#include "transport/token_file.h"

namespace furnace::controller {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

const transport::TokenEntry kAdmin{"admin-token-0123456789", transport::Role::kAdmin, "alice"};
const transport::TokenEntry kReader{"read-token-0123456789", transport::Role::kRead, "grafana"};
constexpr char kJoin[] = "join-token-0123456789";

AuthPolicy Policy() { return {{kAdmin, kReader}, kJoin}; }

AuthRequest Call(const std::string& method, const std::string& token = "",
                 bool certificate = false) {
  AuthRequest r;
  r.method = method;
  if (!token.empty()) r.authorization = "Bearer " + token;
  r.peer_certificate_verified = certificate;
  return r;
}

TEST(Authorize, ReadTokensReadAdminTokensDoEverything) {
  const AuthPolicy p = Policy();
  auto list = Authorize(p, Call("/furnace.v1.JobService/ListJobs", kReader.token));
  EXPECT_TRUE(list.status.ok());
  EXPECT_EQ(list.identity, "grafana");
  EXPECT_EQ(list.role, "read");

  auto cancel = Authorize(p, Call("/furnace.v1.JobService/CancelJob", kReader.token));
  EXPECT_EQ(cancel.status.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(cancel.status.error_message(), HasSubstr("JobService/CancelJob needs role admin"));
  EXPECT_THAT(cancel.status.error_message(), HasSubstr("`grafana` has role read"));

  auto submit = Authorize(p, Call("/furnace.v1.JobService/SubmitJob", kAdmin.token));
  EXPECT_TRUE(submit.status.ok());
  EXPECT_EQ(submit.identity, "alice");
  // A submission's dry run needs what the submission needs, so it answers what that would.
  EXPECT_TRUE(Authorize(p, Call("/furnace.v1.JobService/CheckJob", kAdmin.token)).status.ok());
  EXPECT_EQ(
      Authorize(p, Call("/furnace.v1.JobService/CheckJob", kReader.token)).status.error_code(),
      grpc::StatusCode::PERMISSION_DENIED);
  // A method nobody has classified needs admin.
  EXPECT_EQ(
      Authorize(p, Call("/furnace.v1.JobService/SomethingNew", kReader.token)).status.error_code(),
      grpc::StatusCode::PERMISSION_DENIED);
}

TEST(Authorize, MissingOrUnknownTokensAreUnauthenticated) {
  const AuthPolicy p = Policy();
  auto none = Authorize(p, Call("/furnace.v1.JobService/SubmitJob"));
  EXPECT_EQ(none.status.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_THAT(none.status.error_message(),
              HasSubstr("JobService/SubmitJob needs a token with role admin"));
  EXPECT_THAT(none.status.error_message(), HasSubstr("FURNACE_TOKEN"));
  auto unknown = Authorize(p, Call("/furnace.v1.JobService/ListJobs", "not-a-token-we-know"));
  EXPECT_EQ(unknown.status.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  // The join token is not a user token.
  EXPECT_EQ(Authorize(p, Call("/furnace.v1.JobService/ListJobs", kJoin)).status.error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  // Without a token file JobService is open.
  auto open = Authorize(AuthPolicy{}, Call("/furnace.v1.JobService/SubmitJob"));
  EXPECT_TRUE(open.status.ok());
  EXPECT_EQ(open.identity, "anonymous");
}

TEST(Authorize, AgentsNeedAVerifiedCertificateAndTheJoinToken) {
  const AuthPolicy p = Policy();
  auto no_cert = Authorize(p, Call("/furnace.v1.AgentService/Register", kJoin, false));
  EXPECT_EQ(no_cert.status.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_THAT(no_cert.status.error_message(), HasSubstr("AgentService/Register needs a client"));
  auto no_token = Authorize(p, Call("/furnace.v1.AgentService/Register", "", true));
  EXPECT_THAT(no_token.status.error_message(), HasSubstr("join token"));
  auto admin = Authorize(p, Call("/furnace.v1.AgentService/Register", kAdmin.token, true));
  EXPECT_EQ(admin.status.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  AuthRequest agent = Call("/furnace.v1.AgentService/KvGet", kJoin, true);
  agent.worker_id = "host-a/3";
  auto ok = Authorize(p, agent);
  EXPECT_TRUE(ok.status.ok());
  EXPECT_EQ(ok.identity, "agent:host-a/3");
  // Without a join token file the certificate is enough.
  EXPECT_TRUE(
      Authorize(AuthPolicy{}, Call("/furnace.v1.AgentService/KvGet", "", true)).status.ok());
}

// A certificate named furnace-worker:<host> may act only as that host's workers; any other (the
// fleet's shared worker.pem, the controller's own that --local-workers use) as any worker.
TEST(Authorize, AHostsOwnCertificateActsOnlyAsItsWorkers) {
  const AuthPolicy p = Policy();
  auto as = [&](const std::string& common_name, const std::string& worker_id) {
    AuthRequest r = Call("/furnace.v1.AgentService/ReportRank", kJoin, true);
    r.peer_common_name = common_name;
    r.worker_id = worker_id;
    return Authorize(p, r);
  };
  EXPECT_TRUE(as("furnace-worker:node7", "node7/0").status.ok());
  EXPECT_EQ(as("furnace-worker:node7", "node7/0").identity, "agent:node7/0");
  EXPECT_TRUE(as("furnace-worker:node7", "node7").status.ok());
  for (const char* other : {"node8/0", "node70/0", "node7x", "", "/node7/0"}) {
    const AuthDecision d = as("furnace-worker:node7", other);
    EXPECT_EQ(d.status.error_code(), grpc::StatusCode::PERMISSION_DENIED) << other;
    EXPECT_THAT(d.status.error_message(),
                HasSubstr("ReportRank: the certificate of furnace-worker:node7 may act only as "
                          "worker node7 or node7/<slot>"));
  }
  EXPECT_EQ(as("furnace-worker:", "node7/0").status.error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_TRUE(as("furnace-worker", "node8/0").status.ok());
  EXPECT_TRUE(as("furnace-controller", "node8/0").status.ok());
}

// A JobService whose ListJobs records who called; every other method is gRPC's UNIMPLEMENTED,
// which a call only reaches once the processor let it through.
class RecordingJobService : public v1::JobService::Service {
 public:
  grpc::Status ListJobs(grpc::ServerContext* context, const v1::ListJobsRequest*,
                        v1::ListJobsResponse*) override {
    std::lock_guard<std::mutex> lock(mu_);
    last_identity_ = CallerIdentity(*context);
    identity_values_ = context->auth_context()->FindPropertyValues(kIdentityProperty).size();
    return grpc::Status::OK;
  }
  std::string last_identity() {
    std::lock_guard<std::mutex> lock(mu_);
    return last_identity_;
  }
  // How many identity properties the call's AuthContext (its connection's) held.
  size_t identity_values() {
    std::lock_guard<std::mutex> lock(mu_);
    return identity_values_;
  }

 private:
  std::mutex mu_;
  std::string last_identity_;
  size_t identity_values_ = 0;
};

class SecureServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("furnace_auth_test_" + std::to_string(getpid()));
    fs::remove_all(dir_);
    transport::DevCertsOptions certs;
    certs.dir = dir_.string();
    ASSERT_TRUE(transport::WriteDevCerts(certs).ok());
    certs.dir = (dir_ / "other").string();  // a second CA, which the controller does not trust
    ASSERT_TRUE(transport::WriteDevCerts(certs).ok());
  }
  void TearDown() override {
    if (server_) server_->Shutdown(std::chrono::system_clock::now());
    fs::remove_all(dir_);
  }
  std::string F(const std::string& name) const { return (dir_ / name).string(); }

  ControllerFlags SecureFlags() const {
    ControllerFlags f;
    f.listen = "127.0.0.1:0";
    f.tls_ca = F("ca.pem");
    f.tls_cert = F("controller.pem");
    f.tls_key = F("controller.key");
    f.token_file = F("tokens");
    f.join_token_file = F("join.token");
    return f;
  }

  void Start(const ControllerFlags& flags) {
    auto security = MakeServerSecurity(flags);
    ASSERT_TRUE(security.ok()) << security.status();
    refusals_ = security->refusals;
    grpc::ServerBuilder builder;
    builder.AddListeningPort(flags.listen, security->credentials, &port_);
    builder.RegisterService(&jobs_);
    builder.RegisterService(&agents_);
    server_ = builder.BuildAndStart();
    ASSERT_TRUE(server_ != nullptr && port_ > 0);
  }

  std::shared_ptr<grpc::Channel> Channel(const transport::ClientSecurity& security) {
    auto credentials = transport::MakeChannelCredentials(security);
    EXPECT_TRUE(credentials.ok()) << credentials.status();
    return grpc::CreateChannel("127.0.0.1:" + std::to_string(port_), *credentials);
  }

  static std::unique_ptr<grpc::ClientContext> Context() {
    auto context = std::make_unique<grpc::ClientContext>();
    context->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    return context;
  }

  grpc::Status ListJobs(const transport::ClientSecurity& security) {
    v1::ListJobsResponse response;
    return v1::JobService::NewStub(Channel(security))
        ->ListJobs(Context().get(), v1::ListJobsRequest(), &response);
  }
  grpc::Status CancelJob(const transport::ClientSecurity& security) {
    v1::CancelJobResponse response;
    return v1::JobService::NewStub(Channel(security))
        ->CancelJob(Context().get(), v1::CancelJobRequest(), &response);
  }
  grpc::Status KvGet(const transport::ClientSecurity& security) {
    v1::KvGetResponse response;
    return v1::AgentService::NewStub(Channel(security))
        ->KvGet(Context().get(), v1::KvGetRequest(), &response);
  }

  transport::ClientSecurity Cli(const std::string& token_file) const {
    transport::ClientSecurity s;
    s.tls.ca = F("ca.pem");
    if (!token_file.empty()) s.token = *transport::ReadClientToken(F(token_file), "t");
    return s;
  }
  transport::ClientSecurity Agent(const std::string& cert_dir) const {
    transport::ClientSecurity s;
    s.tls = {F("ca.pem"), (dir_ / cert_dir / "worker.pem").string(),
             (dir_ / cert_dir / "worker.key").string()};
    s.token = *transport::ReadClientToken(F("join.token"), "t");
    s.worker_id = "host-a/0";
    return s;
  }

  fs::path dir_;
  std::shared_ptr<AuthRefusals> refusals_;
  RecordingJobService jobs_;
  v1::AgentService::Service agents_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
};

TEST_F(SecureServerTest, TokensAndRolesOverTls) {
  Start(SecureFlags());
  const grpc::Status anonymous = ListJobs(Cli(""));
  EXPECT_EQ(anonymous.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_THAT(anonymous.error_message(), HasSubstr("ListJobs needs a token"));

  EXPECT_TRUE(ListJobs(Cli("read.token")).ok());
  EXPECT_EQ(jobs_.last_identity(), "reader");
  const grpc::Status read_cancel = CancelJob(Cli("read.token"));
  EXPECT_EQ(read_cancel.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(read_cancel.error_message(), HasSubstr("CancelJob needs role admin"));

  EXPECT_TRUE(ListJobs(Cli("admin.token")).ok());
  EXPECT_EQ(jobs_.last_identity(), "admin");
  // Let through: the fake's CancelJob is unimplemented.
  EXPECT_EQ(CancelJob(Cli("admin.token")).error_code(), grpc::StatusCode::UNIMPLEMENTED);

  // The refused cancel is kept for the audit log (the refused ListJobs, read-only, is not).
  ASSERT_NE(refusals_, nullptr);
  const std::vector<AuthRefusals::Entry> refused = refusals_->Take();
  ASSERT_EQ(refused.size(), 1u);
  EXPECT_EQ(refused[0].action, "cancel");
  EXPECT_EQ(refused[0].identity, "reader");
  EXPECT_EQ(refused[0].outcome.code(), absl::StatusCode::kPermissionDenied);
}

// Refused calls that would change state are kept for the audit log, saying who (the token's name,
// never a secret), what and why; read-only calls are not; a flood is recorded at most kBurst at
// once, then one per kIntervalS, the next recorded one counting those left out.
TEST(AuthRefusalsTest, RecordsRefusedStateChangesRateLimited) {
  const AuthPolicy p = Policy();
  FakeClock clock;
  AuthRefusals refusals(clock);
  const auto refuse = [&](const AuthRequest& r) {
    const AuthDecision d = Authorize(p, r);
    ASSERT_FALSE(d.status.ok());
    refusals.Record(r, d);
  };
  refuse(Call("/furnace.v1.JobService/SubmitJob"));
  refuse(Call("/furnace.v1.JobService/CancelJob", "not-a-token-we-know"));
  refuse(Call("/furnace.v1.JobService/CancelJob", kReader.token));
  refuse(Call("/furnace.v1.JobService/ListJobs"));  // read-only: not an audited action
  refuse(Call("/furnace.v1.JobService/CheckJob"));  // changes nothing: not an audited action
  std::vector<AuthRefusals::Entry> got = refusals.Take();
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(got[0].action, "submit");
  EXPECT_EQ(got[0].identity, "(no token)");
  EXPECT_EQ(got[0].outcome.code(), absl::StatusCode::kUnauthenticated);
  EXPECT_THAT(got[0].outcome.message(), HasSubstr("SubmitJob needs a token with role admin"));
  EXPECT_EQ(got[0].unix_time, clock.UnixSeconds());
  EXPECT_EQ(got[1].action, "cancel");
  EXPECT_EQ(got[1].identity, "(a token not in --token-file)");
  EXPECT_EQ(got[2].identity, "grafana");
  EXPECT_EQ(got[2].outcome.code(), absl::StatusCode::kPermissionDenied);
  for (const auto& e : got) {
    EXPECT_EQ(e.identity.find("token-0123456789"), std::string::npos) << e.identity;
    EXPECT_EQ(std::string(e.outcome.message()).find("not-a-token-we-know"), std::string::npos);
  }
  EXPECT_TRUE(refusals.Take().empty());

  // A flood: the bucket's remaining 97, then nothing until it refills.
  for (int i = 0; i < 500; ++i) refuse(Call("/furnace.v1.JobService/SubmitJob"));
  EXPECT_EQ(refusals.Take().size(), static_cast<size_t>(AuthRefusals::kBurst) - 3);
  clock.Advance(AuthRefusals::kIntervalS);
  refuse(Call("/furnace.v1.JobService/SubmitJob"));
  refuse(Call("/furnace.v1.JobService/SubmitJob"));
  got = refusals.Take();
  ASSERT_EQ(got.size(), 1u);
  EXPECT_THAT(got[0].outcome.message(),
              HasSubstr("(403 earlier refused call(s) not recorded: at most 100, then one per "
                        "10 s)"));
}

// gRPC's AuthContext is the connection's (grpc/grpc#28809): the caller is recorded once, however
// many calls the connection carries, and a call with other credentials on it is refused.
TEST_F(SecureServerTest, AConnectionCarriesOneCaller) {
  Start(SecureFlags());
  auto stub = v1::JobService::NewStub(Channel(Cli("")));  // TLS; tokens added per call below
  auto list = [&](const std::string& token_file) {
    auto context = Context();
    context->AddMetadata("authorization",
                         "Bearer " + *transport::ReadClientToken(F(token_file), "t"));
    v1::ListJobsResponse response;
    return stub->ListJobs(context.get(), v1::ListJobsRequest(), &response);
  };
  for (int i = 0; i < 20; ++i) ASSERT_TRUE(list("read.token").ok()) << i;
  EXPECT_EQ(jobs_.last_identity(), "reader");
  EXPECT_EQ(jobs_.identity_values(), 1u);  // not one per call
  const grpc::Status other = list("admin.token");
  EXPECT_EQ(other.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(other.error_message(),
              HasSubstr("ListJobs: this connection carries the credentials of reader, not of "
                        "admin (one caller per connection"));
  // Another connection is another caller.
  EXPECT_TRUE(ListJobs(Cli("admin.token")).ok());
  EXPECT_EQ(jobs_.last_identity(), "admin");
}

TEST_F(SecureServerTest, AgentsNeedACertificateTheCaSignedAndTheJoinToken) {
  Start(SecureFlags());
  EXPECT_EQ(KvGet(Agent("")).error_code(), grpc::StatusCode::UNIMPLEMENTED);  // let through

  transport::ClientSecurity no_cert = Agent("");
  no_cert.tls.cert.clear();
  no_cert.tls.key.clear();
  const grpc::Status refused = KvGet(no_cert);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_THAT(refused.error_message(), HasSubstr("client certificate"));

  // A certificate of another CA fails the handshake: the call never reaches the service.
  EXPECT_EQ(KvGet(Agent("other")).error_code(), grpc::StatusCode::UNAVAILABLE);

  transport::ClientSecurity wrong_token = Agent("");
  wrong_token.token = *transport::ReadClientToken((dir_ / "other" / "join.token").string(), "t");
  EXPECT_THAT(KvGet(wrong_token).error_message(), HasSubstr("join token"));
  // A user token is not a join token, and the agent's join token is not a user token.
  transport::ClientSecurity admin_as_agent = Agent("");
  admin_as_agent.token = *transport::ReadClientToken(F("admin.token"), "t");
  EXPECT_EQ(KvGet(admin_as_agent).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(ListJobs(Agent("")).error_code(), grpc::StatusCode::UNAUTHENTICATED);
}

TEST_F(SecureServerTest, PlaintextOnLoopbackNamesTheCallerLocal) {
  ControllerFlags f;
  f.listen = "127.0.0.1:0";
  Start(f);
  EXPECT_TRUE(ListJobs({}).ok());
  EXPECT_EQ(jobs_.last_identity(), "local");
}

TEST_F(SecureServerTest, TheListenRule) {
  ControllerFlags open;
  open.listen = "0.0.0.0:0";
  auto refused = MakeServerSecurity(open);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  for (const char* flag : {"--listen 0.0.0.0:0", "--tls-cert, --tls-key, --tls-ca", "--token-file",
                           "--join-token-file", "--insecure"}) {
    EXPECT_THAT(refused.status().message(), HasSubstr(flag));
  }
  open.insecure = true;
  auto allowed = MakeServerSecurity(open);
  ASSERT_TRUE(allowed.ok()) << allowed.status();
  EXPECT_TRUE(allowed->insecure);
  EXPECT_EQ(allowed->warnings.size(), 1u);
  EXPECT_THAT(InsecureGaugeText(true), HasSubstr("furnace_controller_insecure 1\n"));
  EXPECT_THAT(InsecureGaugeText(false), HasSubstr("furnace_controller_insecure 0\n"));

  ControllerFlags secure = SecureFlags();
  secure.listen = "0.0.0.0:0";
  EXPECT_TRUE(MakeServerSecurity(secure).ok());
  secure.metrics_listen = "0.0.0.0:0";  // the HTTP listener has no TLS: loopback or --insecure
  EXPECT_THAT(MakeServerSecurity(secure).status().message(),
              HasSubstr("--metrics-listen 0.0.0.0:0"));
  secure.insecure = true;
  EXPECT_TRUE(MakeServerSecurity(secure).ok());

  ControllerFlags plain_metrics;
  plain_metrics.metrics_listen = "0.0.0.0:9464";
  EXPECT_THAT(MakeServerSecurity(plain_metrics).status().message(),
              HasSubstr("--metrics-listen 0.0.0.0:9464"));

  ControllerFlags tokens_in_clear;
  tokens_in_clear.token_file = F("tokens");
  EXPECT_THAT(MakeServerSecurity(tokens_in_clear).status().message(),
              HasSubstr("--token-file needs TLS"));
}

// Ranks dial the advertised address for rendezvous, and TLS checks it against the controller's
// certificate: a wildcard listen (every interface) or port 0 is no such address.
TEST(AdvertiseAddressTest, AWildcardOrPortZeroListenNeedsAnAdvertisedAddress) {
  ControllerFlags f;
  EXPECT_EQ(*AdvertiseAddress(f), "127.0.0.1:7070");
  for (const char* wildcard : {"0.0.0.0:7070", "[::]:7070", ":7070", "0.0.0.0:0"}) {
    f.listen = wildcard;
    absl::StatusOr<std::string> refused = AdvertiseAddress(f);
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << wildcard;
    EXPECT_THAT(refused.status().message(), HasSubstr(absl::StrCat("--listen ", wildcard)));
    EXPECT_THAT(refused.status().message(), HasSubstr("--advertise HOST:PORT"));
    f.advertise = "ctl.example:7070";
    EXPECT_EQ(*AdvertiseAddress(f), "ctl.example:7070") << wildcard;
    f.advertise.clear();
  }
  f.listen = "127.0.0.1:0";
  EXPECT_THAT(AdvertiseAddress(f).status().message(), HasSubstr("port 0 needs --advertise"));
  f.listen = "10.0.0.5:7070";
  EXPECT_EQ(*AdvertiseAddress(f), "10.0.0.5:7070");
  for (const char* undialable : {"0.0.0.0:7070", "ctl.example:0"}) {
    f.advertise = undialable;
    EXPECT_THAT(AdvertiseAddress(f).status().message(),
                HasSubstr(absl::StrCat("--advertise ", undialable, " is no address")));
  }
}

}  // namespace
}  // namespace furnace::controller
