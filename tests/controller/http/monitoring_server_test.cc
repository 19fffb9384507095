// MonitoringServer over real HTTP on 127.0.0.1:<free port>, with fake handlers. One server for the
// whole binary (civetweb's shutdown takes 2 s), so ctest runs this binary as a single test.
#include "controller/http/monitoring_server.h"

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <string>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/controller/http/http_client.h"

namespace furnace::controller::http {
namespace {

namespace fs = std::filesystem;
using testing::Get;
using testing::RawResponse;
using testing::SendRaw;

constexpr char kSecret[] = "secret-outside-web-root";

struct SeriesCall {
  std::string job_id;
  SeriesQuery query;
};

class MonitoringServerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ =
        new fs::path(fs::temp_directory_path() / ("furnace-http-test-" + std::to_string(getpid())));
    fs::create_directories(*dir_ / "web");
    Write(*dir_ / "secret.txt", kSecret);
    Write(*dir_ / "web" / "index.html", "<!doctype html><title>furnace</title>");
    Write(*dir_ / "web" / "app.js", "console.log('app');");
    Write(*dir_ / "web" / "style.css", "body{}");
    Write(*dir_ / "web" / ".hidden.js", kSecret);

    MonitoringHandlers h;
    h.metrics_text = [] { return std::string("# TYPE furnace_up gauge\nfurnace_up 1\n"); };
    h.jobs_json = []() -> absl::StatusOr<std::string> { return std::string(R"({"jobs":[]})"); };
    h.series_json = [](const std::string& id,
                       const SeriesQuery& query) -> absl::StatusOr<std::string> {
      if (id == "missing") return absl::NotFoundError("no job 'missing'");
      if (id == "boom") return absl::InternalError("the job store is unreadable");
      std::lock_guard<std::mutex> lock(mu_);
      last_ = SeriesCall{id, query};
      return std::string(R"({"job_id":")") + id + R"(","steps":[]})";
    };
    MonitoringOptions o;
    o.listen = "127.0.0.1:0";
    o.web_root = (*dir_ / "web").string();
    auto server = MonitoringServer::Start(o, std::move(h));
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = server->release();
  }

  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
    fs::remove_all(*dir_);
    delete dir_;
  }

  static void Write(const fs::path& p, const std::string& text) { std::ofstream(p) << text; }
  static int port() { return server_->port(); }
  static SeriesCall last_series() {
    std::lock_guard<std::mutex> lock(mu_);
    return last_;
  }

  static inline MonitoringServer* server_ = nullptr;
  static inline fs::path* dir_ = nullptr;
  static inline std::mutex mu_;
  static inline SeriesCall last_;
};

TEST_F(MonitoringServerTest, ReportsTheRealPortWhenAskedForZero) {
  EXPECT_GT(port(), 0);
  EXPECT_EQ(server_->address(), "127.0.0.1:" + std::to_string(port()));
}

TEST_F(MonitoringServerTest, MetricsIsPrometheusText) {
  RawResponse r = Get(port(), "/metrics");
  EXPECT_EQ(r.status, 200) << r.raw;
  EXPECT_EQ(r.headers["content-type"], "text/plain; version=0.0.4; charset=utf-8");
  EXPECT_EQ(r.body, "# TYPE furnace_up gauge\nfurnace_up 1\n");
  EXPECT_EQ(r.headers["content-length"], std::to_string(r.body.size()));
}

TEST_F(MonitoringServerTest, JobsIsJson) {
  RawResponse r = Get(port(), "/api/jobs");
  EXPECT_EQ(r.status, 200) << r.raw;
  EXPECT_EQ(r.headers["content-type"], "application/json; charset=utf-8");
  EXPECT_EQ(r.headers["cache-control"], "no-store");
  EXPECT_EQ(r.body, R"({"jobs":[]})");
}

