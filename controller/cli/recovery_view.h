// The `recoveries` section of `furnace status JOB`: for each attempt started by a restart, how
// long the recovery took from the failure to its first completed step, by phase
// (AttemptInfo.recovery; controller/service/recovery_phases.h), and which phase took longest.
#pragma once

#include <string>

#include "furnace/v1/controller.pb.h"

namespace furnace::cli {

// "" when no recovery has completed.
std::string RenderRecoverySection(const furnace::v1::JobDetail& job);

}  // namespace furnace::cli
