// The `train` job kind's rank program: builds the GPT-MoE of MODEL.md from the job spec, resumes
// from the newest committed checkpoint in spec.checkpoint.dir when there is one (a restarted
// attempt continues exactly where the last checkpoint left it), trains to train.steps, and
// reports every step as telemetry (loss, aux loss, tokens/s, step time, MFU against the SGEMM
// peak measured at start, tokens per expert per MoE layer, imbalance, activation peak vs budget).
#pragma once

#include "furnace/v1/agent.pb.h"
#include "worker/rank_device.h"
#include "worker/rank_progress.h"

namespace furnace::worker {

// Returns the rank's exit code (worker/rank_exit.h). `rank_device`: the rank's device
// (rank_device.h), its compute stream current on this thread; the model trains on it.
int RunTrainRank(const furnace::v1::RankTask& task, Progress& progress, RankDevice& rank_device);

}  // namespace furnace::worker