TEST_F(MonitoringServerTest, SeriesPassesIdAndQueryParameters) {
  RawResponse r = Get(port(), "/api/jobs/j-0007/series?since=12&max=300");
  EXPECT_EQ(r.status, 200) << r.raw;
  EXPECT_EQ(r.body, R"({"job_id":"j-0007","steps":[]})");
  SeriesCall c = last_series();
  EXPECT_EQ(c.job_id, "j-0007");
  EXPECT_EQ(c.query.since_step, 12u);
  EXPECT_FALSE(c.query.cursor);
  EXPECT_EQ(c.query.max_points, 300u);

  r = Get(port(), "/api/jobs/j-0007/series?after_attempt=2&after_step=40&max=30");
  EXPECT_EQ(r.status, 200) << r.raw;
  c = last_series();
  EXPECT_TRUE(c.query.cursor);
  EXPECT_EQ(c.query.after_attempt, 2u);
  EXPECT_EQ(c.query.after_step, 40u);
  EXPECT_EQ(c.query.max_points, 30u);

  r = Get(port(), "/api/jobs/j-0008/series");
  EXPECT_EQ(r.status, 200) << r.raw;
  c = last_series();
  EXPECT_EQ(c.job_id, "j-0008");
  EXPECT_EQ(c.query.since_step, 0u);
  EXPECT_EQ(c.query.max_points, kDefaultSeriesPoints);  // a reply is bounded even when nobody asked
}

TEST_F(MonitoringServerTest, SeriesRefusesBadNumbers) {
  EXPECT_EQ(Get(port(), "/api/jobs/j-1/series?since=abc").status, 400);
  EXPECT_EQ(Get(port(), "/api/jobs/j-1/series?max=-1").status, 400);
  EXPECT_EQ(Get(port(), "/api/jobs/j-1/series?max=99999999999").status, 400);
}

TEST_F(MonitoringServerTest, HandlerNotFoundIs404AndOtherErrorsAre500WithTheMessage) {
  RawResponse r = Get(port(), "/api/jobs/missing/series");
  EXPECT_EQ(r.status, 404) << r.raw;
  EXPECT_EQ(r.body, "no job 'missing'\n");
  r = Get(port(), "/api/jobs/boom/series");
  EXPECT_EQ(r.status, 500) << r.raw;
  EXPECT_EQ(r.body, "the job store is unreadable\n");
}

TEST_F(MonitoringServerTest, ServesTheDashboardWithContentTypes) {
  RawResponse r = Get(port(), "/");
  EXPECT_EQ(r.status, 200) << r.raw;
  EXPECT_EQ(r.headers["content-type"], "text/html; charset=utf-8");
  EXPECT_EQ(r.body, "<!doctype html><title>furnace</title>");
  r = Get(port(), "/index.html?job=j-1");
  EXPECT_EQ(r.status, 200) << r.raw;
  r = Get(port(), "/app.js");
  EXPECT_EQ(r.status, 200) << r.raw;
  EXPECT_EQ(r.headers["content-type"], "text/javascript; charset=utf-8");
  r = Get(port(), "/style.css");
  EXPECT_EQ(r.status, 200) << r.raw;
  EXPECT_EQ(r.headers["content-type"], "text/css; charset=utf-8");
}

TEST_F(MonitoringServerTest, RefusesPathTraversal) {
  for (const char* target :
       {"/../secret.txt", "/%2e%2e/secret.txt", "/..%2fsecret.txt", "/%2E%2E%2Fsecret.txt",
        "/web/../../secret.txt", "/.hidden.js", "/..\\secret.txt"}) {
    RawResponse r = Get(port(), target);
    EXPECT_NE(r.status, 200) << target << "\n" << r.raw;
    EXPECT_GE(r.status, 400) << target << "\n" << r.raw;
    EXPECT_EQ(r.raw.find(kSecret), std::string::npos) << target;
  }
}

TEST_F(MonitoringServerTest, UnknownPathsAre404WithAShortText) {
  for (const char* target : {"/nope", "/api/nope", "/api/jobs/j-1", "/api/jobs/j-1/series/x",
                             "/missing.js", "/index.exe"}) {
    RawResponse r = Get(port(), target);
    EXPECT_EQ(r.status, 404) << target << "\n" << r.raw;
    EXPECT_LT(r.body.size(), 100u) << target;
  }
}

