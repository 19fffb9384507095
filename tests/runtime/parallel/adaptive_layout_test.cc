// The per-rank memory model and the adaptive policy on parallel layouts (one forked process per
// rank, Gloo), under routing spikes:
//   - MemoryModel: each rank's predicted peak for the rows its MoE layers actually had equals the
//     arena's measured peak byte for byte on single-stage layouts (EP, EP with ESP, TP) under the
//     policies none and full_recompute, and bounds it within 10% on a 1F1B pipeline (the others
//     in flight are counted at their declared saved bytes);
//   - Adaptive: with a budget at 90% of the largest peak of the run, policy none runs out of
//     memory, while adaptive trains bit-identically to the unlimited run on the same layout, keeps
//     every rank's peak under the budget, acts on no step that fits (single stage) and needs no
//     emergency offload (single stage), on EP, EP with ESP, TP with EP and a 1F1B pipeline;
//   - AgreedDrop (attention probabilities recomputed, model.attention_probs: kept, a rank would
//     drop them alone first): without offload, at 2% above full_recompute's peak, adaptive's
//     per-rank drops run out of memory and its agreed drops of the expert buffers train
//     bit-identically (EP, EP with ESP, TP with EP under s1 and s2, and EP with ESP on the emulated
//     device with stream communicators); with a slow offload link, offloads and agreed drops
//     together train bit-identically too. The ranks agree on the first step and after a step some
//     rank ran short (checked step by step in Adaptive).
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

