// Routing rules and the dashboard JSON without sockets: Route() on plain requests, the static
// file checks on a temporary directory, and the proto JSON field names the page relies on.
#include "controller/http/routes.h"

#include <google/protobuf/util/json_util.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "controller/http/proto_json.h"
#include "controller/http/static_files.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace furnace::controller::http {
namespace {

namespace fs = std::filesystem;

HttpRequest Req(std::string path, std::string query = "", std::string method = "GET") {
  HttpRequest r;
  r.method = std::move(method);
  r.path = std::move(path);
  r.query = std::move(query);
  return r;
}

TEST(RoutesTest, MissingHandlersAnswer404) {
  MonitoringHandlers none;
  RouteOptions o;
  EXPECT_EQ(Route(Req("/metrics"), none, o).status, 404);
  EXPECT_EQ(Route(Req("/api/jobs"), none, o).status, 404);
  EXPECT_EQ(Route(Req("/api/workers"), none, o).status, 404);
  EXPECT_EQ(Route(Req("/api/jobs/a/series"), none, o).status, 404);
  EXPECT_EQ(Route(Req("/"), none, o).status, 404);  // no web_root
}

TEST(RoutesTest, QueryValuesAreDecodedAndChecked) {
  std::string got_id;
  uint64_t got_since = 99;
  uint32_t got_max = 99;
  SeriesQuery got;
  MonitoringHandlers h;
  h.series_json = [&](const std::string& id, const SeriesQuery& q) -> absl::StatusOr<std::string> {
    got_id = id;
    got_since = q.since_step;
    got_max = q.max_points;
    got = q;
    return std::string("{}");
  };
  RouteOptions o;
  EXPECT_EQ(Route(Req("/api/jobs/j 1/series", "since=%34%32&&max=7"), h, o).status, 200);
  EXPECT_EQ(got_id, "j 1");
  EXPECT_EQ(got_since, 42u);
  EXPECT_EQ(got_max, 7u);
  EXPECT_EQ(Route(Req("/api/jobs/j/series", "since=%zz"), h, o).status, 400);
  EXPECT_EQ(Route(Req("/api/jobs/j/series", "since=%4"), h, o).status, 400);
  EXPECT_EQ(Route(Req("/api/jobs/j/series", "max=4294967296"), h, o).status, 400);
  // Points are bounded: absent is the default, 0 (once "all") and past the most are refused.
  EXPECT_EQ(Route(Req("/api/jobs/j/series", "since=5"), h, o).status, 200);
  EXPECT_EQ(got_max, kDefaultSeriesPoints);
  EXPECT_EQ(Route(Req("/api/jobs/j/series", "max=10000"), h, o).status, 200);
  EXPECT_EQ(got_max, kMaxSeriesPoints);
  for (const char* query : {"max=0", "max=10001"}) {
    const HttpResponse r = Route(Req("/api/jobs/j/series", query), h, o);
    EXPECT_EQ(r.status, 400) << query;
    EXPECT_EQ(r.body, "max: expected a number of points from 1 to 10000 (default 2000)\n") << query;
  }
  // A parameter misspelt or given twice is refused, naming it (and the allowed ones).
  const HttpResponse unknown = Route(Req("/api/jobs/j/series", "max=5&limit=5"), h, o);
  EXPECT_EQ(unknown.status, 400);
  EXPECT_EQ(unknown.body,
            "unknown parameter 'limit' (allowed: since, after_attempt, after_step, max)\n");
  EXPECT_EQ(Route(Req("/api/jobs/j/series", "Max=5"), h, o).status, 400);
  const HttpResponse twice = Route(Req("/api/jobs/j/series", "max=5&max=abc"), h, o);
  EXPECT_EQ(twice.status, 400);
  EXPECT_EQ(twice.body, "max: given twice\n");
  // The cursor: both parts, or the attempt alone (its step 0); never with since.
  EXPECT_EQ(Route(Req("/api/jobs/j/series", "after_attempt=3&after_step=17"), h, o).status, 200);
  EXPECT_TRUE(got.cursor);
  EXPECT_EQ(got.after_attempt, 3u);
  EXPECT_EQ(got.after_step, 17u);
  EXPECT_EQ(Route(Req("/api/jobs/j/series", "after_attempt=2"), h, o).status, 200);
  EXPECT_TRUE(got.cursor);
  EXPECT_EQ(got.after_step, 0u);
  // The step alone would be (0, N), before every step: the whole series, not what was meant.
  const HttpResponse step_alone = Route(Req("/api/jobs/j/series", "after_step=5"), h, o);
  EXPECT_EQ(step_alone.status, 400);
  EXPECT_THAT(step_alone.body, ::testing::HasSubstr("after_step: needs after_attempt"));
  EXPECT_EQ(Route(Req("/api/jobs/j/series", "after_attempt=x"), h, o).status, 400);
  EXPECT_EQ(Route(Req("/api/jobs/j/series", "after_step=-1"), h, o).status, 400);
  const HttpResponse both = Route(Req("/api/jobs/j/series", "since=3&after_attempt=1"), h, o);
  EXPECT_EQ(both.status, 400);
  EXPECT_EQ(both.body, "since or the cursor (after_attempt, after_step), not both\n");
  EXPECT_EQ(Route(Req("/api/jobs//series"), h, o).status, 404);
  EXPECT_EQ(Route(Req("/api/jobs/series"), h, o).status, 404);
}

TEST(RoutesTest, HandlerErrorsMapToStatuses) {
  absl::Status next;
  MonitoringHandlers h;
  h.jobs_json = [&]() -> absl::StatusOr<std::string> { return next; };
  RouteOptions o;
  next = absl::NotFoundError("gone");
  EXPECT_EQ(Route(Req("/api/jobs"), h, o).status, 404);
  next = absl::InvalidArgumentError("bad");
  EXPECT_EQ(Route(Req("/api/jobs"), h, o).status, 400);
  next = absl::UnavailableError("busy");
  HttpResponse r = Route(Req("/api/jobs"), h, o);
  EXPECT_EQ(r.status, 500);
  EXPECT_EQ(r.body, "busy\n");
}

TEST(RoutesTest, WorkersAreServedAsJson) {
  MonitoringHandlers h;
  h.workers_json = []() -> absl::StatusOr<std::string> { return std::string("{\"workers\":[]}"); };
  RouteOptions o;
  const HttpResponse r = Route(Req("/api/workers"), h, o);
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.content_type, "application/json; charset=utf-8");
  EXPECT_EQ(r.body, "{\"workers\":[]}");
  EXPECT_EQ(Route(Req("/api/workers/x"), h, o).status, 404);
}

