// The shipped Grafana dashboard and Prometheus rules ask only for metrics the controller exports:
// a renamed family would otherwise leave an empty panel or an alert that never fires.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>
#include <string>

#include "controller/metrics/render_metrics.h"
#include "tests/controller/metrics/snapshots.h"

namespace furnace::controller::metrics {
namespace {

const std::string kSource = FURNACE_SOURCE_DIR;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::set<std::string> ExportedNames() {
  std::set<std::string> names;
  std::istringstream in(RenderMetrics(RichSnapshot()));
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("# TYPE ", 0) == 0) names.insert(line.substr(7, line.find(' ', 7) - 7));
  }
  return names;
}

std::set<std::string> FurnaceNamesIn(const std::string& text) {
  static const std::regex kName("furnace_[a-z0-9_]+");
  std::set<std::string> names;
  for (std::sregex_iterator it(text.begin(), text.end(), kName), end; it != end; ++it) {
    names.insert(it->str());
  }
  return names;
}

void CollectQueries(const nlohmann::json& j, std::string* out) {
  if (j.is_object()) {
    for (const auto& [key, value] : j.items()) {
      if ((key == "expr" || key == "query" || key == "definition") && value.is_string()) {
        *out += value.get<std::string>() + "\n";
      } else if (key == "query" && value.is_object() && value.contains("query")) {
        *out += value["query"].get<std::string>() + "\n";
      } else {
        CollectQueries(value, out);
      }
    }
  } else if (j.is_array()) {
    for (const auto& v : j) CollectQueries(v, out);
  }
}

TEST(Dashboard, ParsesAndQueriesOnlyExportedMetrics) {
  const std::string text = ReadFile(kSource + "/deploy/grafana/furnace-dashboard.json");
  ASSERT_FALSE(text.empty());
  const nlohmann::json d = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  ASSERT_FALSE(d.is_discarded()) << "furnace-dashboard.json is not valid JSON";
  EXPECT_EQ(d.value("uid", ""), "furnace");

  bool job_variable = false;
  for (const auto& v : d["templating"]["list"]) {
    if (v.value("name", "") != "job") continue;
    std::string q;
    CollectQueries(v, &q);
    job_variable = q.find("label_values(furnace_job_state, job)") != std::string::npos;
  }
  EXPECT_TRUE(job_variable) << "no `job` variable from label_values(furnace_job_state, job)";

  std::string queries;
  int panels_with_queries = 0;
  for (const auto& panel : d["panels"]) {
    std::string q;
    CollectQueries(panel["targets"], &q);
    if (!q.empty()) ++panels_with_queries;
    queries += q;
  }
  EXPECT_GE(panels_with_queries, 9);
  const std::set<std::string> exported = ExportedNames();
  const std::set<std::string> used = FurnaceNamesIn(queries);
  for (const char* must :
       {"furnace_job_mfu_ratio", "furnace_job_tokens_per_second", "furnace_job_loss",
        "furnace_job_step_seconds", "furnace_moe_routing_imbalance_ratio",
        "furnace_activation_memory_peak_bytes", "furnace_memory_budget_bytes",
        "furnace_planner_bytes_total", "furnace_job_restarts_total", "furnace_job_state",
        "furnace_job_deadline_timestamp_seconds"}) {
    EXPECT_EQ(used.count(must), 1u) << "no panel shows " << must;
  }
  for (const std::string& name : used) EXPECT_EQ(exported.count(name), 1u) << name;
}

TEST(Rules, ReferenceOnlyExportedMetrics) {
  const std::string text = ReadFile(kSource + "/deploy/prometheus/rules/furnace.rules.yml");
  ASSERT_FALSE(text.empty());
  const std::set<std::string> exported = ExportedNames();
  const std::set<std::string> used = FurnaceNamesIn(text);
  EXPECT_GE(used.size(), 5u);
  for (const std::string& name : used) EXPECT_EQ(exported.count(name), 1u) << name;
  for (const char* alert :
       {"FurnaceJobStalled", "FurnaceJobWaiting", "FurnaceMfuDrop", "FurnaceRestartStorm",
        "FurnaceMemoryNearBudget", "FurnaceJobWillMissItsTimeLimit"}) {
    EXPECT_NE(text.find(std::string("alert: ") + alert), std::string::npos) << alert;
  }
}

}  // namespace
}  // namespace furnace::controller::metrics
