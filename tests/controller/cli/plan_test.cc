// furnace plan: a job file in, the MoE schedules priced by the cost model out, no controller.
#include <fstream>
#include <sstream>

#include "controller/cli/commands.h"
#include "controller/cli/exit_codes.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/moe/cost_model.h"
#include "runtime/topology/topology.h"
#include "tests/testing/test_dir.h"

namespace furnace::cli {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using testing_util::TestDir;

constexpr char kJob[] = R"(name: plan_tp2_ep2_esp2
kind: train
model:
  vocab: 64
  seq_len: 32
  d_model: 64
  heads: 4
  layers: 4
  moe_every: 2
  dense_ffn: 128
  expert_ffn: 64
moe:
  experts: 4
  top_k: 2
parallel:
  dp: 2
  tp: 2
  ep: 2
  esp: 2
  micro_batch: 4
data:
  source: markov
)";

class PlanTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ctx_.out = &out_;
    ctx_.err = &err_;  // no client: plan must not need the controller
    std::ofstream(job_, std::ios::binary) << kJob;
  }

  TestDir dir_;
  std::string job_ = dir_ / "job.yaml";
  std::ostringstream out_, err_;
  CommandContext ctx_;
};

TEST_F(PlanTest, PrintsEverySchedulesTimesBytesOpsAndAuto) {
  auto code = RunPlan(ctx_, job_, {});
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, kExitOk);
  const std::string out = out_.str();
  EXPECT_THAT(out, HasSubstr("MoE layers 1, 3"));
  EXPECT_THAT(out, HasSubstr("N 128 tokens per rank per micro-batch (micro_batch 4 x seq_len 32)"));
  EXPECT_THAT(out, HasSubstr("groups: tp 2 intra-node, ep 2 intra-node, esp 2 intra-node"));
  for (const char* s : {"\ndeepspeed: forward ", "\ns1: forward ", "\ns2: forward "}) {
    EXPECT_THAT(out, HasSubstr(s));
  }
  EXPECT_THAT(out, HasSubstr("forward bytes   tp "));
  EXPECT_THAT(out, HasSubstr("backward bytes  tp "));
  EXPECT_THAT(out, HasSubstr("fused(a2a ep, ag tp)"));
  // The esp group is the tp group here: deepspeed's experts are sliced (all-reduce over esp).
  EXPECT_THAT(out, HasSubstr("forward ops     gate . order . counts(ep) . a2a(ep) . copy(esp) . "
                             "expert . ar(esp) . a2a(ep) . inverse"));
  EXPECT_THAT(out, HasSubstr("\nauto: "));
  EXPECT_THAT(out, HasSubstr("profile: default profile"));
}

TEST_F(PlanTest, RanksPerNodeDecidesIntraNodeGroups) {
  // 4 ranks, 2 per node: tp (2 x stride 1) and esp (2 x 1) fit a node, ep (2 x stride esp 2) not.
  auto code = RunPlan(ctx_, job_, {.profile = "", .ranks_per_node = 2});
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_THAT(out_.str(), HasSubstr("groups: tp 2 intra-node, ep 2 inter-node, esp 2 intra-node "
                                    "(4 ranks, 2 per node)"));
  auto topology = [](const std::string& order) {
    topology::ParallelSizes sizes{.pp = 1, .dp = 2, .tp = 2, .ep = 2, .esp = 2};
    if (!order.empty()) sizes.order = order;
    absl::StatusOr<topology::Topology> t = topology::Topology::Create(sizes, 4);
    EXPECT_TRUE(t.ok()) << t.status();
    return *std::move(t);
  };
  const IntraNode one = PlanIntraNode(topology(""), 1);
  EXPECT_FALSE(one.tp || one.ep || one.esp);
  const IntraNode four = PlanIntraNode(topology(""), 4);
  EXPECT_TRUE(four.tp && four.ep && four.esp);
  const IntraNode two = PlanIntraNode(topology(""), 2);
  EXPECT_TRUE(two.tp && !two.ep && two.esp);
}

// With dp fastest (parallel.order dp-tp-pp) the tp groups are {0, 2} and {1, 3}: on 2 ranks per
// node each spans both nodes, whatever its size.
TEST_F(PlanTest, TheLayoutsOrderDecidesWhichGroupsAreIntraNode) {
  std::string yaml = kJob;
  ASSERT_NE(yaml.find("parallel:"), std::string::npos);
  yaml.replace(yaml.find("parallel:"), 9, "parallel:\n  order: dp-tp-pp");
  const std::string reordered = dir_ / "reordered.yaml";
  std::ofstream(reordered) << yaml;
  auto code = RunPlan(ctx_, reordered, {.profile = "", .ranks_per_node = 2});
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_THAT(out_.str(), HasSubstr("groups: tp 2 inter-node, "));
}