TEST(RoutesTest, BodySizeIsCheckedBeforeTheMethod) {
  MonitoringHandlers h;
  RouteOptions o;
  o.max_body_bytes = 10;
  HttpRequest big = Req("/metrics", "", "POST");
  big.content_length = 11;
  EXPECT_EQ(Route(big, h, o).status, 413);
  big.content_length = 10;
  EXPECT_EQ(Route(big, h, o).status, 405);
}

// DNS rebinding: a page elsewhere rebinds its name to 127.0.0.1 and reads the loopback API from
// a browser on this machine; its requests carry that name as Host. A loopback listener answers a
// Host of localhost or an IP address only (and a request without one, as HTTP/1.0 sends); a
// listener others can reach is reached by any name.
TEST(RoutesTest, ALoopbackListenerRefusesAHostThatIsAName) {
  MonitoringHandlers h;
  h.metrics_text = [] { return std::string("m 1\n"); };
  RouteOptions o;
  o.loopback_listener = true;
  auto with_host = [](std::string host) {
    HttpRequest r = Req("/metrics");
    r.host = std::move(host);
    return r;
  };
  for (const char* ok : {"127.0.0.1:9464", "127.0.0.1", "localhost:9464", "LOCALHOST", "[::1]:9464",
                         "[::1]", "10.0.0.5:9464", ""}) {
    EXPECT_EQ(Route(with_host(ok), h, o).status, 200) << ok;
  }
  for (const char* bad : {"evil.example:9464", "evil.example", "localhost.evil.example",
                          "127.0.0.1.evil.example", "[::1", "furnace-head:9464"}) {
    const HttpResponse r = Route(with_host(bad), h, o);
    EXPECT_EQ(r.status, 421) << bad;
    EXPECT_NE(r.body.find("DNS rebinding"), std::string::npos) << r.body;
  }
  o.loopback_listener = false;
  EXPECT_EQ(Route(with_host("furnace-head:9464"), h, o).status, 200);
}

