// What `furnace status JOB` prints, as a pure function of the JobDetail and the time now: a summary
// (state, attempt, restarts, cause, progress), the attempts with the cause each ended with, the
// ranks of the latest attempts, the commcheck bandwidth table, a train job's training figures
// (train_view.h) and goodput (goodput_view.h), and recent events.
#pragma once

#include <string>

#include "furnace/v1/controller.pb.h"

namespace furnace::cli {

std::string RenderJobStatus(const v1::JobDetail& job, double now_unix);

// The `furnace jobs` and `furnace workers` tables.
std::string RenderJobsTable(const v1::ListJobsResponse& jobs, double now_unix);
std::string RenderWorkersTable(const v1::ListWorkersResponse& workers, double now_unix);

}  // namespace furnace::cli
