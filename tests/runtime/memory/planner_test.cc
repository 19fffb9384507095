// memory::CoverDeficits: the cheapest action per freed byte, taken only where it helps (before the
// point that is short), offload free while the compute can hide it, and an honest "not covered".
#include "runtime/memory/planner.h"

#include <vector>

#include "gtest/gtest.h"

namespace furnace::memory {
namespace {

PlanCandidate Tensor(int64_t id, uint64_t bytes, int position) {
  PlanCandidate c;
  c.id = id;
  c.bytes = bytes;
  c.position = position;
  return c;
}

TEST(PlannerTest, NothingShortTakesNothing) {
  const Plan plan = CoverDeficits({Tensor(1, 100, 0)}, {}, {});
  EXPECT_TRUE(plan.choices.empty());
  EXPECT_TRUE(plan.covered);
}

TEST(PlannerTest, HiddenOffloadFirstThenRecomputeThenExposedOffload) {
  PlannerCosts costs;
  costs.link_bytes_per_second = 1000;  // out and back: 100 bytes show as 0.2 s
  costs.hidden_seconds = 0.2;          // hides 100 bytes of offload
  std::vector<PlanCandidate> c = {Tensor(1, 100, 0), Tensor(2, 100, 0), Tensor(3, 100, 0)};
  for (PlanCandidate& t : c) t.can_offload = true;
  c[2].can_recompute = true;
  c[2].recompute_seconds = 0.01;  // cheaper than showing 0.2 s of copy
  const Plan plan = CoverDeficits(c, {{5, 250}}, costs);
  ASSERT_EQ(plan.choices.size(), 3u);
  EXPECT_EQ(plan.choices[0].action, PlanAction::kOffload);  // hidden: free
  EXPECT_EQ(plan.choices[0].cost_seconds, 0);
  EXPECT_EQ(plan.choices[1].id, 3);
  EXPECT_EQ(plan.choices[1].action, PlanAction::kRecompute);
  EXPECT_EQ(plan.choices[2].action, PlanAction::kOffload);  // the copy time shows now
  EXPECT_NEAR(plan.choices[2].cost_seconds, 0.2, 1e-12);
  EXPECT_TRUE(plan.covered);
  EXPECT_EQ(plan.freed, 300u);
}

// Late reloads halve the compute the next plans count on hiding copies behind; micro-batches
// without one give it back an eighth at a time, up to all of it. With no share left, the same
// choice as above prices the offload at its copy time and takes the recompute first.
TEST(PlannerTest, LateReloadsShrinkTheHiddenShare) {
  double share = 1;
  share = NextHiddenShare(share, true);
  EXPECT_EQ(share, 0.5);
  share = NextHiddenShare(share, true);
  EXPECT_EQ(share, 0.25);
  for (int i = 0; i < 3; ++i) share = NextHiddenShare(share, false);
  EXPECT_EQ(share, 0.625);
  for (int i = 0; i < 8; ++i) share = NextHiddenShare(share, false);
  EXPECT_EQ(share, 1.0);
  for (int i = 0; i < 60; ++i) share = NextHiddenShare(share, true);
  EXPECT_GE(share, 0.0);
  EXPECT_LT(share, 1e-12);

  PlannerCosts costs;
  costs.link_bytes_per_second = 1000;
  costs.hidden_seconds = 0.2 * share;  // as GptMoe scales it
  std::vector<PlanCandidate> c = {Tensor(1, 100, 0), Tensor(3, 100, 0)};
  for (PlanCandidate& t : c) t.can_offload = true;
  c[1].can_recompute = true;
  c[1].recompute_seconds = 0.01;
  const Plan plan = CoverDeficits(c, {{5, 100}}, costs);
  ASSERT_EQ(plan.choices.size(), 1u);
  EXPECT_EQ(plan.choices[0].id, 3);
  EXPECT_EQ(plan.choices[0].action, PlanAction::kRecompute);
}

TEST(PlannerTest, CompressFreesOnlyWhatTheCodecSaves) {
  PlannerCosts costs;
  costs.cast_seconds_per_byte = 1e-6;
  PlanCandidate t = Tensor(1, 1000, 0);
  t.can_compress = true;
  t.compressed_fraction = 0.5;
  const Plan plan = CoverDeficits({t}, {{3, 400}}, costs);
  ASSERT_EQ(plan.choices.size(), 1u);
  EXPECT_EQ(plan.choices[0].action, PlanAction::kCompress);
  EXPECT_EQ(plan.choices[0].freed, 500u);
  EXPECT_TRUE(plan.covered);
  const Plan short_plan = CoverDeficits({t}, {{3, 600}}, costs);
  EXPECT_FALSE(short_plan.covered);
}

// A tensor saved at or after the point that is short does not help there (it is being made or is
// needed again), but does at later points; another micro-batch's (position -1) helps everywhere.
TEST(PlannerTest, ActionsHelpOnlyAfterTheirModule) {
  PlannerCosts costs;
  costs.link_bytes_per_second = 1e9;
  costs.hidden_seconds = 1;
  std::vector<PlanCandidate> c = {Tensor(1, 100, 4), Tensor(2, 50, -1), Tensor(3, 500, 6)};
  for (PlanCandidate& t : c) t.can_offload = true;
  // Point 4 lacks 40: only id 2 (position -1) helps there (id 1 is saved by module 4 itself).
  // Point 8 lacks 300: id 2's 50 counts there too, then the largest helpful, id 3.
  const Plan plan = CoverDeficits(c, {{8, 300}, {4, 40}}, costs);
  ASSERT_EQ(plan.choices.size(), 2u);
  EXPECT_EQ(plan.choices[0].id, 2);
  EXPECT_EQ(plan.choices[1].id, 3);
  EXPECT_TRUE(plan.covered);
  // Nothing before point 4 but id 2: a deficit of 60 there cannot be covered.
  const Plan stuck = CoverDeficits(c, {{4, 60}}, costs);
  EXPECT_FALSE(stuck.covered);
  ASSERT_EQ(stuck.choices.size(), 1u);
}

// A candidate helps only until it is needed again: at point 9 id 1 (needed back at 8) frees
// nothing, so the plan takes id 2.
TEST(PlannerTest, ActionsHelpOnlyUntilNeededAgain) {
  PlannerCosts costs;
  costs.link_bytes_per_second = 1e9;
  costs.hidden_seconds = 1;
  std::vector<PlanCandidate> c = {Tensor(1, 500, 2), Tensor(2, 100, 3)};
  for (PlanCandidate& t : c) t.can_offload = true;
  c[0].until = 8;
  const Plan plan = CoverDeficits(c, {{9, 100}}, costs);
  ASSERT_EQ(plan.choices.size(), 1u);
  EXPECT_EQ(plan.choices[0].id, 2);
  EXPECT_TRUE(plan.covered);
}

// A rebuild reads exact inputs. Recomputing the hidden tensor (the cheapest action) rules out
// compressing the tensor its rebuild reads: that one is offloaded instead. And compressing an
// input first rules out recomputing its reader. The stash refuses either pair (Stash::Compress,
// Stash::Drop), so a plan that took one would come up short.
TEST(PlannerTest, ARebuildsInputIsNeverCompressed) {
  PlannerCosts costs;
  costs.link_bytes_per_second = 1000;
  costs.cast_seconds_per_byte = 1e-5;  // compress 100 bytes: 1 ms for 50 freed
  PlanCandidate pre = Tensor(1, 100, 0);
  pre.can_compress = true;
  pre.compressed_fraction = 0.5;
  pre.can_offload = true;  // 0.2 s of copy that shows
  PlanCandidate hidden = Tensor(2, 100, 0);
  hidden.can_recompute = true;
  hidden.recompute_seconds = 1e-4;
  hidden.rebuild_inputs = {1};
  const Plan plan = CoverDeficits({pre, hidden}, {{5, 150}}, costs);
  ASSERT_EQ(plan.choices.size(), 2u);
  EXPECT_EQ(plan.choices[0].id, 2);
  EXPECT_EQ(plan.choices[0].action, PlanAction::kRecompute);
  EXPECT_EQ(plan.choices[1].id, 1);
  EXPECT_EQ(plan.choices[1].action, PlanAction::kOffload);  // not compress: hidden reads it
  EXPECT_TRUE(plan.covered);

  // Compress cheaper than the recompute, the recompute cheaper than the offload: the compress is
  // taken first, and then the reader may not be recomputed.
  hidden.recompute_seconds = 0.01;
  hidden.can_offload = true;
  const Plan other = CoverDeficits({pre, hidden}, {{5, 150}}, costs);
  ASSERT_EQ(other.choices.size(), 2u);
  EXPECT_EQ(other.choices[0].id, 1);
  EXPECT_EQ(other.choices[0].action, PlanAction::kCompress);
  EXPECT_EQ(other.choices[1].id, 2);
  EXPECT_EQ(other.choices[1].action, PlanAction::kOffload);
  EXPECT_TRUE(other.covered);

  // Nothing else possible: not covered, rather than a plan the stash would refuse half of.
  pre.can_offload = false;
  hidden.recompute_seconds = 1e-4;
  const Plan stuck = CoverDeficits({pre, hidden}, {{5, 150}}, costs);
  ASSERT_EQ(stuck.choices.size(), 1u);
  EXPECT_EQ(stuck.choices[0].action, PlanAction::kRecompute);
  EXPECT_FALSE(stuck.covered);
}

TEST(PlannerTest, NoActionAllowedMeansNotCovered) {
  const Plan plan = CoverDeficits({Tensor(1, 100, 0)}, {{2, 10}}, {});
  EXPECT_TRUE(plan.choices.empty());
  EXPECT_FALSE(plan.covered);
  EXPECT_EQ(PlanSummary(plan), "nothing");
}

}  // namespace
}  // namespace furnace::memory
