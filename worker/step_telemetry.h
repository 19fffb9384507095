// The translation of a training step of this rank (train::StepStats, runtime/) into the message
// the controller aggregates (furnace.v1.StepTelemetry, telemetry.proto): the one place where the
// runtime's step numbers meet the wire schema.
#pragma once

#include <cstdint>
#include <string>

#include "furnace/v1/telemetry.pb.h"
#include "runtime/comm/communicator.h"
#include "runtime/train/trainer.h"

namespace furnace::worker {

struct StepTelemetryContext {
  // Whether this rank reports the global counts (tokens, tokens per expert): rank 0 does, so the
  // controller's sum over ranks counts them once.
  bool reporter = false;
  uint64_t memory_budget_bytes = 0;      // memory.device_budget (0 = unlimited)
  double entropy_floor = 0;              // the data's loss floor when known, else 0
  std::string moe_schedule_reason = {};  // moe.schedule auto: the choice's reason, else empty
};

furnace::v1::StepTelemetry StepTelemetryOf(const train::StepStats& stats,
                                           const StepTelemetryContext& context);

furnace::v1::CollectiveOp CollectiveOpOf(comm::CollectiveOp op);
// A train::RankGroup kind ("world", "tp", "dp", "pp", "ep", "esp", "edp", "embedding");
// PARALLEL_GROUP_UNSPECIFIED for anything else.
furnace::v1::ParallelGroup ParallelGroupOf(const std::string& kind);
// A schedule as the runtime names it ("deepspeed", "s1", "s2"; runtime/moe/schedule.h:
// ScheduleName); MOE_LAYER_SCHEDULE_UNSPECIFIED for anything else.
furnace::v1::MoeLayerSchedule MoeLayerScheduleOf(const std::string& name);

}  // namespace furnace::worker