// A reverse proxy in front of the loopback listener that passes its clients' Host on (Caddy,
// Traefik, nginx with `proxy_set_header Host $host`) is let through by its public name
// (--metrics-allowed-host), with any port and in any case; other names are still refused, and
// the refusal says how to allow a proxy's.
TEST(RoutesTest, ALoopbackListenerAnswersTheNamesItIsGiven) {
  MonitoringHandlers h;
  h.metrics_text = [] { return std::string("m 1\n"); };
  RouteOptions o;
  o.loopback_listener = true;
  o.allowed_hosts = {HostName("Furnace.Example.com")};
  auto with_host = [](std::string host) {
    HttpRequest r = Req("/metrics");
    r.host = std::move(host);
    return r;
  };
  for (const char* ok : {"furnace.example.com", "furnace.example.com:443", "FURNACE.example.COM"}) {
    EXPECT_EQ(Route(with_host(ok), h, o).status, 200) << ok;
  }
  for (const char* bad : {"evil.example.com", "furnace.example.com.evil", "example.com"}) {
    const HttpResponse r = Route(with_host(bad), h, o);
    EXPECT_EQ(r.status, 421) << bad;
    EXPECT_NE(r.body.find("--metrics-allowed-host NAME"), std::string::npos) << r.body;
  }
  EXPECT_EQ(HostName("Host.Example:80"), "host.example");
}

class StaticFilesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() / ("furnace-static-" + std::to_string(getpid()));
    fs::create_directories(root_ / "web" / "sub");
    std::ofstream(root_ / "web" / "index.html") << "<p>hi</p>";
    std::ofstream(root_ / "web" / "sub" / "a.css") << "p{}";
    std::ofstream(root_ / "outside.js") << "secret";
    fs::create_symlink(root_ / "outside.js", root_ / "web" / "link.js");
  }
  void TearDown() override { fs::remove_all(root_); }
  std::string web() const { return (root_ / "web").string(); }
  fs::path root_;
};

TEST_F(StaticFilesTest, ServesFilesUnderTheRoot) {
  auto f = ReadStaticFile(web(), "/");
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->body, "<p>hi</p>");
  EXPECT_EQ(f->content_type, "text/html; charset=utf-8");
  f = ReadStaticFile(web(), "/sub/a.css");
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->content_type, "text/css; charset=utf-8");
}

