#include "transport/credentials.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <sys/stat.h>

#include <ctime>
#include <filesystem>
#include <fstream>

#include "transport/dev_certs.h"
#include "transport/pem_check.h"
#include "transport/token_file.h"

namespace furnace::transport {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

class DevCertsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("furnace_transport_test_" + std::to_string(getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    DevCertsOptions options;
    options.dir = dir_.string();
    options.hosts = {"ctl.example", "10.1.2.3"};
    auto files = WriteDevCerts(options);
    ASSERT_TRUE(files.ok()) << files.status();
    files_ = *files;
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string F(const std::string& name) const { return (dir_ / name).string(); }

  fs::path dir_;
  std::vector<std::string> files_;
};

X509* ReadCert(const std::string& path) {
  FILE* f = std::fopen(path.c_str(), "r");
  X509* cert = f ? PEM_read_X509(f, nullptr, nullptr, nullptr) : nullptr;
  if (f) std::fclose(f);
  return cert;
}

// The worker agent says its certificate's dates at start, and warns when the controller will
// refuse it (expired, not yet valid) or soon will.
TEST_F(DevCertsTest, ACertificatesDatesAreReadAndJudged) {
  auto pem = ReadFileForFlag(F("worker.pem"), "--tls-cert");
  ASSERT_TRUE(pem.ok()) << pem.status();
  auto dates = ReadCertificateDates(*pem, "--tls-cert");
  ASSERT_TRUE(dates.ok()) << dates.status();
  const int64_t now = static_cast<int64_t>(std::time(nullptr));
  EXPECT_LE(dates->not_before, now);
  EXPECT_GT(dates->not_after, now + 300 * 86400);  // one year
  EXPECT_THAT(DescribeCertificateDates(*dates),
              ::testing::MatchesRegex("valid from 20[0-9-]+ [0-9:]+ UTC until "
                                      "20[0-9-]+ [0-9:]+ UTC"));
  EXPECT_EQ(CertificateDateProblem(*dates, now, "--tls-cert w.pem"), std::nullopt);
  const auto problem = [&](int64_t at) {
    return CertificateDateProblem(*dates, at, "--tls-cert w.pem").value_or("");
  };
  EXPECT_THAT(problem(dates->not_after + 3 * 86400),
              HasSubstr("--tls-cert w.pem: the certificate expired 3 days ago (valid from"));
  EXPECT_THAT(problem(dates->not_before - 60), HasSubstr("the certificate is not valid yet"));
  EXPECT_THAT(problem(dates->not_after - 2 * 86400),
              HasSubstr("the certificate expires in 2 days"));
  EXPECT_FALSE(ReadCertificateDates("not a pem", "--tls-cert x").ok());
}

TEST_F(DevCertsTest, WritesKeysAndTokensPrivateAndCertificatesTheCaSigned) {
  EXPECT_EQ(files_.size(), 12u);
  for (const char* name : {"ca.key", "controller.key", "worker.key", "cli.key", "tokens",
                           "admin.token", "read.token", "join.token"}) {
    struct stat st {};
    ASSERT_EQ(stat(F(name).c_str(), &st), 0) << name;
    EXPECT_EQ(st.st_mode & 0777, 0600u) << name;
  }
  X509* ca = ReadCert(F("ca.pem"));
  X509* controller = ReadCert(F("controller.pem"));
  X509* worker = ReadCert(F("worker.pem"));
  ASSERT_TRUE(ca && controller && worker);
  EVP_PKEY* ca_key = X509_get0_pubkey(ca);
  EXPECT_EQ(X509_verify(controller, ca_key), 1);
  EXPECT_EQ(X509_verify(worker, ca_key), 1);
  for (const char* host : {"localhost", "ctl.example"}) {
    EXPECT_EQ(X509_check_host(controller, host, 0, 0, nullptr), 1) << host;
  }
  for (const char* ip : {"127.0.0.1", "10.1.2.3"}) {
    EXPECT_EQ(X509_check_ip_asc(controller, ip, 0), 1) << ip;
  }
  EXPECT_NE(X509_check_host(worker, "localhost", 0, 0, nullptr), 1);
  X509_free(ca);
  X509_free(controller);
  X509_free(worker);

  auto tokens = ReadTokenFile(F("tokens"), "--token-file");
  ASSERT_TRUE(tokens.ok()) << tokens.status();
  ASSERT_EQ(tokens->size(), 2u);
  EXPECT_EQ((*tokens)[0].role, Role::kAdmin);
  EXPECT_EQ(*ReadClientToken(F("admin.token"), "--token-file"), (*tokens)[0].token);
  EXPECT_EQ(*ReadClientToken(F("read.token"), "--token-file"), (*tokens)[1].token);
}

TEST_F(DevCertsTest, RefusesToOverwriteWithoutForce) {
  const std::string before = *ReadClientToken(F("join.token"), "f");
  DevCertsOptions again;
  again.dir = dir_.string();
  auto refused = WriteDevCerts(again);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused.status().message(), HasSubstr("--force"));
  EXPECT_EQ(*ReadClientToken(F("join.token"), "f"), before);
  again.force = true;
  ASSERT_TRUE(WriteDevCerts(again).ok());
  EXPECT_NE(*ReadClientToken(F("join.token"), "f"), before);
}

TEST_F(DevCertsTest, RefusesABadHost) {
  DevCertsOptions bad;
  bad.dir = (dir_ / "other").string();
  bad.hosts = {"bad host!"};
  auto refused = WriteDevCerts(bad);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.status().message(), HasSubstr("--host `bad host!`"));
}

