#include "proto/furnace/v1/telemetry_labels.h"

#include <cctype>
#include <string_view>

namespace furnace::v1 {
namespace {

std::string Label(const std::string& name, std::string_view prefix, int number) {
  if (name.size() <= prefix.size() || name.compare(0, prefix.size(), prefix) != 0) {
    return std::to_string(number);
  }
  std::string out = name.substr(prefix.size());
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

}  // namespace

std::string CollectiveOpLabel(CollectiveOp op) {
  return Label(CollectiveOp_Name(op), "COLLECTIVE_OP_", op);
}

std::string ParallelGroupLabel(ParallelGroup group) {
  return Label(ParallelGroup_Name(group), "PARALLEL_GROUP_", group);
}

std::string PlannerActionLabel(PlannerAction action) {
  return Label(PlannerAction_Name(action), "PLANNER_ACTION_", action);
}

std::string MoeLayerScheduleLabel(MoeLayerSchedule schedule) {
  return Label(MoeLayerSchedule_Name(schedule), "MOE_LAYER_SCHEDULE_", schedule);
}

}  // namespace furnace::v1
