// Layout equivalence (issue: distributed training): every parallel layout trains the tiny MoE of
// MODEL.md to the same numbers as one process running the same global batch. Each case forks one
// real process per rank (Gloo over 127.0.0.1) and compares, over 5 steps:
//   * the per-step loss, aux loss and gradient norm (every rank reports the same global values);
//   * the final parameters reassembled by name from the shards, against the single-process run;
//   * the replicas of each element held by several ranks against each other;
//   * on pipeline layouts, the 1F1B in-flight peak of each stage: min(pp - stage, m).
// Tolerances (fp32, different summation orders): loss and gradient norm 1e-5 relative (measured:
// below 1e-7 on every case); replicas of one element on different ranks: bit-identical;
// parameters per tensor: relative L2 error 5e-5 and largest element difference over the tensor's
// largest magnitude 2e-4. Measured: loss within 9e-8; parameters median 4e-7 L2, 33 of the 40
// cases below 2e-6, the worst 2.0e-5 L2 / 5.6e-5 max (an expert that receives one or two tokens:
// AdamW divides by sqrt(v), so where a gradient is tiny the layouts' roundoff differences become
// visible update differences). The REPORT line of each case prints the measured values.
//
// Routing spikes (moe.spikes, runtime/model/spikes.h) are drawn from the step, the layer and each
// token's place in the global batch, so every layout must force the same tokens as one process:
// the Spikes suite runs the layouts with spikes at max_ratio = experts / top_k on 3 of the 5
// steps and checks, besides all of the above, that the global tokens per expert of every step
// equal the single-process run's exactly, that the same steps are spike steps, and that the
// spikes changed the routing (the single-process run without them first routes differently on a
// spike step).
#include <cmath>
#include <filesystem>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "runtime/model/spikes.h"
#include "runtime/pipeline/one_f_one_b.h"
#include "tests/runtime/parallel/layout_run.h"
#include "tests/testing/test_dir.h"

