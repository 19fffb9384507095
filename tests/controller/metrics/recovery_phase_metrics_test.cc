// furnace_recovery_phase_seconds{job,phase}: the phases of each job's last recovery.
#include <gtest/gtest.h>

#include <string>

#include "controller/metrics/render_metrics.h"

namespace furnace::controller::metrics {
namespace {

TEST(RecoveryPhaseMetrics, OneSamplePerPhaseOfTheLastRecovery) {
  MetricsSnapshot snapshot;
  JobMetrics recovered;
  recovered.job_id = "demo-1";
  recovered.last_recovery_phases = {{"detection", 0.05}, {"setup", 3.5}, {"total", 6.25}};
  JobMetrics fresh;
  fresh.job_id = "demo-2";
  snapshot.jobs = {recovered, fresh};
  const std::string text = RenderMetrics(snapshot);
  EXPECT_NE(text.find("# TYPE furnace_recovery_phase_seconds gauge\n"), std::string::npos);
  EXPECT_NE(text.find("furnace_recovery_phase_seconds{job=\"demo-1\",phase=\"detection\"} 0.05\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("furnace_recovery_phase_seconds{job=\"demo-1\",phase=\"setup\"} 3.5\n"),
            std::string::npos);
  EXPECT_NE(text.find("furnace_recovery_phase_seconds{job=\"demo-1\",phase=\"total\"} 6.25\n"),
            std::string::npos);
  EXPECT_EQ(text.find("furnace_recovery_phase_seconds{job=\"demo-2\""), std::string::npos);
}

TEST(RecoveryPhaseMetrics, AbsentWithoutARecovery) {
  MetricsSnapshot snapshot;
  JobMetrics fresh;
  fresh.job_id = "demo-2";
  snapshot.jobs = {fresh};
  EXPECT_EQ(RenderMetrics(snapshot).find("furnace_recovery_phase_seconds"), std::string::npos);
}

}  // namespace
}  // namespace furnace::controller::metrics
