#include "runtime/pipeline/one_f_one_b.h"

#include <algorithm>
#include <vector>

#include "gtest/gtest.h"

namespace furnace::pipeline {
namespace {

using Op = PipelineOp;

TEST(OneFOneBTest, FirstStageOfFourWithEightMicroBatches) {
  const std::vector<Op> want = {
      {Op::kForward, 0},  {Op::kForward, 1},  {Op::kForward, 2},  {Op::kForward, 3},
      {Op::kBackward, 0}, {Op::kForward, 4},  {Op::kBackward, 1}, {Op::kForward, 5},
      {Op::kBackward, 2}, {Op::kForward, 6},  {Op::kBackward, 3}, {Op::kForward, 7},
      {Op::kBackward, 4}, {Op::kBackward, 5}, {Op::kBackward, 6}, {Op::kBackward, 7}};
  EXPECT_EQ(OneFOneB(0, 4, 8), want);
}

TEST(OneFOneBTest, LastStageAlternates) {
  const std::vector<Op> want = {{Op::kForward, 0},  {Op::kBackward, 0}, {Op::kForward, 1},
                                {Op::kBackward, 1}, {Op::kForward, 2},  {Op::kBackward, 2}};
  EXPECT_EQ(OneFOneB(3, 4, 3), want);
}

TEST(OneFOneBTest, EveryMicroBatchOnceAndInFlightBounded) {
  for (int stages = 1; stages <= 6; ++stages) {
    for (int stage = 0; stage < stages; ++stage) {
      for (int m = 1; m <= 9; ++m) {
        const std::vector<Op> ops = OneFOneB(stage, stages, m);
        ASSERT_EQ(ops.size(), static_cast<size_t>(2 * m));
        std::vector<int> forward_at(m, -1), backward_at(m, -1);
        int in_flight = 0, peak = 0, next_backward = 0;
        for (size_t i = 0; i < ops.size(); ++i) {
          if (ops[i].kind == Op::kForward) {
            ASSERT_EQ(forward_at[ops[i].micro], -1);
            forward_at[ops[i].micro] = static_cast<int>(i);
            peak = std::max(peak, ++in_flight);
          } else {
            ASSERT_EQ(ops[i].micro, next_backward++) << "backwards run in order";
            ASSERT_GE(forward_at[ops[i].micro], 0) << "backward before its forward";
            backward_at[ops[i].micro] = static_cast<int>(i);
            --in_flight;
          }
        }
        EXPECT_EQ(peak, MaxInFlight(stage, stages, m))
            << "stage " << stage << " of " << stages << ", m = " << m;
        EXPECT_EQ(MaxInFlight(stage, stages, m), std::min(stages - stage, m));
      }
    }
  }
}

}  // namespace
}  // namespace furnace::pipeline