TEST_F(MonitoringServerTest, OnlyGetAndHeadAreAllowed) {
  for (const char* method : {"POST", "PUT", "DELETE", "PATCH", "OPTIONS"}) {
    RawResponse r =
        SendRaw(port(), std::string(method) +
                            " /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 2\r\n"
                            "\r\n{}");
    EXPECT_EQ(r.status, 405) << method << "\n" << r.raw;
    EXPECT_EQ(r.headers["allow"], "GET, HEAD") << method;
  }
  // HEAD: GET's status and headers (its Content-Length), no body.
  RawResponse get = Get(port(), "/metrics");
  RawResponse head = SendRaw(port(), "HEAD /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n");
  EXPECT_EQ(head.status, 200) << head.raw;
  EXPECT_EQ(head.headers["content-length"], std::to_string(get.body.size())) << head.raw;
  EXPECT_EQ(head.headers["content-type"], get.headers["content-type"]);
  EXPECT_EQ(head.body, "") << head.raw;
}

// The listener is on loopback: a request whose Host is a DNS name (a rebinding page's) is refused
// before any handler runs; one by address is served.
TEST_F(MonitoringServerTest, RefusesAHostThatIsANameOnLoopback) {
  RawResponse r =
      SendRaw(port(), "GET /api/jobs HTTP/1.1\r\nHost: evil.example:" + std::to_string(port()) +
                          "\r\n\r\n");
  EXPECT_EQ(r.status, 421) << r.raw.substr(0, 300);
  EXPECT_NE(r.body.find("DNS rebinding"), std::string::npos) << r.body;
  r = SendRaw(port(),
              "GET /api/jobs HTTP/1.1\r\nHost: localhost:" + std::to_string(port()) + "\r\n\r\n");
  EXPECT_EQ(r.status, 200) << r.raw.substr(0, 300);
}

TEST_F(MonitoringServerTest, RefusesOversizedRequestsAndKeepsServing) {
  // Headers just beyond the limit (16 KiB): our own check answers 431.
  std::string many = "GET /metrics HTTP/1.1\r\nHost: x\r\n";
  for (int i = 0; i < 60; ++i) {
    many += "X-H" + std::to_string(i) + ": " + std::string(300, 'c') + "\r\n";
  }
  many += "\r\n";
  RawResponse r = SendRaw(port(), many);
  EXPECT_EQ(r.status, 431) << r.raw.substr(0, 200);
  EXPECT_EQ(r.body.find("furnace_up"), std::string::npos);

  // Far beyond it: civetweb refuses before any handler runs.
  r = SendRaw(port(), "GET /metrics HTTP/1.1\r\nHost: x\r\nX-Pad: " + std::string(40 * 1024, 'a') +
                          "\r\n\r\n");
  EXPECT_TRUE(r.status == 400 || r.status == 413 || r.status == 431) << r.raw.substr(0, 200);
  EXPECT_EQ(r.body.find("furnace_up"), std::string::npos);

  // A body beyond the limit: refused before the handler runs. (civetweb then drains the body a
  // client sends before closing, so the client sends it all, as real ones do.)
  r = SendRaw(port(), "GET /api/jobs HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n" +
                          std::string(100000, 'b'));
  EXPECT_EQ(r.status, 413) << r.raw.substr(0, 200);

  EXPECT_EQ(Get(port(), "/metrics").status, 200);
}

TEST_F(MonitoringServerTest, StartRefusesBadAddressesWithoutThrowing) {
  MonitoringOptions o;
  o.listen = "no-port-here";
  auto s = MonitoringServer::Start(o, {});
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument) << s.status();
  EXPECT_EQ(MonitoringServer::CheckListen("127.0.0.1:99999").code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(MonitoringServer::CheckListen("bogus").message(),
              ::testing::HasSubstr("expected host:port with a port from 0 to 65535"));
  EXPECT_TRUE(MonitoringServer::CheckListen("127.0.0.1:0").ok());
  o.listen = "127.0.0.1:" + std::to_string(port());  // taken by the suite's server
  s = MonitoringServer::Start(o, {});
  EXPECT_EQ(s.status().code(), absl::StatusCode::kUnavailable) << s.status();
  // Why, as civetweb says it (not its "null context when constructing CivetServer").
  EXPECT_THAT(s.status().message(), ::testing::HasSubstr("Address already in use"));
}

}  // namespace
}  // namespace furnace::controller::http
