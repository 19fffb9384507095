// One rank of bench_distributed, run in a forked child: joins its groups through a FileKvStore
// (Gloo over 127.0.0.1), builds its shard of the GPT-MoE and a Trainer with the layout's
// ParallelRuntime (the worker's code path), trains warmup + steps steps on Markov data, and writes
// what every step reported to <dir>/rank-<r>.json: times, loss, the in-flight peak, bytes and calls
// per collective (StepStats::comm summed over the groups; calls from the groups' counters), global
// tokens per expert. The parent reads those files; nothing else crosses the process boundary.
//
// Call from a single-threaded process only (after fork). Errors: the Status of whatever failed
// (rendezvous, model, a step), with the step index where there is one.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "bench/distributed/layout_bytes.h"

namespace furnace::bench {

struct RunConfig {
  StepShape shape;
  topology::ParallelSizes sizes;
  int steps = 10, warmup = 3;
  int blas_threads = 1;  // per rank
  uint64_t seed = 1, data_seed = 7;
  double lr = 3e-3;
  double timeout_s = 120;  // rendezvous and every collective
};

std::string RankFile(const std::string& dir, int rank);

absl::Status RunRank(const RunConfig& config, const std::string& dir, int rank);

}  // namespace furnace::bench
