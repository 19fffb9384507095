#include "runtime/train/optimizer_step.h"

#include <cmath>
#include <numbers>

#include "gtest/gtest.h"
#include "runtime/train/lr_schedule.h"

namespace furnace::train {
namespace {

TEST(LrScheduleTest, WarmupThenCosineToMinLr) {
  LrSchedule s{.kind = LrSchedule::Kind::kCosine,
               .lr = 1.0,
               .min_lr = std::nullopt,
               .warmup_steps = 10,
               .max_steps = 110};
  EXPECT_DOUBLE_EQ(s.At(0), 0.1);
  EXPECT_DOUBLE_EQ(s.At(4), 0.5);
  EXPECT_DOUBLE_EQ(s.At(9), 1.0);
  EXPECT_DOUBLE_EQ(s.At(10), 1.0);                // cosine starts at lr
  EXPECT_NEAR(s.At(60), 0.1 + 0.9 * 0.5, 1e-15);  // halfway: midpoint; min_lr = 0.1 * lr
  EXPECT_NEAR(s.At(35), 0.1 + 0.45 * (1 + std::cos(std::numbers::pi / 4)), 1e-15);
  EXPECT_NEAR(s.At(110), 0.1, 1e-15);
  EXPECT_NEAR(s.At(500), 0.1, 1e-15);  // held after max_steps
  s.min_lr = 0.0;
  EXPECT_NEAR(s.At(110), 0.0, 1e-15);
  EXPECT_TRUE(s.Validate().ok());
}

TEST(LrScheduleTest, ConstantWithAndWithoutWarmup) {
  LrSchedule s{.kind = LrSchedule::Kind::kConstant, .lr = 0.5, .warmup_steps = 0};
  EXPECT_DOUBLE_EQ(s.At(0), 0.5);
  EXPECT_DOUBLE_EQ(s.At(1000), 0.5);
  s.warmup_steps = 4;
  EXPECT_DOUBLE_EQ(s.At(1), 0.25);
  EXPECT_DOUBLE_EQ(s.At(4), 0.5);
}

TEST(LrScheduleTest, ValidateRejectsBadValues) {
  EXPECT_FALSE((LrSchedule{.lr = -1}).Validate().ok());
  EXPECT_FALSE((LrSchedule{.lr = 1, .min_lr = 2}).Validate().ok());
  EXPECT_FALSE((LrSchedule{.lr = 1, .warmup_steps = 10, .max_steps = 5}).Validate().ok());
}

TEST(ClipTest, ScalesOnlyAboveTheThresholdAndReportsPreClipNorm) {
  std::vector<float> g = {3, 4};  // norm 5
  EXPECT_DOUBLE_EQ(ClipGradNorm(g.data(), 2, 1.0), 5.0);
  EXPECT_NEAR(std::hypot(g[0], g[1]), 1.0, 1e-6);
  EXPECT_NEAR(g[0] / g[1], 0.75, 1e-6);

  std::vector<float> small = {0.3f, 0.4f};  // norm 0.5: untouched
  EXPECT_NEAR(ClipGradNorm(small.data(), 2, 1.0), 0.5, 1e-7);
  EXPECT_EQ(small[0], 0.3f);
  EXPECT_EQ(small[1], 0.4f);

  std::vector<float> off = {30, 40};  // clip 0 = off
  EXPECT_DOUBLE_EQ(ClipGradNorm(off.data(), 2, 0.0), 50.0);
  EXPECT_EQ(off[0], 30.0f);
}

TEST(ClipTest, NormIsOverTheWholeArray) {
  std::vector<float> g(1000, 1.0f);
  EXPECT_NEAR(GlobalNorm(g.data(), 1000), std::sqrt(1000.0), 1e-9);
}

TEST(AdamWTest, WeightDecayOnlyWhereMarked) {
  // Two parameters, zero gradient: Adam's moment term is 0, so the only change is the decay.
  std::vector<ParamInfo> params = {
      {.name = "w", .shape = {2, 2}, .offset = 0, .weight_decay = true},
      {.name = "b", .shape = {2}, .offset = 4, .weight_decay = false}};
  std::vector<float> p = {1, 2, 3, 4, 5, 6};
  std::vector<float> g(6, 0.0f);
  AdamW opt({.weight_decay = 0.1}, 6);
  opt.Update(params, p.data(), g.data(), /*lr=*/0.5, /*step=*/1);
  for (int i = 0; i < 4; ++i) EXPECT_FLOAT_EQ(p[i], (i + 1) * (1 - 0.5f * 0.1f));
  EXPECT_EQ(p[4], 5.0f);
  EXPECT_EQ(p[5], 6.0f);
}

TEST(AdamWTest, FirstStepMovesByLrTimesSignOfGradient) {
  // Bias-corrected first step: mhat / sqrt(vhat) = g / |g|.
  std::vector<ParamInfo> params = {{.name = "b", .shape = {3}, .offset = 0}};
  std::vector<float> p = {0, 0, 0};
  std::vector<float> g = {2, -0.5f, 0};
  AdamW opt({}, 3);
  opt.Update(params, p.data(), g.data(), 0.01, 1);
  EXPECT_NEAR(p[0], -0.01, 1e-7);
  EXPECT_NEAR(p[1], 0.01, 1e-7);
  EXPECT_EQ(p[2], 0.0f);
  EXPECT_NEAR(opt.m()[0], 0.2, 1e-7);  // (1 - beta1) * g
  EXPECT_NEAR(opt.v()[0], 0.2, 1e-6);  // (1 - beta2) * g^2 = 0.05 * 4
}

}  // namespace
}  // namespace furnace::train