TEST_F(PlanTest, ReadsAProfile) {
  moe::CostProfile p = moe::DefaultProfile(true, true, true);
  p.source = "fitted on tp 2 x ep 2 x esp 2 (world 8)";
  std::ofstream(dir_ / "profile.json") << p.ToJson();
  auto code = RunPlan(ctx_, job_, {.profile = dir_ / "profile.json"});
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_THAT(out_.str(), HasSubstr("profile: fitted on tp 2 x ep 2 x esp 2 (world 8)"));

  std::ofstream(dir_ / "bad.json") << "{";
  EXPECT_TRUE(
      absl::IsInvalidArgument(RunPlan(ctx_, job_, {.profile = dir_ / "bad.json"}).status()));
  const auto missing = RunPlan(ctx_, job_, {.profile = dir_ / "none.json"});
  EXPECT_EQ(ExitCodeForStatus(missing.status()), kExitLocalError);
}

TEST_F(PlanTest, InvalidJobIsReportedAsSubmitDoes) {
  std::ofstream(dir_ / "bad.yaml") << "name: x\nkind: train\nparallel:\n  dp: -2\n";
  const auto code = RunPlan(ctx_, dir_ / "bad.yaml", {});
  ASSERT_TRUE(absl::IsInvalidArgument(code.status()));
  EXPECT_THAT(code.status().message(), HasSubstr("bad.yaml:4:7: parallel.dp"));
  EXPECT_TRUE(absl::IsInvalidArgument(RunPlan(ctx_, dir_ / "none.yaml", {}).status()));
  // A commcheck has no model to plan: said so, not a plan of the default model's shapes.
  std::ofstream(dir_ / "cc.yaml") << "name: cc\nkind: commcheck\nparallel: {dp: 2}\n";
  const auto commcheck = RunPlan(ctx_, dir_ / "cc.yaml", {});
  ASSERT_TRUE(absl::IsInvalidArgument(commcheck.status()));
  EXPECT_THAT(commcheck.status().message(), HasSubstr("a commcheck job builds no model"));
}

// Where the predictions leave a choice (a profile that prices nothing: all three tie), plan says
// which schedules auto's ranks will time; under a device budget, that they will not.
TEST_F(PlanTest, SaysWhichSchedulesAutosRanksTime) {
  moe::CostProfile zero;
  zero.source = "zero";
  std::ofstream(dir_ / "zero.json") << zero.ToJson();
  auto code = RunPlan(ctx_, job_, {.profile = dir_ / "zero.json"});
  ASSERT_TRUE(code.ok()) << code.status();
  const std::string want =
      "\nauto: deepspeed (deepspeed: 0 ms fwd+bwd vs s1 0 ms, s2 0 ms)\n  the ranks then time the "
      "MoE layer under deepspeed, s1, s2 (predicted within 1.5x of the best) and run the one "
      "measured fastest by 5% (deepspeed first, then the predicted order)\n";
  EXPECT_THAT(out_.str(), HasSubstr(want));

  std::ofstream(dir_ / "budget.yaml", std::ios::binary)
      << kJob << "memory: {policy: adaptive, device_budget: 1073741824}\n";
  out_.str("");
  code = RunPlan(ctx_, dir_ / "budget.yaml", {.profile = dir_ / "zero.json"});
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_THAT(out_.str(), HasSubstr("(deepspeed first, then the predicted order): not under "
                                    "memory.device_budget, where this pick stands\n"));

  // A profile whose tp all-gather costs a second a call prices s1 and s2 (both gather over tp;
  // deepspeed moves no tp bytes here) far from deepspeed: nothing to time, nothing said.
  moe::CostProfile slow_tp = moe::DefaultProfile(true, true, true);
  slow_tp.at(moe::CollectiveKind::kAllGather, moe::OpGroup::kTp).alpha = 1.0;
  std::ofstream(dir_ / "slow_tp.json") << slow_tp.ToJson();
  out_.str("");
  code = RunPlan(ctx_, job_, {.profile = dir_ / "slow_tp.json"});
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_THAT(out_.str(), HasSubstr("\nauto: deepspeed ("));
  EXPECT_THAT(out_.str(), Not(HasSubstr("the ranks then time")));

  ctx_.json = true;
  out_.str("");
  code = RunPlan(ctx_, job_, {.profile = dir_ / "zero.json"});
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_THAT(out_.str(), HasSubstr("\"trial\": [\n"));
  EXPECT_THAT(out_.str(), HasSubstr("\"s2\"\n"));
}

TEST_F(PlanTest, JsonIsOneDocument) {
  ctx_.json = true;
  auto code = RunPlan(ctx_, job_, {});
  ASSERT_TRUE(code.ok()) << code.status();
  const std::string out = out_.str();
  EXPECT_EQ(out.front(), '{');
  EXPECT_THAT(out, HasSubstr("\"schedules\""));
  EXPECT_THAT(out, HasSubstr("\"auto\""));
  EXPECT_THAT(out, HasSubstr("\"sliced_experts\": true"));
}

}  // namespace
}  // namespace furnace::cli