// --worker-host: a host's own worker certificate, named furnace-worker:<host>, the CA's, 0600 key.
TEST_F(DevCertsTest, AWorkerHostGetsACertificateNamingIt) {
  DevCertsOptions options;
  options.dir = (dir_ / "hosts").string();
  options.worker_hosts = {"node7", "rack-2.node_3"};
  auto files = WriteDevCerts(options);
  ASSERT_TRUE(files.ok()) << files.status();
  EXPECT_EQ(files->size(), 16u);
  X509* ca = ReadCert((dir_ / "hosts" / "ca.pem").string());
  X509* node = ReadCert((dir_ / "hosts" / "worker-node7.pem").string());
  ASSERT_TRUE(ca && node);
  EXPECT_EQ(X509_verify(node, X509_get0_pubkey(ca)), 1);
  char name[256] = {};
  X509_NAME_get_text_by_NID(X509_get_subject_name(node), NID_commonName, name, sizeof name);
  EXPECT_STREQ(name, "furnace-worker:node7");
  X509_free(ca);
  X509_free(node);
  struct stat st {};
  ASSERT_EQ(stat((dir_ / "hosts" / "worker-rack-2.node_3.key").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);

  options.dir = (dir_ / "bad").string();
  options.worker_hosts = {"node7/0"};  // a worker id, not a host
  auto refused = WriteDevCerts(options);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.status().message(), HasSubstr("--worker-host `node7/0`: not a host name"));

  // The longest host fits the 64-character common name; one more is refused by name (OpenSSL
  // would refuse the common name, and a certificate without one may act as every worker).
  const std::string longest(kMaxWorkerHostLength, 'h');
  options.dir = (dir_ / "long").string();
  options.worker_hosts = {longest};
  ASSERT_TRUE(WriteDevCerts(options).ok());
  X509* at_limit = ReadCert((dir_ / "long" / ("worker-" + longest + ".pem")).string());
  ASSERT_TRUE(at_limit);
  X509_NAME_get_text_by_NID(X509_get_subject_name(at_limit), NID_commonName, name, sizeof name);
  EXPECT_EQ(std::string(name), "furnace-worker:" + longest);
  X509_free(at_limit);
  options.dir = (dir_ / "too-long").string();
  options.worker_hosts = {longest + "h"};
  auto too_long = WriteDevCerts(options);
  EXPECT_EQ(too_long.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(too_long.status().message(), HasSubstr("at most 49"));
}

// A directory everyone may write (or another user's) is refused: the CA or the tokens written
// there could be replaced after.
TEST_F(DevCertsTest, RefusesADirectoryEveryoneMayWrite) {
  const fs::path open_dir = dir_ / "open";
  fs::create_directories(open_dir);
  fs::permissions(open_dir, fs::perms::all);
  DevCertsOptions options;
  options.dir = open_dir.string();
  auto refused = WriteDevCerts(options);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused.status().message(), HasSubstr("with mode 777: another user could replace"));
  EXPECT_FALSE(fs::exists(open_dir / "ca.key"));
  fs::permissions(open_dir, fs::perms::others_write, fs::perm_options::remove);
  EXPECT_TRUE(WriteDevCerts(options).ok());
  // Written through temporary files: none is left.
  for (const auto& entry : fs::directory_iterator(open_dir)) {
    EXPECT_EQ(entry.path().filename().string().find(".tmp"), std::string::npos) << entry.path();
  }
}

TEST_F(DevCertsTest, ServerCredentialsNeedAllThreeFilesThatMatch) {
  EXPECT_TRUE(MakeServerCredentials({F("ca.pem"), F("controller.pem"), F("controller.key")}).ok());
  auto partial = MakeServerCredentials({"", F("controller.pem"), F("controller.key")});
  EXPECT_THAT(partial.status().message(), HasSubstr("--tls-ca"));
  auto no_key = MakeServerCredentials({F("ca.pem"), F("controller.pem"), ""});
  EXPECT_THAT(no_key.status().message(), HasSubstr("--tls-cert, --tls-key and --tls-ca"));
  auto mismatch = MakeServerCredentials({F("ca.pem"), F("controller.pem"), F("worker.key")});
  EXPECT_THAT(mismatch.status().message(), HasSubstr("--tls-key is not the private key"));
  auto not_pem = MakeServerCredentials({F("tokens"), F("controller.pem"), F("controller.key")});
  EXPECT_THAT(not_pem.status().message(), HasSubstr("--tls-ca"));
  EXPECT_THAT(not_pem.status().message(), HasSubstr("not a PEM certificate"));
  auto missing = MakeServerCredentials({F("ca.pem"), F("nope.pem"), F("controller.key")});
  EXPECT_THAT(missing.status().message(), HasSubstr("--tls-cert"));
  EXPECT_THAT(missing.status().message(), HasSubstr("cannot read"));
}

TEST_F(DevCertsTest, ChannelCredentialsSendATokenOnlyOverTls) {
  ClientSecurity plain;
  EXPECT_TRUE(MakeChannelCredentials(plain).ok());
  plain.token = "0123456789abcdef";
  auto refused = MakeChannelCredentials(plain);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.status().message(), HasSubstr("--tls-ca"));

  ClientSecurity tls;
  tls.tls.ca = F("ca.pem");
  tls.token = "0123456789abcdef";
  EXPECT_TRUE(MakeChannelCredentials(tls).ok());
  tls.tls.cert = F("cli.pem");
  EXPECT_THAT(MakeChannelCredentials(tls).status().message(), HasSubstr("go together"));
  tls.tls.key = F("cli.key");
  EXPECT_TRUE(MakeChannelCredentials(tls).ok());
}

}  // namespace
}  // namespace furnace::transport
