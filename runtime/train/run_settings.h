// The settings a checkpoint records that steer the run after it: the optimizer's (learning-rate
// schedule, weight decay, clipping), by job-spec field name. A resume compares them with this
// run's: a run resubmitted with another train.lr, a cosine schedule over other train.steps, or
// another clip would otherwise continue with a jump in its update rule that no log mentions
// (Megatron-LM refuses the same by default, unless told to override the checkpoint's schedule).
#pragma once

#include <map>
#include <string>
#include <vector>

#include "runtime/train/lr_schedule.h"
#include "runtime/train/optimizer_step.h"

namespace furnace::train {

// Field -> value as text: the shortest decimal that reads back as the same double, so equal
// texts are equal values. train.min_lr and train.steps only under a cosine schedule (a constant
// one reads neither).
std::map<std::string, std::string> RecordedSettings(const LrSchedule& schedule,
                                                    const AdamWConfig& adamw, double clip);

struct SettingChange {
  std::string field;
  std::string checkpoint;  // its value when the checkpoint was written
  std::string now;         // this run's
};

// The fields recorded by both whose values differ, in field order, for a run resumed at step
// `from_step` (steps done). A field only one records (an older checkpoint's) is not compared, nor
// a constant schedule's warmup that both runs are past (under a cosine the warmup also shifts the
// decay's phase, so it always counts).
std::vector<SettingChange> ChangedSettings(const std::map<std::string, std::string>& checkpoint,
                                           const std::map<std::string, std::string>& now,
                                           int64_t from_step);

// "train.lr 0.0003 -> 0.0001, train.clip 1 -> 0.5".
std::string DescribeChanges(const std::vector<SettingChange>& changes);

}  // namespace furnace::train
