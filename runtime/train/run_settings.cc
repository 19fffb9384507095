#include "runtime/train/run_settings.h"

#include <algorithm>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "runtime/base/decimal.h"

namespace furnace::train {
std::map<std::string, std::string> RecordedSettings(const LrSchedule& schedule,
                                                    const AdamWConfig& adamw, double clip) {
  const bool cosine = schedule.kind == LrSchedule::Kind::kCosine;
  std::map<std::string, std::string> out = {
      {"train.schedule", cosine ? "cosine" : "constant"},
      {"train.lr", ShortestDecimal(schedule.lr)},
      {"train.warmup", absl::StrCat(schedule.warmup_steps)},
      {"train.weight_decay", ShortestDecimal(adamw.weight_decay)},
      {"train.clip", ShortestDecimal(clip)},
  };
  if (cosine) {
    out["train.min_lr"] = ShortestDecimal(schedule.min_lr.value_or(0.1 * schedule.lr));
    out["train.steps"] = absl::StrCat(schedule.max_steps);
  }
  return out;
}

std::vector<SettingChange> ChangedSettings(const std::map<std::string, std::string>& checkpoint,
                                           const std::map<std::string, std::string>& now,
                                           int64_t from_step) {
  const auto value = [](const std::map<std::string, std::string>& m, const std::string& field) {
    const auto it = m.find(field);
    return it == m.end() ? std::string() : it->second;
  };
  const bool constant = value(checkpoint, "train.schedule") == "constant" &&
                        value(now, "train.schedule") == "constant";
  std::vector<SettingChange> changes;
  for (const auto& [field, was] : checkpoint) {
    const auto it = now.find(field);
    if (it == now.end() || it->second == was) continue;
    int64_t warmup_was = 0, warmup_now = 0;
    if (constant && field == "train.warmup" && absl::SimpleAtoi(was, &warmup_was) &&
        absl::SimpleAtoi(it->second, &warmup_now) &&
        from_step >= std::max(warmup_was, warmup_now)) {
      continue;  // past both: the same rate
    }
    changes.push_back({field, was, it->second});
  }
  return changes;
}

std::string DescribeChanges(const std::vector<SettingChange>& changes) {
  return absl::StrJoin(changes, ", ", [](std::string* out, const SettingChange& c) {
    // Six significant digits (a default min_lr of 0.1 * 3e-4 is 2.9999999999999997e-05 exactly),
    // unless both values read the same in them.
    double was = 0, now = 0;
    int64_t whole = 0;
    std::string was_text = c.checkpoint, now_text = c.now;
    const bool integers =
        absl::SimpleAtoi(c.checkpoint, &whole) && absl::SimpleAtoi(c.now, &whole);  // as they are
    if (!integers && absl::SimpleAtod(c.checkpoint, &was) && absl::SimpleAtod(c.now, &now)) {
      const std::string a = absl::StrFormat("%.6g", was), b = absl::StrFormat("%.6g", now);
      if (a != b) {
        was_text = a;
        now_text = b;
      }
    }
    absl::StrAppend(out, c.field, " ", was_text, " -> ", now_text);
  });
}

}  // namespace furnace::train
