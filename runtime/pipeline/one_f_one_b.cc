#include "runtime/pipeline/one_f_one_b.h"

#include <algorithm>

namespace furnace::pipeline {

std::vector<PipelineOp> OneFOneB(int stage, int stages, int m) {
  std::vector<PipelineOp> ops;
  const int warmup = std::min(stages - stage - 1, m);
  int forward = 0, backward = 0;
  for (int i = 0; i < warmup; ++i) ops.push_back({PipelineOp::kForward, forward++});
  while (forward < m) {
    ops.push_back({PipelineOp::kForward, forward++});
    ops.push_back({PipelineOp::kBackward, backward++});
  }
  while (backward < m) ops.push_back({PipelineOp::kBackward, backward++});
  return ops;
}

int MaxInFlight(int stage, int stages, int m) { return std::min(stages - stage, m); }

}  // namespace furnace::pipeline
