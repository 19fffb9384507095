// The lower-case names of the telemetry enums (telemetry.proto), as the Prometheus labels, the CLI
// and the dashboard show them: the value's name without its type prefix, so
// COLLECTIVE_OP_ALL_REDUCE is "all_reduce" (the label runtime/comm's CollectiveOpName gives it),
// PARALLEL_GROUP_TP "tp", PLANNER_ACTION_OFFLOAD "offload", MOE_LAYER_SCHEDULE_DEEPSPEED
// "deepspeed". An unknown value (a newer sender) is its number.
#pragma once

#include <string>

#include "furnace/v1/telemetry.pb.h"

namespace furnace::v1 {

std::string CollectiveOpLabel(CollectiveOp op);
std::string ParallelGroupLabel(ParallelGroup group);
std::string PlannerActionLabel(PlannerAction action);
std::string MoeLayerScheduleLabel(MoeLayerSchedule schedule);

}  // namespace furnace::v1
