// The JSON the dashboard reads: JobService messages printed by protobuf's JSON mapping with the
// proto field names (job_id, tokens_per_second), every field present (zeros included), enums by
// name (JOB_RUNNING) and 64-bit integers as strings ("step": "12"), as that mapping requires.
// The controller's MonitoringHandlers call these on what its JobService would answer.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "furnace/v1/controller.pb.h"

namespace furnace::controller::http {

// {"jobs": [JobSummary, ...]}
absl::StatusOr<std::string> JobsJson(const furnace::v1::ListJobsResponse& jobs);

// {"now_unix": ..., "workers": [WorkerInfo, ...]}: now_unix is the controller's clock, which the
// page measures the workers' last_seen_unix against (a browser's clock may be off).
absl::StatusOr<std::string> WorkersJson(const furnace::v1::ListWorkersResponse& workers,
                                        double now_unix);

// {"job_id": ..., "steps": [StepRecord, ...], "telemetry_dropped": "0"}
absl::StatusOr<std::string> SeriesJson(const furnace::v1::JobSeries& series);

}  // namespace furnace::controller::http
