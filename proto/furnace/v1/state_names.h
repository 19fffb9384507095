// The words people and monitoring see for the job, rank, attempt and worker states ("running",
// "failed", "ready", ...): the CLI's views and the Prometheus label values use these, so the
// states travel as enums (controller.proto) and are named in one place.
#pragma once

#include "furnace/v1/controller.pb.h"

namespace furnace::v1 {

// Lower-case word; "" for UNSPECIFIED and values outside the enum.
const char* StateWord(JobState state);
const char* StateWord(RankState state);
const char* StateWord(AttemptState state);
const char* StateWord(WorkerState state);

// A worker's state word, but "left" for a lost worker whose agent said it was shutting down
// (WorkerInfo.left: stopped cleanly), so a clean stop reads apart from a crash or a silence.
const char* WorkerStateWord(const WorkerInfo& worker);

}  // namespace furnace::v1
