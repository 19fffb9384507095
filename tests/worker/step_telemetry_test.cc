// What a rank's worker makes of the MoE side of a step (worker/step_telemetry.h): each MoE layer's
// schedule by name, the baseline where the runtime names none, and the schedules' op totals as the
// runtime reported them.
#include "worker/step_telemetry.h"

#include <gtest/gtest.h>

#include "furnace/v1/telemetry.pb.h"
#include "runtime/train/trainer.h"

namespace furnace::worker {
namespace {

namespace v1 = furnace::v1;

TEST(StepTelemetryTest, ScheduleNamesMapToTheEnum) {
  EXPECT_EQ(MoeLayerScheduleOf("deepspeed"), v1::MOE_LAYER_SCHEDULE_DEEPSPEED);
  EXPECT_EQ(MoeLayerScheduleOf("s1"), v1::MOE_LAYER_SCHEDULE_S1);
  EXPECT_EQ(MoeLayerScheduleOf("s2"), v1::MOE_LAYER_SCHEDULE_S2);
  EXPECT_EQ(MoeLayerScheduleOf("auto"), v1::MOE_LAYER_SCHEDULE_UNSPECIFIED);  // never run as such
  EXPECT_EQ(MoeLayerScheduleOf(""), v1::MOE_LAYER_SCHEDULE_UNSPECIFIED);
}

TEST(StepTelemetryTest, EachMoeLayerCarriesItsScheduleAndMissingOnesAreDeepspeed) {
  train::StepStats s;
  s.imbalance = {1.0, 1.5, 2.0};
  s.moe_schedules = {"s2", "s1"};  // the third layer unnamed
  const v1::StepTelemetry t = StepTelemetryOf(s, {.reporter = true});
  ASSERT_EQ(t.moe_layers_size(), 3);
  EXPECT_EQ(t.moe_layers(0).schedule(), v1::MOE_LAYER_SCHEDULE_S2);
  EXPECT_EQ(t.moe_layers(1).schedule(), v1::MOE_LAYER_SCHEDULE_S1);
  EXPECT_EQ(t.moe_layers(2).schedule(), v1::MOE_LAYER_SCHEDULE_DEEPSPEED);
  EXPECT_EQ(t.moe_ops_size(), 0);
}

TEST(StepTelemetryTest, MoeOpsAreCopiedInTheRuntimesOrderOnEveryRank) {
  train::StepStats s;
  s.imbalance = {1.0};
  s.moe_schedules = {"s2"};
  s.moe_ops = {{.op = "fused(a2a ep, ag esp)", .bytes = 4096, .calls = 2, .seconds = 0.5},
               {.op = "fused(a2a ep, ag tp)", .bytes = 1024, .calls = 2, .seconds = 0.25},
               {.op = "counts(ep)", .bytes = 64, .calls = 1, .seconds = 0.125}};
  for (bool reporter : {true, false}) {
    const v1::StepTelemetry t = StepTelemetryOf(s, {.reporter = reporter});
    ASSERT_EQ(t.moe_ops_size(), 3);
    EXPECT_EQ(t.moe_ops(0).op(), "fused(a2a ep, ag esp)");
    EXPECT_EQ(t.moe_ops(0).bytes(), 4096u);
    EXPECT_EQ(t.moe_ops(0).calls(), 2u);
    EXPECT_DOUBLE_EQ(t.moe_ops(0).seconds(), 0.5);
    EXPECT_EQ(t.moe_ops(1).op(), "fused(a2a ep, ag tp)");
    EXPECT_EQ(t.moe_ops(2).op(), "counts(ep)");
    EXPECT_EQ(t.moe_ops(2).bytes(), 64u);
  }
}

TEST(StepTelemetryTest, CheckpointTimesAreCopied) {
  train::StepStats s;
  s.checkpoint_seconds = 0.5;
  s.checkpoint_stall_seconds = 0.125;
  s.checkpoint_error = "disk full";
  const v1::StepTelemetry t = StepTelemetryOf(s, {.reporter = false});
  EXPECT_DOUBLE_EQ(t.checkpoint_seconds(), 0.5);
  EXPECT_DOUBLE_EQ(t.checkpoint_stall_seconds(), 0.125);
  EXPECT_EQ(t.checkpoint_error(), "disk full");
}

// The memory planner's step, as every rank reports it (the controller sums or takes the max).
TEST(StepTelemetryTest, ThePlannersActionsAndAgreementsAreCopiedOnEveryRank) {
  train::StepStats s;
  s.memory_actions = {.recomputed_bytes = 4096,
                      .offloaded_bytes = 1024,
                      .late_reloads = 1,
                      .planner_seconds = 0.25,
                      .planner_decisions = 3,
                      .emergency_offloads = 2,
                      .agreements = 4,
                      .agreed_drops = 5,
                      .agreement_seconds = 0.125};
  for (bool reporter : {true, false}) {
    const v1::StepTelemetry t = StepTelemetryOf(s, {.reporter = reporter});
    EXPECT_EQ(t.memory().late_reloads(), 1u);
    EXPECT_DOUBLE_EQ(t.memory().planner_seconds(), 0.25);
    EXPECT_EQ(t.memory().planner_decisions(), 3u);
    EXPECT_EQ(t.memory().emergency_offloads(), 2u);
    EXPECT_EQ(t.memory().agreements(), 4u);
    EXPECT_EQ(t.memory().agreed_drops(), 5u);
    EXPECT_DOUBLE_EQ(t.memory().agreement_seconds(), 0.125);
    ASSERT_EQ(t.planner_size(), 2);  // compress moved nothing: not listed
    EXPECT_EQ(t.planner(0).action(), v1::PLANNER_ACTION_OFFLOAD);
    EXPECT_EQ(t.planner(0).bytes(), 1024u);
    EXPECT_EQ(t.planner(1).action(), v1::PLANNER_ACTION_RECOMPUTE);
    EXPECT_EQ(t.planner(1).bytes(), 4096u);
  }
}

}  // namespace
}  // namespace furnace::worker