TEST_F(StaticFilesTest, RefusesWhatCouldLeaveTheRoot) {
  for (const char* p : {"/../outside.js", "/sub/../../outside.js", "/./index.html", "//index.html",
                        "/.git/config", "/sub\\a.css", "index.html"}) {
    EXPECT_EQ(ReadStaticFile(web(), p).status().code(), absl::StatusCode::kInvalidArgument) << p;
  }
  EXPECT_EQ(ReadStaticFile(web(), "/link.js").status().code(),
            absl::StatusCode::kInvalidArgument);  // a symlink out of the root
  EXPECT_EQ(ReadStaticFile(web(), std::string("/index.html\0.js", 15)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ReadStaticFile(web(), "/missing.js").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(ReadStaticFile(web(), "/sub").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(ReadStaticFile(web(), "/index.exe").status().code(), absl::StatusCode::kNotFound);
}

TEST(ProtoJsonTest, UsesProtoFieldNamesAndPrintsZeros) {
  furnace::v1::JobSeries s;
  s.set_job_id("j-1");
  furnace::v1::StepRecord* r = s.add_steps();
  r->set_step(3);
  r->set_tokens_per_second(1234.5);
  r->add_imbalance(1.25);
  furnace::v1::PlannerActionBytes* planner = r->add_planner();
  planner->set_action(furnace::v1::PLANNER_ACTION_OFFLOAD);
  planner->set_bytes(4096);
  auto json = SeriesJson(s);
  ASSERT_TRUE(json.ok()) << json.status();
  EXPECT_NE(json->find(R"("job_id":"j-1")"), std::string::npos) << *json;
  EXPECT_NE(json->find(R"("step":"3")"), std::string::npos) << *json;
  EXPECT_NE(json->find(R"("tokens_per_second":1234.5)"), std::string::npos) << *json;
  EXPECT_NE(json->find(R"("imbalance":[1.25])"), std::string::npos) << *json;
  // Enums by name (web/app.js turns them into labels), uint64 as strings.
  EXPECT_NE(json->find(R"("planner":[{"action":"PLANNER_ACTION_OFFLOAD","bytes":"4096"}])"),
            std::string::npos)
      << *json;
  EXPECT_NE(json->find(R"("loss":0)"), std::string::npos) << *json;

  furnace::v1::ListJobsResponse jobs;
  jobs.add_jobs()->set_state(furnace::v1::JOB_RUNNING);
  json = JobsJson(jobs);
  ASSERT_TRUE(json.ok()) << json.status();
  EXPECT_NE(json->find(R"("state":"JOB_RUNNING")"), std::string::npos) << *json;
}

// The workers with the controller's clock first: the page measures last_seen_unix against it.
TEST(ProtoJsonTest, WorkersComeWithTheControllersClock) {
  furnace::v1::ListWorkersResponse workers;
  auto json = WorkersJson(workers, 1700000000.25);
  ASSERT_TRUE(json.ok()) << json.status();
  EXPECT_EQ(*json, R"({"now_unix":1700000000.250,"workers":[]})");
  furnace::v1::WorkerInfo* w = workers.add_workers();
  w->set_worker_id("h/0");
  w->set_state(furnace::v1::WORKER_STATE_LOST);
  w->set_left(true);
  w->set_device_memory(uint64_t{1} << 33);
  json = WorkersJson(workers, 5);
  ASSERT_TRUE(json.ok()) << json.status();
  EXPECT_TRUE(absl::StartsWith(*json, R"({"now_unix":5.000,"workers":[{"worker_id":"h/0")"))
      << *json;
  EXPECT_NE(json->find(R"("state":"WORKER_STATE_LOST")"), std::string::npos) << *json;
  EXPECT_NE(json->find(R"("left":true)"), std::string::npos) << *json;
  EXPECT_NE(json->find(R"("device_memory":"8589934592")"), std::string::npos) << *json;
}

// The series printed a step at a time reads exactly as the whole message printed at once (the
// dashboard parses it), with no steps, one, and many.
TEST(ProtoJsonTest, SeriesPrintedStepByStepIsTheWholeMessagesJson) {
  const auto whole = [](const furnace::v1::JobSeries& s) {
    google::protobuf::util::JsonPrintOptions options;
    options.preserve_proto_field_names = true;
    options.always_print_primitive_fields = true;
    std::string out;
    EXPECT_TRUE(google::protobuf::util::MessageToJsonString(s, &out, options).ok());
    return out;
  };
  furnace::v1::JobSeries s;
  s.set_job_id(R"(a "steps":[] job)");
  s.set_telemetry_dropped(7);
  s.set_more(true);
  for (int n = 0; n < 4; ++n) {
    auto json = SeriesJson(s);
    ASSERT_TRUE(json.ok()) << json.status();
    EXPECT_EQ(*json, whole(s));
    furnace::v1::StepRecord* r = s.add_steps();
    r->set_attempt(1);
    r->set_step(n + 1);
    r->set_loss(2.5 - n * 0.1);
    r->add_imbalance(1.0 + n);
    r->add_moe_schedules(furnace::v1::MOE_LAYER_SCHEDULE_S1);
  }
}

}  // namespace
}  // namespace furnace::controller::http
