// The "no progress" rung of the restart ladder as a pure function of the attempts.
#include "controller/store/progress_rule.h"

#include "gtest/gtest.h"

namespace furnace::controller {
namespace {

namespace v1 = furnace::v1;

v1::AttemptInfo Attempt(v1::AttemptState state, std::vector<uint64_t> steps) {
  v1::AttemptInfo a;
  a.set_state(state);
  for (uint64_t s : steps) a.add_ranks()->set_step(s);
  return a;
}

TEST(ProgressRuleTest, StepIsTheSlowestRank) {
  EXPECT_EQ(AttemptStep(Attempt(v1::ATTEMPT_STATE_FAILED, {7, 5, 9})), 5u);
  EXPECT_EQ(AttemptStep(Attempt(v1::ATTEMPT_STATE_FAILED, {})), 0u);
}

TEST(ProgressRuleTest, AttemptsThatNeverPassTheBestStepCount) {
  // 0 -> 47, then resumed at 40 and failing at 45 and 47: two attempts without progress.
  std::vector<v1::AttemptInfo> a = {Attempt(v1::ATTEMPT_STATE_FAILED, {47, 48}),
                                    Attempt(v1::ATTEMPT_STATE_FAILED, {45, 46}),
                                    Attempt(v1::ATTEMPT_STATE_FAILED, {47, 47})};
  NoProgress np = AttemptsWithoutProgress(a);
  EXPECT_EQ(np.attempts, 2u);
  EXPECT_EQ(np.step, 47u);
  // One that gets past 47 breaks the run.
  a.push_back(Attempt(v1::ATTEMPT_STATE_FAILED, {52, 50}));
  EXPECT_EQ(AttemptsWithoutProgress(a).attempts, 0u);
}

TEST(ProgressRuleTest, FirstAttemptAtStepZeroMadeNoProgress) {
  std::vector<v1::AttemptInfo> a = {Attempt(v1::ATTEMPT_STATE_FAILED, {0, 0}),
                                    Attempt(v1::ATTEMPT_STATE_FAILED, {0, 0}),
                                    Attempt(v1::ATTEMPT_STATE_FAILED, {0, 0})};
  EXPECT_EQ(AttemptsWithoutProgress(a).attempts, 3u);
  EXPECT_EQ(AttemptsWithoutProgress(a).step, 0u);
}

TEST(ProgressRuleTest, InterruptedAttemptsAreSkippedAndOthersEndTheRun) {
  std::vector<v1::AttemptInfo> a = {
      Attempt(v1::ATTEMPT_STATE_FAILED, {10}), Attempt(v1::ATTEMPT_STATE_FAILED, {3}),
      Attempt(v1::ATTEMPT_STATE_INTERRUPTED, {2}), Attempt(v1::ATTEMPT_STATE_FAILED, {8})};
  EXPECT_EQ(AttemptsWithoutProgress(a).attempts, 2u);
  // A running (or succeeded) attempt at the end is not a failure: nothing to count.
  a.push_back(Attempt(v1::ATTEMPT_STATE_RUNNING, {0}));
  EXPECT_EQ(AttemptsWithoutProgress(a).attempts, 0u);
  EXPECT_EQ(AttemptsWithoutProgress({}).attempts, 0u);
}

TEST(ProgressRuleTest, AnotherMemoryPolicyOrLayoutEndsTheRun) {
  std::vector<v1::AttemptInfo> a = {Attempt(v1::ATTEMPT_STATE_FAILED, {0}),
                                    Attempt(v1::ATTEMPT_STATE_FAILED, {0}),
                                    Attempt(v1::ATTEMPT_STATE_FAILED, {0})};
  a[0].set_memory_policy("none");
  a[1].set_memory_policy("selective");
  a[2].set_memory_policy("selective");
  EXPECT_EQ(AttemptsWithoutProgress(a).attempts, 2u);
  a[1].mutable_parallel()->set_dp(4);
  a[2].mutable_parallel()->set_dp(2);  // shrunk
  EXPECT_EQ(AttemptsWithoutProgress(a).attempts, 1u);
}

// The next attempt avoids where the newest failure was blamed, and where each failure of the run
// without progress before it was; a failure that made progress ends the run.
TEST(SuspectWorkersTest, TheCulpritsOfTheFailuresWithoutProgress) {
  const auto failed = [](uint64_t step, const std::string& culprit) {
    v1::AttemptInfo a = Attempt(v1::ATTEMPT_STATE_FAILED, {step});
    a.set_culprit_worker(culprit);
    return a;
  };
  EXPECT_TRUE(SuspectWorkers({}).empty());
  // Progress (step 5 past 0), then two failures that got no further than 5.
  std::vector<v1::AttemptInfo> attempts = {failed(5, "h/0"), failed(3, "h/1"), failed(5, "h/2")};
  EXPECT_EQ(SuspectWorkers(attempts), (std::set<std::string>{"h/1", "h/2"}));
  // A newer attempt that got past step 5: only its own culprit.
  attempts.push_back(failed(9, "h/3"));
  EXPECT_EQ(SuspectWorkers(attempts), (std::set<std::string>{"h/3"}));
  // A running attempt after them: the suspects of the failures before it.
  attempts.push_back(Attempt(v1::ATTEMPT_STATE_RUNNING, {2}));
  EXPECT_EQ(SuspectWorkers(attempts), (std::set<std::string>{"h/3"}));
}

}  // namespace
}  // namespace furnace::controller
