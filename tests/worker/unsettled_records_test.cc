// The step records an agent holds until the controller says they are stored
// (worker/unsettled_records.h): which it holds, what an answer lets go, what a new registration
// takes to push again, and the bounds.
#include "worker/unsettled_records.h"

#include <set>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace furnace::worker {
namespace {

namespace v1 = furnace::v1;

v1::TelemetryRecord Step(const std::string& job, uint32_t attempt, uint64_t step, uint32_t rank) {
  v1::TelemetryRecord r;
  r.set_job_id(job);
  r.set_attempt(attempt);
  r.set_step(step);
  r.set_rank(rank);
  r.mutable_train()->set_loss(1.0);
  return r;
}

v1::TelemetryAck Settled(const std::string& job, uint32_t attempt, uint64_t step,
                         bool all = false) {
  v1::TelemetryAck ack;
  v1::SettledSteps* s = ack.add_settled();
  s->set_job_id(job);
  s->set_attempt(attempt);
  s->set_step(step);
  s->set_all(all);
  return ack;
}

std::vector<uint64_t> Steps(const std::vector<v1::TelemetryRecord>& records) {
  std::vector<uint64_t> steps;
  for (const auto& r : records) steps.push_back(r.step());
  return steps;
}

TEST(UnsettledRecordsTest, HoldsStepRecordsUntilTheirStepIsStored) {
  UnsettledRecords held(100, 1 << 20);
  v1::TelemetryRecord phase;  // not a step record: stored as it comes, not held
  phase.set_job_id("a");
  phase.set_phase("rendezvous");
  held.Add({phase, Step("a", 1, 1, 0), Step("a", 1, 2, 0), Step("a", 2, 1, 0), Step("b", 1, 7, 0)});
  EXPECT_EQ(held.size(), 4u);
  EXPECT_EQ(held.Jobs(), (std::set<std::string>{"a", "b"}));

  // (attempt 1, step 2) covers every record of attempt 1 up to step 2, not attempt 2's step 1.
  held.Settle(Settled("a", 1, 2), {"a"});
  EXPECT_EQ(held.size(), 2u);
  held.Settle(Settled("a", 2, 0), {"a"});  // nothing of attempt 2 stored yet
  EXPECT_EQ(held.size(), 2u);
  held.Settle(Settled("b", 0, 0, /*all=*/true), {"b"});  // job b ended: all of it goes
  EXPECT_EQ(held.Jobs(), (std::set<std::string>{"a"}));
  held.Settle(Settled("a", 2, 1), {"a"});
  EXPECT_EQ(held.size(), 0u);
  EXPECT_EQ(held.bytes(), 0u);
}

// A controller older than the agent answers with an empty Ack: it says nothing of the jobs asked
// about, and the agent holds nothing for it (it would hold up to its bounds and push them again
// at every registration).
TEST(UnsettledRecordsTest, AJobTheAnswerLeavesOutIsNotHeld) {
  UnsettledRecords held(100, 1 << 20);
  held.Add({Step("a", 1, 1, 0), Step("b", 1, 1, 0)});
  held.Settle(v1::TelemetryAck(), {"a"});
  EXPECT_EQ(held.Jobs(), (std::set<std::string>{"b"}));
}

TEST(UnsettledRecordsTest, ANewRegistrationTakesEveryHeldRecordInOrder) {
  UnsettledRecords held(100, 1 << 20);
  held.Add({Step("a", 1, 1, 0), Step("a", 1, 2, 0), Step("b", 1, 3, 0)});
  EXPECT_EQ(Steps(held.TakeAll()), (std::vector<uint64_t>{1, 2, 3}));
  EXPECT_EQ(held.size(), 0u);  // back once pushed again and acknowledged
  EXPECT_EQ(held.bytes(), 0u);
  EXPECT_TRUE(held.Jobs().empty());
}

TEST(UnsettledRecordsTest, TheOldestGoPastEitherBound) {
  UnsettledRecords by_count(2, 1 << 20);
  by_count.Add({Step("a", 1, 1, 0), Step("a", 1, 2, 0), Step("a", 1, 3, 0)});
  EXPECT_EQ(by_count.size(), 2u);
  EXPECT_EQ(by_count.dropped(), 1u);
  EXPECT_EQ(Steps(by_count.TakeAll()), (std::vector<uint64_t>{2, 3}));

  const size_t one = Step("a", 1, 1, 0).ByteSizeLong();
  UnsettledRecords by_bytes(100, 2 * one);
  by_bytes.Add({Step("a", 1, 1, 0), Step("a", 1, 2, 0), Step("a", 1, 3, 0)});
  EXPECT_EQ(by_bytes.size(), 2u);
  EXPECT_EQ(by_bytes.bytes(), 2 * one);
  EXPECT_EQ(by_bytes.dropped(), 1u);
}

}  // namespace
}  // namespace furnace::worker