namespace furnace::testing {
namespace {

constexpr double kLossTol = 1e-5;
constexpr double kParamTol = 5e-5;     // per tensor, ||a - b|| / ||b||
constexpr double kParamMaxTol = 2e-4;  // per tensor, max |a - b| / max |b|

struct Layout {
  const char* name;
  int pp, dp, tp, ep, esp, m;
};

struct Routing {
  const char* name;
  int top_k;
  double capacity_factor;
};

using Param = std::tuple<Layout, Routing>;

// spikes: the routing-spike configuration of the run (default: off); schedule: moe.schedule.
void CheckLayout(const Layout& layout, const Routing& routing, const model::SpikeConfig& spikes,
                 const std::string& schedule = "deepspeed") {
  LayoutCase c;
  c.schedule = schedule;
  c.model = TinyLayoutModel(routing.top_k, routing.capacity_factor);
  c.model.spikes = spikes;
  c.sizes.pp = layout.pp;
  c.sizes.dp = layout.dp;
  c.sizes.tp = layout.tp;
  c.sizes.ep = layout.ep;
  c.sizes.esp = layout.esp;
  c.micro_batches = layout.m;
  const std::string dir =
      absl::StrCat(::testing::TempDir(), "/layout-", layout.name, "-", routing.name, "-", schedule,
                   spikes.enabled() ? "-spikes-" : "-", getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);

  absl::StatusOr<RunResult> parallel = RunLayout(c, dir);
  ASSERT_TRUE(parallel.ok()) << parallel.status();
  absl::StatusOr<RunResult> single = RunSingle(c);
  ASSERT_TRUE(single.ok()) << single.status();

  ASSERT_EQ(parallel->loss.size(), single->loss.size());
  double worst_loss = 0;
  for (size_t s = 0; s < single->loss.size(); ++s) {
    const double rel = std::fabs(parallel->loss[s] - single->loss[s]) / std::fabs(single->loss[s]);
    const double norm_rel =
        std::fabs(parallel->grad_norm[s] - single->grad_norm[s]) / std::fabs(single->grad_norm[s]);
    const double aux_abs = std::fabs(parallel->aux_loss[s] - single->aux_loss[s]);
    worst_loss = std::max(worst_loss, rel);
    EXPECT_LE(rel, kLossTol) << "step " << s << " loss " << parallel->loss[s] << " vs "
                             << single->loss[s];
    EXPECT_LE(norm_rel, kLossTol) << "step " << s << " grad norm " << parallel->grad_norm[s]
                                  << " vs " << single->grad_norm[s];
    EXPECT_LE(aux_abs, kLossTol * std::max(1e-3, std::fabs(single->aux_loss[s])) * 10)
        << "step " << s << " aux " << parallel->aux_loss[s] << " vs " << single->aux_loss[s];
  }
  ASSERT_EQ(parallel->params.size(), single->params.size());
  double worst_param = 0, worst_param_max = 0;
  std::string worst_name;
  for (const auto& [name, ref] : single->params) {
    auto it = parallel->params.find(name);
    ASSERT_NE(it, parallel->params.end()) << name << " missing from the parallel run";
    ASSERT_EQ(it->second.size(), ref.size()) << name;
    // The key bias (columns [d, 2d) of attn.bqkv) has a gradient that is exactly zero in exact
    // arithmetic (softmax is invariant to adding one constant to every logit of a query), so its
    // value after AdamW is roundoff amplified by the normalisation, in any two runs alike. It is
    // checked to be finite and left out of the comparison.
    const bool bqkv = name.size() > 9 && name.compare(name.size() - 9, 9, "attn.bqkv") == 0;
    const size_t d = static_cast<size_t>(c.model.d_model);
    double max_ref = 0, max_diff = 0, sq_ref = 0, sq_diff = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
      ASSERT_TRUE(std::isfinite(it->second[i])) << name << "[" << i << "]";
      if (bqkv && i >= d && i < 2 * d) continue;
      const double diff = std::fabs(static_cast<double>(it->second[i]) - ref[i]);
      max_ref = std::max(max_ref, static_cast<double>(std::fabs(ref[i])));
      max_diff = std::max(max_diff, diff);
      sq_ref += static_cast<double>(ref[i]) * ref[i];
      sq_diff += diff * diff;
    }
    const double rel = sq_ref > 0 ? std::sqrt(sq_diff / sq_ref) : std::sqrt(sq_diff);
    const double rel_max = max_ref > 0 ? max_diff / max_ref : max_diff;
    if (rel > worst_param) {
      worst_param = rel;
      worst_name = name;
    }
    worst_param_max = std::max(worst_param_max, rel_max);
    EXPECT_LE(rel, kParamTol) << name << " (relative L2 error)";
    EXPECT_LE(rel_max, kParamMaxTol) << name << " (largest difference / largest magnitude)";
  }
  // Replicas are bit-identical: same gradients (summed or averaged by one all-reduce), same update.
  EXPECT_EQ(parallel->replica_spread, 0.0);
  for (int rank = 0; rank < c.sizes.world(); ++rank) {
    // Default order tp-dp-pp: the stage is the slowest coordinate.
    const int stage = rank / (layout.dp * layout.tp);
    EXPECT_EQ(parallel->in_flight_peak[rank], pipeline::MaxInFlight(stage, layout.pp, layout.m))
        << "rank " << rank;
  }
  if (spikes.enabled()) {
    int spike_steps = 0;
    for (int s = 0; s < c.steps; ++s) {
      EXPECT_EQ(parallel->routing_spike[s], model::IsSpikeStep(spikes, s)) << "step " << s;
      EXPECT_EQ(single->routing_spike[s], model::IsSpikeStep(spikes, s)) << "step " << s;
      // The same tokens went to the same experts: the spikes and the rest of the routing.
      EXPECT_EQ(parallel->tokens_per_expert[s], single->tokens_per_expert[s]) << "step " << s;
      spike_steps += single->routing_spike[s] ? 1 : 0;
    }
    EXPECT_GT(spike_steps, 0);
    EXPECT_LT(spike_steps, c.steps);
    // And the spikes changed the routing: without them the single-process run routes the same
    // up to some step, and that step is a spike step (a spike of small r may force no token).
    LayoutCase calm = c;
    calm.model.spikes = model::SpikeConfig{};
    absl::StatusOr<RunResult> plain = RunSingle(calm);
    ASSERT_TRUE(plain.ok()) << plain.status();
    int first = 0;
    while (first < c.steps && plain->tokens_per_expert[first] == single->tokens_per_expert[first])
      ++first;
    ASSERT_LT(first, c.steps) << "the spikes changed no routing";
    EXPECT_TRUE(single->routing_spike[first]) << "step " << first;
  }
  // What ran: the schedule asked for (tp == 1: deepspeed's computation); auto's choice is one
  // of them, the same on every rank and layer (the layers share a shape).
  for (const std::vector<std::string>& ran : parallel->moe_schedules) {
    for (const std::string& name : ran) {
      if (schedule == "auto") {
        EXPECT_EQ(name, parallel->moe_schedules[0][0]);
      } else {
        EXPECT_EQ(name, layout.tp > 1 ? schedule : "deepspeed");
      }
    }
  }
  // How the expert shards met: deepspeed with the esp group as the tp group (these layouts' orders
  // put both on the fastest ranks) slices the experts (all-reduce over esp); otherwise they
  // gather their group's rows.
  const bool sliced = layout.esp > 1 && layout.esp == layout.tp && schedule == "deepspeed";
  for (const std::map<std::string, int64_t>& ops : parallel->moe_op_bytes) {
    if (layout.esp == 1 || schedule == "auto") break;
    EXPECT_EQ(ops.count("ar(esp)"), sliced ? 1u : 0u) << schedule;
    EXPECT_EQ(ops.count("rs(esp)"), sliced ? 0u : 1u) << schedule;
  }
  std::printf(
      "REPORT %s/%s%s/%s (ran %s): worst loss rel %.2e, worst param rel L2 %.2e (%s), worst param "
      "max-rel "
      "%.2e, replica spread %.2e\n",
      layout.name, routing.name, spikes.enabled() ? "/spikes" : "", schedule.c_str(),
      parallel->moe_schedules.empty() || parallel->moe_schedules[0].empty()
          ? "-"
          : parallel->moe_schedules[0][0].c_str(),
      worst_loss, worst_param, worst_name.c_str(), worst_param_max, parallel->replica_spread);
  std::filesystem::remove_all(dir);
}

class LayoutEquivalenceTest : public ::testing::TestWithParam<Param> {};

TEST_P(LayoutEquivalenceTest, MatchesSingleProcess) {
  const auto& [layout, routing] = GetParam();
  CheckLayout(layout, routing, model::SpikeConfig{});
}

class SpikeLayoutTest : public ::testing::TestWithParam<Param> {};

TEST_P(SpikeLayoutTest, MatchesSingleProcess) {
  const auto& [layout, routing] = GetParam();
  model::SpikeConfig spikes;
  spikes.probability = 0.5;
  spikes.max_ratio = 4.0 / routing.top_k;  // experts / top_k: up to every token forced
  spikes.seed = 164;  // spike steps 1, 3 and 4, every layer forcing 37% of the tokens or more
  CheckLayout(layout, routing, spikes);
}

const Layout kLayouts[] = {
    {"dp2", 1, 2, 1, 1, 1, 2},
    {"tp2", 1, 1, 2, 1, 1, 2},
    {"pp2", 2, 1, 1, 1, 1, 2},
    {"pp4_m8", 4, 1, 1, 1, 1, 8},
    {"ep2", 1, 2, 1, 2, 1, 2},
    {"ep4", 1, 4, 1, 4, 1, 2},
    {"ep2_esp2", 1, 4, 1, 2, 2, 2},
    {"tp2_ep2", 1, 1, 2, 2, 1, 2},
    {"dp2_tp2_pp2", 2, 2, 2, 1, 1, 2},
    {"tp2_pp2_ep2_esp2", 2, 2, 2, 2, 2, 2},
    {"tp2_esp2", 1, 1, 2, 1, 2, 2},
    {"tp4_ep2_esp2", 1, 1, 4, 2, 2, 2},
    // Sliced experts replicated over edp 2: their gradients summed over expert_data, unscaled.
    {"dp2_tp2_esp2", 1, 2, 2, 1, 2, 2},
};
const Routing kRoutings[] = {
    {"top1_dropless", 1, 0.0},
    {"top2_dropless", 2, 0.0},
    {"top1_capacity1", 1, 1.0},
    {"top2_capacity1", 2, 1.0},
};

std::string CaseName(const ::testing::TestParamInfo<Param>& info) {
  return absl::StrCat(std::get<0>(info.param).name, "_", std::get<1>(info.param).name);
}

INSTANTIATE_TEST_SUITE_P(Layouts, LayoutEquivalenceTest,
                         ::testing::Combine(::testing::ValuesIn(kLayouts),
                                            ::testing::ValuesIn(kRoutings)),
                         CaseName);
// Every layout, with the routings that drop (capacity 1) and that do not, top-1 and top-2.
const Routing kSpikeRoutings[] = {kRoutings[1], kRoutings[2]};
INSTANTIATE_TEST_SUITE_P(Spikes, SpikeLayoutTest,
                         ::testing::Combine(::testing::ValuesIn(kLayouts),
                                            ::testing::ValuesIn(kSpikeRoutings)),
                         CaseName);

// A fresh rendezvous directory under the temp dir, removed when the test program exits (a failed
// run leaves the ranks' files in it).
std::string FreshDir(const std::string& name) {
  return testing_util::RemovedAtExit("layout-" + name).string();
}

// Runs `c`, which must fail with every rank exiting with `code` (layout_run.h).
void ExpectEveryRankExitsWith(const LayoutCase& c, const std::string& name, int code) {
  const absl::StatusOr<RunResult> run = RunLayout(c, FreshDir(name));
  ASSERT_FALSE(run.ok());
  const std::string why(run.status().message());
  for (int rank = 0; rank < c.sizes.world(); ++rank) {
    EXPECT_NE(why.find(absl::StrCat("rank ", rank, " exited with ", code)), std::string::npos)
        << why;
  }
}

// A diverging run (a learning rate of 1e38) on a layout with every kind of group: the first step
// whose loss or gradient norm is not finite is refused on every rank alike (both are global), so
// every rank stops there with the same cause and none waits in a collective for the others.
TEST(DivergenceLayoutTest, EveryRankRefusesTheSameNonFiniteStep) {
  LayoutCase c;
  c.model = TinyLayoutModel(2, 0.0);
  c.sizes.pp = 2;
  c.sizes.dp = 2;
  c.sizes.ep = 2;
  c.steps = 6;
  c.lr = 1e38;
  ExpectEveryRankExitsWith(c, "diverging", kRankAborted);
}

// A rank whose host holds other data at the same path (here: another Markov chain) trains other
// sequences silently unless the ranks compare what they opened: every rank refuses before the
// first step (Trainer::CheckSameData), as InvalidArgument naming the rank.
TEST(DataCheckLayoutTest, EveryRankRefusesWhenOneOpenedOtherData) {
  LayoutCase c;
  c.model = TinyLayoutModel(2, 0.0);
  c.sizes.dp = 2;
  c.sizes.ep = 2;
  c.steps = 2;
  c.other_data_rank = 1;
  ExpectEveryRankExitsWith(c, "other-data", kRankInvalidArgument);
  c.other_data_rank = -1;  // the same data: the check passes
  const absl::StatusOr<RunResult> same = RunLayout(c, FreshDir("same-data"));
  EXPECT_TRUE(same.ok()) << same.status();
}

// Parm's schedules (runtime/moe/schedule.h) on the layouts with tensor parallelism: s1 gates
// each peer's slice of the tokens (the group's capacity and aux loss through the gathered
// statistics), s2 splits the routed rows and fuses the exchanges; both must train to the
// single-process numbers on every routing, capacity drops included, and with routing spikes.
using ScheduleParam = std::tuple<Layout, Routing, const char*>;
class ScheduleEquivalenceTest : public ::testing::TestWithParam<ScheduleParam> {};

TEST_P(ScheduleEquivalenceTest, MatchesSingleProcess) {
  const auto& [layout, routing, schedule] = GetParam();
  CheckLayout(layout, routing, model::SpikeConfig{}, schedule);
}

class ScheduleSpikeTest : public ::testing::TestWithParam<ScheduleParam> {};

TEST_P(ScheduleSpikeTest, MatchesSingleProcess) {
  const auto& [layout, routing, schedule] = GetParam();
  model::SpikeConfig spikes;
  spikes.probability = 0.5;
  spikes.max_ratio = 4.0 / routing.top_k;
  spikes.seed = 164;
  CheckLayout(layout, routing, spikes, schedule);
}

const Layout kTpLayouts[] = {
    {"tp2", 1, 1, 2, 1, 1, 2},         {"tp2_ep2", 1, 1, 2, 2, 1, 2},
    {"dp2_tp2_pp2", 2, 2, 2, 1, 1, 2}, {"tp2_pp2_ep2_esp2", 2, 2, 2, 2, 2, 2},
    {"tp2_esp2", 1, 1, 2, 1, 2, 2},    {"tp4_ep2_esp2", 1, 1, 4, 2, 2, 2},
    {"dp2_tp2_ep4", 1, 2, 2, 4, 1, 2},
};
const char* const kParmSchedules[] = {"s1", "s2", "auto"};

std::string ScheduleCaseName(const ::testing::TestParamInfo<ScheduleParam>& info) {
  return absl::StrCat(std::get<0>(info.param).name, "_", std::get<1>(info.param).name, "_",
                      std::get<2>(info.param));
}

INSTANTIATE_TEST_SUITE_P(Schedules, ScheduleEquivalenceTest,
                         ::testing::Combine(::testing::ValuesIn(kTpLayouts),
                                            ::testing::ValuesIn(kRoutings),
                                            ::testing::ValuesIn(kParmSchedules)),
                         ScheduleCaseName);
INSTANTIATE_TEST_SUITE_P(Schedules, ScheduleSpikeTest,
                         ::testing::Combine(::testing::ValuesIn(kTpLayouts),
                                            ::testing::ValuesIn(kSpikeRoutings),
                                            ::testing::ValuesIn(kParmSchedules)),
                         ScheduleCaseName);

}  // namespace
}  // namespace furnace::testing
