// promtool, Prometheus's own checker, on what we ship: the exposition RenderMetrics produces (no
// parse errors, no lint findings), the scrape config, the rules, and the rules' unit tests.
// promtool exits 0 when clean, 1 on a parse error and 3 on lint findings only.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>

#include "controller/metrics/render_metrics.h"
#include "tests/controller/metrics/snapshots.h"

namespace furnace::controller::metrics {
namespace {

const std::string kPromtool = FURNACE_PROMTOOL;
const std::string kSource = FURNACE_SOURCE_DIR;
constexpr char kMissing[] =
    "promtool was not found when CMake configured this build: run scripts/setup.sh (it installs "
    "the Debian package `prometheus`, which provides promtool), then re-run cmake";

struct Result {
  int exit_code = -1;
  std::string output;  // stdout and stderr together
};

Result RunShell(const std::string& command) {
  Result r;
  FILE* p = popen((command + " 2>&1").c_str(), "r");
  if (p == nullptr) return r;
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof(buf), p)) > 0;) r.output.append(buf, n);
  const int status = pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

std::string WriteTemp(const std::string& name, const std::string& text) {
  const std::string path = ::testing::TempDir() + name;
  std::ofstream(path) << text;
  return path;
}

void ExpectCleanMetrics(const MetricsSnapshot& snapshot, const std::string& name) {
  ASSERT_FALSE(kPromtool.empty()) << kMissing;
  const std::string path = WriteTemp(name, RenderMetrics(snapshot));
  const Result r = RunShell("'" + kPromtool + "' check metrics < '" + path + "'");
  EXPECT_EQ(r.exit_code, 0) << "promtool check metrics (1 = parse error, 3 = lint):\n" << r.output;
  EXPECT_EQ(r.output, "") << "promtool has findings";
}

TEST(Promtool, RichSnapshotPassesCheckMetricsWithoutFindings) {
  ExpectCleanMetrics(RichSnapshot(), "furnace_rich.prom");
}

TEST(Promtool, SmallAndEmptySnapshotsPassCheckMetrics) {
  ExpectCleanMetrics(SmallSnapshot(), "furnace_small.prom");
  ExpectCleanMetrics(MetricsSnapshot{}, "furnace_empty.prom");
}

TEST(Promtool, ScrapeConfigIsValid) {
  ASSERT_FALSE(kPromtool.empty()) << kMissing;
  const Result r = RunShell("'" + kPromtool + "' check config '" + kSource +
                            "/deploy/prometheus/prometheus.yml'");
  EXPECT_EQ(r.exit_code, 0) << r.output;
}

// The in-cluster scrape of deploy/k8s (mutual TLS to the metrics proxy): checked with its
// certificate paths pointed at files that exist (promtool checks they do) beside a copy of it.
TEST(Promtool, KubernetesScrapeConfigIsValid) {
  ASSERT_FALSE(kPromtool.empty()) << kMissing;
  const std::string dir = ::testing::TempDir() + "/promtool-k8s-" + std::to_string(::getpid());
  const Result r = RunShell(
      "set -e; rm -rf '" + dir + "'; mkdir -p '" + dir + "/tls'; cd '" + dir +
      "'; touch tls/ca.pem tls/cli.pem tls/cli.key; ln -s '" + kSource +
      "/deploy/prometheus/rules' rules; sed 's|/etc/prometheus/furnace/|" + dir + "/tls/|' '" +
      kSource + "/deploy/prometheus/prometheus-k8s.yml' > prometheus-k8s.yml; grep -q '" + dir +
      "/tls/cli.pem' prometheus-k8s.yml; '" + kPromtool +
      "' check config prometheus-k8s.yml; rm -rf '" + dir + "'");
  EXPECT_EQ(r.exit_code, 0) << r.output;
}

TEST(Promtool, RulesAreValid) {
  ASSERT_FALSE(kPromtool.empty()) << kMissing;
  const Result r =
      RunShell("'" + kPromtool + "' check rules '" + kSource + "/deploy/prometheus/rules/'*.yml");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output.find("WARNING"), std::string::npos) << r.output;
}

TEST(Promtool, AlertsFireWhenTheyShouldAndNotOtherwise) {
  ASSERT_FALSE(kPromtool.empty()) << kMissing;
  // promtool resolves rule_files in the test file relative to it.
  const Result r =
      RunShell("'" + kPromtool + "' test rules '" + kSource + "/deploy/prometheus/tests/'*.yml");
  EXPECT_EQ(r.exit_code, 0) << r.output;
}

}  // namespace
}  // namespace furnace::controller::metrics
