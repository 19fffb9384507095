#include "runtime/train/run_settings.h"

#include <map>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/model/config.h"

namespace furnace::train {
namespace {

using ::testing::Pair;
using ::testing::UnorderedElementsAre;

TEST(RunSettingsTest, ACosineScheduleRecordsItsFloorAndHorizonAConstantOneNeither) {
  const LrSchedule cosine{
      .kind = LrSchedule::Kind::kCosine, .lr = 3e-4, .warmup_steps = 10, .max_steps = 1000};
  EXPECT_THAT(RecordedSettings(cosine, {.weight_decay = 0.1}, 1.0),
              UnorderedElementsAre(Pair("train.schedule", "cosine"), Pair("train.lr", "3e-04"),
                                   Pair("train.min_lr", "2.9999999999999997e-05"),
                                   Pair("train.warmup", "10"), Pair("train.steps", "1000"),
                                   Pair("train.weight_decay", "0.1"), Pair("train.clip", "1")));
  LrSchedule constant = cosine;
  constant.kind = LrSchedule::Kind::kConstant;
  constant.min_lr = 1e-5;
  EXPECT_THAT(RecordedSettings(constant, {.weight_decay = 0}, 0.0),
              UnorderedElementsAre(Pair("train.schedule", "constant"), Pair("train.lr", "3e-04"),
                                   Pair("train.warmup", "10"), Pair("train.weight_decay", "0"),
                                   Pair("train.clip", "0")));
}

// The model's own: what its tensors' shapes do not say, by job-spec field.
TEST(RunSettingsTest, AModelRecordsWhatItsShapesDoNotSay) {
  model::ModelConfig m;
  m.heads = 4;
  m.top_k = 2;
  m.capacity_factor = 1.25;
  m.normalize_topk = false;
  m.aux_alpha = 0.01;
  m.spikes.probability = 0.5;  // a test's injection: not recorded
  EXPECT_THAT(
      m.RecordedSettings(),
      UnorderedElementsAre(Pair("model.heads", "4"), Pair("moe.top_k", "2"),
                           Pair("moe.capacity_factor", "1.25"), Pair("moe.normalize_topk", "false"),
                           Pair("moe.aux_alpha", "0.01")));
}

TEST(RunSettingsTest, OnlyFieldsBothRecordAreComparedAndEachDifferenceIsSaid) {
  const std::map<std::string, std::string> checkpoint = {{"train.lr", "0.0003"},
                                                         {"train.min_lr", "2.9999999999999997e-05"},
                                                         {"train.schedule", "cosine"},
                                                         {"train.steps", "100"}};
  const std::map<std::string, std::string> now = {{"train.lr", "0.0003"},
                                                  {"train.min_lr", "1e-05"},
                                                  {"train.schedule", "constant"},
                                                  {"train.clip", "1"}};
  const std::vector<SettingChange> changes = ChangedSettings(checkpoint, now, /*from_step=*/0);
  ASSERT_EQ(changes.size(), 2u);
  EXPECT_EQ(changes[0].field, "train.min_lr");
  EXPECT_EQ(changes[0].checkpoint, "2.9999999999999997e-05");
  EXPECT_EQ(DescribeChanges(changes),
            "train.min_lr 3e-05 -> 1e-05, train.schedule cosine -> constant");
  // Values that differ beyond six digits are shown whole.
  EXPECT_EQ(DescribeChanges({{"train.lr", "0.1", "0.10000001"}}), "train.lr 0.1 -> 0.10000001");
  // Whole numbers as they are (not 1e+06).
  EXPECT_EQ(DescribeChanges({{"train.steps", "1000000", "2000000"}}),
            "train.steps 1000000 -> 2000000");
  EXPECT_TRUE(ChangedSettings({}, now, /*from_step=*/0).empty());  // a checkpoint that records none
}

}  // namespace
}  // namespace furnace::train
