// The per-rank memory model and the adaptive policy on parallel layouts (one forked process per
// rank, Gloo), under routing spikes:
//   - MemoryModel: each rank's predicted peak for the rows its MoE layers actually had equals the
//     arena's measured peak byte for byte on single-stage layouts (EP, EP with ESP, TP) under the
//     policies none and full_recompute, and bounds it within 10% on a 1F1B pipeline (the others
//     in flight are counted at their declared saved bytes);
//   - Adaptive: with a budget at 90% of the largest peak of the run, policy none runs out of
//   memory,
//     while adaptive trains bit-identically to the unlimited run on the same layout, keeps every
//     rank's peak under the budget, acts on no step that fits (single stage) and needs no
//     emergency offload (single stage), on EP, EP with ESP and a 1F1B pipeline.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/runtime/parallel/layout_checks.h"

namespace furnace::testing {
namespace {

LayoutCase SpikeCase(const Layout& l) {
  model::ModelConfig model = TinyLayoutModel(/*top_k=*/2, /*capacity_factor=*/0);  // dropless
  model.spikes.probability = 0.5;
  model.spikes.max_ratio = 2.0;  // E / k
  model.spikes.seed = 164;
  return CaseOn(l, model, /*steps=*/5);
}

// schedule: moe.schedule (the Parm schedules allocate their own exchange buffers: s1 a slice of
// the tokens and the gathered residual, s2 the split rows and the staging of every peer's rows).
void CheckMemoryModel(const Layout& l, const std::string& schedule) {
  for (memory::MemoryPolicy policy :
       {memory::MemoryPolicy::kNone, memory::MemoryPolicy::kFullRecompute}) {
    LayoutCase c = SpikeCase(l);
    c.policy = policy;
    c.schedule = schedule;
    absl::StatusOr<RunResult> r = RunLayoutInTempDir(
        c, absl::StrCat("model-", l.name, "-", schedule, "-", MemoryPolicyName(policy)));
    ASSERT_TRUE(r.ok()) << r.status();
    double worst = 0;
    for (int rank = 0; rank < c.sizes.world(); ++rank) {
      for (int s = 0; s < c.steps; ++s) {
        const int64_t got = r->activation_peak[rank][s];
        const int64_t want = r->predicted_peak[rank][s];
        ASSERT_GT(got, 0);
        if (l.pp == 1) {
          EXPECT_EQ(want, got) << l.name << " " << MemoryPolicyName(policy) << " rank " << rank
                               << " step " << s;
        } else {
          EXPECT_GE(want, got) << "rank " << rank << " step " << s;
          EXPECT_LE(want, got * 1.10) << "rank " << rank << " step " << s;
        }
        worst = std::max(worst, static_cast<double>(want - got) / got);
      }
    }
    std::printf("REPORT memory model %s %s %s: predicted - measured <= %.2f%% of measured\n",
                l.name, schedule.c_str(), MemoryPolicyName(policy), 100 * worst);
  }
}

class MemoryModelTest : public ::testing::TestWithParam<Layout> {};

TEST_P(MemoryModelTest, PredictedPeakMatchesTheArena) { CheckMemoryModel(GetParam(), "deepspeed"); }

class ScheduleMemoryModelTest : public ::testing::TestWithParam<std::tuple<Layout, const char*>> {};

TEST_P(ScheduleMemoryModelTest, PredictedPeakMatchesTheArena) {
  CheckMemoryModel(std::get<0>(GetParam()), std::get<1>(GetParam()));
}

const Layout kModelLayouts[] = {
    {"ep4", 1, 4, 1, 4, 1, 2},
    {"ep2_esp2", 1, 4, 1, 2, 2, 2},
    {"tp2_ep2", 1, 2, 2, 2, 1, 2},
    {"pp2_ep2_m4", 2, 2, 1, 2, 1, 4},
};
INSTANTIATE_TEST_SUITE_P(Layouts, MemoryModelTest, ::testing::ValuesIn(kModelLayouts),
                         [](const auto& info) { return std::string(info.param.name); });

const Layout kScheduleModelLayouts[] = {
    {"tp2_ep2", 1, 2, 2, 2, 1, 2},
    {"tp2_esp2", 1, 1, 2, 1, 2, 2},
    {"tp4_ep2_esp2", 1, 1, 4, 2, 2, 2},
};
INSTANTIATE_TEST_SUITE_P(Schedules, ScheduleMemoryModelTest,
                         ::testing::Combine(::testing::ValuesIn(kScheduleModelLayouts),
                                            ::testing::Values("s1", "s2")),
                         [](const auto& info) {
                           return absl::StrCat(std::get<0>(info.param).name, "_",
                                               std::get<1>(info.param));
                         });

class AdaptiveLayoutTest : public ::testing::TestWithParam<Layout> {};

TEST_P(AdaptiveLayoutTest, SpikesFitUnderTheBudgetBitIdentically) {
  const Layout& l = GetParam();
  // Expert buffers large beside the rest, and spikes well above the natural imbalance.
  auto make = [&l] {
    LayoutCase c = SpikeCase(l);
    c.model.experts = 8;
    c.model.expert_ffn = 64;
    c.model.spikes.max_ratio = 3.5;  // of E / k = 4
    c.micro_batch = 4;
    c.steps = 6;
    return c;
  };
  LayoutCase c = make();
  const std::string tag = absl::StrCat("adaptive-", l.name, "-");
  absl::StatusOr<RunResult> free_run = RunLayoutInTempDir(c, tag + "unlimited");
  ASSERT_TRUE(free_run.ok()) << free_run.status();
  // The budget: 90% of the largest peak on any rank and step, so the largest ones do not fit.
  int64_t top = 0;
  for (const std::vector<int64_t>& rank : free_run->activation_peak) {
    for (int64_t p : rank) top = std::max(top, p);
  }
  const auto budget = static_cast<uint64_t>(0.9 * top);
  c.device_budget = budget;

  // Policy none runs out of memory: the rank whose peak exceeds the budget exits with
  // kRankResourceExhausted; its peers may fail otherwise (a collective with a rank that left), so
  // only some rank's exit is checked.
  absl::StatusOr<RunResult> none = RunLayoutInTempDir(c, tag + "none");
  EXPECT_FALSE(none.ok()) << "policy none fits the spikes at " << budget << " bytes";
  EXPECT_NE(none.status().message().find(absl::StrCat("exited with ", kRankResourceExhausted)),
            absl::string_view::npos)
      << "no rank ran out of memory: " << none.status();

  c.policy = memory::MemoryPolicy::kAdaptive;
  absl::StatusOr<RunResult> adaptive = RunLayoutInTempDir(c, tag + "adaptive");
  ASSERT_TRUE(adaptive.ok()) << adaptive.status();
  ExpectBitIdentical(*adaptive, *free_run);
  int64_t decisions = 0, emergencies = 0, peak = 0;
  for (int rank = 0; rank < c.sizes.world(); ++rank) {
    for (int s = 0; s < c.steps; ++s) {
      EXPECT_LE(adaptive->activation_peak[rank][s], static_cast<int64_t>(budget));
      peak = std::max(peak, adaptive->activation_peak[rank][s]);
      // A step that fits takes no action: on a single stage the projection is exact once the
      // last MoE layer is routed, and optimistic before. (1F1B adds the reservation for the
      // micro-batches not started, an upper bound.)
      if (l.pp == 1 && free_run->activation_peak[rank][s] <= static_cast<int64_t>(0.98 * budget)) {
        EXPECT_EQ(adaptive->planner_decisions[rank][s], 0)
            << "rank " << rank << " step " << s << ": unlimited peak "
            << free_run->activation_peak[rank][s] << ", budget " << budget;
        EXPECT_EQ(adaptive->activation_peak[rank][s], free_run->activation_peak[rank][s]);
      }
      decisions += adaptive->planner_decisions[rank][s];
      emergencies += adaptive->emergency_offloads[rank][s];
    }
  }
  EXPECT_GT(decisions, 0);
  // On a single stage the projection is exact once the last MoE layer is routed: the emergency
  // path never runs. (On a 1F1B stage it is the net under the in-flight estimates.)
  if (l.pp == 1) {
    EXPECT_EQ(emergencies, 0);
  }
  std::printf(
      "REPORT adaptive %s under spikes: unlimited peak %lld B, budget %llu B; "
      "none fails, adaptive peak %lld B with %lld decisions and %lld emergency offloads\n",
      l.name, static_cast<long long>(top), static_cast<unsigned long long>(budget),
      static_cast<long long>(peak), static_cast<long long>(decisions),
      static_cast<long long>(emergencies));
}

// The most rows routing can send a rank are bounded, and so is what a step can need
// (GptMoe::RoutingBoundActivationBytes): with a capacity, by each expert's capacity; dropless, by
// every token of every source routed to this rank's experts. At that budget, under spikes that
// push the busiest experts past their capacity (or, dropless, as far from balanced as they go),
// adaptive trains every step as the unlimited run does, bit for bit: the layer's own tensors fit,
// and the planner moves the rest.
class AdaptiveBoundTest : public ::testing::TestWithParam<std::tuple<Layout, double>> {};

TEST_P(AdaptiveBoundTest, AtTheRoutingBoundAnyRoutingTrains) {
  const Layout& l = std::get<0>(GetParam());
  const double capacity_factor = std::get<1>(GetParam());
  LayoutCase c = SpikeCase(l);
  c.model.capacity_factor = capacity_factor;
  c.model.experts = 8;
  c.model.expert_ffn = 64;
  c.model.spikes.probability = 1.0;
  c.model.spikes.max_ratio = capacity_factor > 0 ? 3.5 : 4.0;  // of E / k = 4
  c.micro_batch = 4;
  c.steps = 4;
  const std::string tag = absl::StrCat("adaptive-bound-", l.name, "-", capacity_factor, "-");
  absl::StatusOr<RunResult> free_run = RunLayoutInTempDir(c, tag + "unlimited");
  ASSERT_TRUE(free_run.ok()) << free_run.status();
  c.policy = memory::MemoryPolicy::kAdaptive;
  c.budget_at_routing_bound = true;
  absl::StatusOr<RunResult> adaptive = RunLayoutInTempDir(c, tag + "adaptive");
  ASSERT_TRUE(adaptive.ok()) << adaptive.status();
  ExpectBitIdentical(*adaptive, *free_run);
  int64_t decisions = 0, top = 0, free_top = 0;
  for (int rank = 0; rank < c.sizes.world(); ++rank) {
    for (int s = 0; s < c.steps; ++s) {
      decisions += adaptive->planner_decisions[rank][s] + adaptive->emergency_offloads[rank][s];
      top = std::max(top, adaptive->activation_peak[rank][s]);
      free_top = std::max(free_top, free_run->activation_peak[rank][s]);
    }
  }
  EXPECT_GT(decisions, 0) << "the bound is not binding: the test shows nothing";
  std::printf(
      "REPORT adaptive %s %s at the routing bound: unlimited peak %lld B, adaptive %lld B, "
      "%lld actions\n",
      l.name, capacity_factor > 0 ? "capacity 1.25" : "dropless", static_cast<long long>(free_top),
      static_cast<long long>(top), static_cast<long long>(decisions));
}

INSTANTIATE_TEST_SUITE_P(Layouts, AdaptiveBoundTest,
                         ::testing::Combine(::testing::Values(Layout{"ep4", 1, 4, 1, 4, 1, 2},
                                                              Layout{"ep2_esp2", 1, 4, 1, 2, 2, 2}),
                                            ::testing::Values(1.25, 0.0)),
                         [](const auto& info) {
                           return absl::StrCat(
                               std::get<0>(info.param).name,
                               std::get<1>(info.param) > 0 ? "_capacity" : "_dropless");
                         });

const Layout kAdaptiveLayouts[] = {
    {"ep4", 1, 4, 1, 4, 1, 2},
    {"ep2_esp2", 1, 4, 1, 2, 2, 2},
    {"pp2_ep2_m4", 2, 2, 1, 2, 1, 4},
    {"pp4_m8", 4, 1, 1, 1, 1, 8},
};
INSTANTIATE_TEST_SUITE_P(Layouts, AdaptiveLayoutTest, ::testing::ValuesIn(kAdaptiveLayouts),
                         [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace furnace::testing