// A run that must run out of memory: it failed (`fits` says what a success would mean), and some
// rank exited with kRankResourceExhausted; its peers may fail otherwise (a collective with a rank
// that left), so only some rank's exit is checked.
void ExpectRanOutOfMemory(const absl::StatusOr<RunResult>& run, const std::string& fits) {
  EXPECT_FALSE(run.ok()) << fits;
  EXPECT_NE(run.status().message().find(absl::StrCat("exited with ", kRankResourceExhausted)),
            absl::string_view::npos)
      << "no rank ran out of memory: " << run.status();
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

  // Policy none runs out of memory: the rank whose peak exceeds the budget.
  ExpectRanOutOfMemory(RunLayoutInTempDir(c, tag + "none"),
                       absl::StrCat("policy none fits the spikes at ", budget, " bytes"));

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
      // micro-batches not started, an upper bound.) A rank that fits still drops what the ranks
      // agreed to drop for another that does not: its peak is the unlimited one only on a step
      // every rank fits.
      const auto fits = [&](int r) {
        return free_run->activation_peak[r][s] <= static_cast<int64_t>(0.98 * budget);
      };
      if (l.pp == 1 && fits(rank)) {
        EXPECT_EQ(adaptive->planner_decisions[rank][s], 0)
            << "rank " << rank << " step " << s << ": unlimited peak "
            << free_run->activation_peak[rank][s] << ", budget " << budget;
        bool all_fit = true;
        for (int r = 0; r < c.sizes.world(); ++r) all_fit = all_fit && fits(r);
        if (all_fit) {
          EXPECT_EQ(adaptive->activation_peak[rank][s], free_run->activation_peak[rank][s]);
        }
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
  // The ranks agree on collective drops (once per micro-batch, every rank) on the first step and
  // on the steps after one in which some rank's memory ran short (a plan was made, or the
  // emergency path ran); never on a pipeline. Deficits are byte-exact projections: this holds
  // whatever the plans chose.
  for (int s = 0; s < c.steps; ++s) {
    bool short_before = s == 0;
    for (int rank = 0; rank < c.sizes.world() && s > 0; ++rank) {
      short_before = short_before || adaptive->planner_decisions[rank][s - 1] > 0 ||
                     adaptive->emergency_offloads[rank][s - 1] > 0;
    }
    for (int rank = 0; rank < c.sizes.world(); ++rank) {
      const int64_t want = l.pp == 1 && short_before ? c.micro_batches : 0;
      EXPECT_EQ(adaptive->agreements[rank][s], want) << "rank " << rank << " step " << s;
    }
  }
  std::printf(
      "REPORT adaptive %s under spikes: unlimited peak %lld B, budget %llu B; "
      "none fails, adaptive peak %lld B with %lld decisions and %lld emergency offloads\n",
      l.name, static_cast<long long>(top), static_cast<unsigned long long>(budget),
      static_cast<long long>(peak), static_cast<long long>(decisions),
      static_cast<long long>(emergencies));
}

// Below the per-rank floor. Without offload, a rank's own plan drops only what it rebuilds alone;
// the expert input and the combined output come back only through the all-to-all, on every rank
// of the group at once. At a budget per-rank drops do not fit, adaptive without an agreement runs
// out of memory; with one (the world as its drop group, as a worker runs it) the ranks drop those
// buffers together where any rank needs it, and train bit-identically to the unlimited run under
// every rank's budget. That budget is searched for: from 2% above full_recompute's peak down in
// steps of 4% of it, the first at which per-rank drops run out of memory. (Per rank a plan also
// drops what full_recompute keeps, qkv and the dense MLP's pre-activation, so the per-rank floor
// lies below full_recompute's peak, by how much depending on the layout.)
// On the emulated device with stream communicators too (emulated_streams): the agreement's
// all-gather of host words and the rebuilds' all-to-all on device buffers. With a slow offload
// link (slow_link: the plans offload too, so a rank may have moved a buffer another wishes to drop
// and refuse it, and per-rank plans may fit, so `alone` is not run): bit-identical under the
// budget all the same. The attention probabilities are recomputed (model.attention_probs): kept,
// they would be what a rank drops alone first (a per-rank rebuild from qkv), and the budget that
// only agreement fits would be a different one on every layout.
struct AgreedOptions {
  bool emulated_streams = false;
  bool slow_link = false;
};

void CheckAgreedDrops(const Layout& l, const std::string& schedule, AgreedOptions o = {}) {
  const bool emulated_streams = o.emulated_streams;
  LayoutCase c = SpikeCase(l);
  if (emulated_streams) {
    c.device = device::Kind::kEmulated;
    c.stream_comms = true;
  }
  c.model.experts = 8;
  c.model.expert_ffn = 64;
  c.model.spikes.max_ratio = 3.5;  // of E / k = 4
  c.model.recompute_attention_probs = true;
  c.micro_batch = 4;
  c.steps = 6;
  c.schedule = schedule;
  const std::string tag =
      absl::StrCat("agreed-", l.name, "-", schedule, emulated_streams ? "-emulated" : "",
                   o.slow_link ? "-slow-link-" : "-");
  absl::StatusOr<RunResult> free_run = RunLayoutInTempDir(c, tag + "unlimited");
  ASSERT_TRUE(free_run.ok()) << free_run.status();
  c.policy = memory::MemoryPolicy::kFullRecompute;
  absl::StatusOr<RunResult> full = RunLayoutInTempDir(c, tag + "full");
  ASSERT_TRUE(full.ok()) << full.status();
  int64_t full_top = 0, free_top = 0;
  for (int rank = 0; rank < c.sizes.world(); ++rank) {
    for (int s = 0; s < c.steps; ++s) {
      full_top = std::max(full_top, full->activation_peak[rank][s]);
      free_top = std::max(free_top, free_run->activation_peak[rank][s]);
    }
  }
  // 2% above full_recompute's peak (adaptive plans to 98% of its budget), or below.
  auto budget = static_cast<uint64_t>(1.02 * full_top);
  c.policy = memory::MemoryPolicy::kAdaptive;
  c.adaptive_offload = o.slow_link;
  c.host_link_gbps = o.slow_link ? 0.003 : 0;  // 3 MB/s
  c.device_budget = budget;

  if (!o.slow_link) {
    c.agree_drops = false;
    for (int step = 0;; ++step) {
      absl::StatusOr<RunResult> alone = RunLayoutInTempDir(c, tag + "alone");
      if (!alone.ok()) {
        ExpectRanOutOfMemory(alone, "");
        break;
      }
      ASSERT_LT(step, 6) << "per-rank drops fit " << budget
                         << " bytes, 22% below full_recompute's peak: the test shows nothing";
      budget -= static_cast<uint64_t>(0.04 * full_top);
      c.device_budget = budget;
    }
  }

  c.agree_drops = true;
  absl::StatusOr<RunResult> agreed = RunLayoutInTempDir(c, tag + "agreed");
  ASSERT_TRUE(agreed.ok()) << agreed.status();
  ExpectBitIdentical(*agreed, *free_run);
  // (Every peak is within the budget: the arena refuses anything above it.)
  int64_t peak = 0, drops = 0;
  for (int rank = 0; rank < c.sizes.world(); ++rank) {
    for (int s = 0; s < c.steps; ++s) peak = std::max(peak, agreed->activation_peak[rank][s]);
    drops += agreed->agreed_drops[rank];
  }
  // With offload the plans may cover every deficit without a collective drop, as measured
  // costs decide; without, the run above shows they must drop some.
  if (!o.slow_link) {
    EXPECT_GT(drops, 0);
  }
  std::printf(
      "REPORT agreed drops %s %s: unlimited peak %lld B, full_recompute %lld B, budget %llu B; "
      "%s, agreed ones peak at %lld B with %lld agreed drops on rank 0%s\n",
      l.name, schedule.c_str(), static_cast<long long>(free_top), static_cast<long long>(full_top),
      static_cast<unsigned long long>(budget),
      o.slow_link ? "offloading over a 3 MB/s link" : "per-rank drops run out of memory",
      static_cast<long long>(peak), static_cast<long long>(agreed->agreed_drops[0]),
      emulated_streams ? " (emulated device, stream communicators)" : "");
}

class AgreedDropTest : public ::testing::TestWithParam<std::tuple<Layout, const char*>> {};

TEST_P(AgreedDropTest, BelowThePerRankFloorTheRanksDropTheExpertBuffersTogether) {
  CheckAgreedDrops(std::get<0>(GetParam()), std::get<1>(GetParam()));
}

TEST(AgreedDropDeviceTest, OnEmulatedRanksWithStreamCommunicators) {
  CheckAgreedDrops(Layout{"ep2_esp2", 1, 4, 1, 2, 2, 2}, "deepspeed", {.emulated_streams = true});
}

TEST(AgreedDropLinkTest, WithASlowOffloadLinkTheRanksStillTrainBitIdentically) {
  CheckAgreedDrops(Layout{"ep4", 1, 4, 1, 4, 1, 2}, "deepspeed", {.slow_link = true});
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, AgreedDropTest,
    ::testing::Values(std::make_tuple(Layout{"ep4", 1, 4, 1, 4, 1, 2}, "deepspeed"),
                      std::make_tuple(Layout{"ep2_esp2", 1, 4, 1, 2, 2, 2}, "deepspeed"),
                      std::make_tuple(Layout{"tp2_ep2", 1, 2, 2, 2, 1, 2}, "s1"),
                      std::make_tuple(Layout{"tp2_ep2", 1, 2, 2, 2, 1, 2}, "s2")),
    [](const auto& info) {
      return absl::StrCat(std::get<0>(info.param).name, "_", std::get<1>(info.param));
    });

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
    // Tensor parallelism: each rank's attention probabilities of its heads, which its plan may
    // drop and rebuild from its qkv slice alone.
    {"tp2_ep2", 1, 2, 2, 2, 1, 2},
};
INSTANTIATE_TEST_SUITE_P(Layouts, AdaptiveLayoutTest, ::testing::ValuesIn(kAdaptiveLayouts),
                         [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace furnace::testing
