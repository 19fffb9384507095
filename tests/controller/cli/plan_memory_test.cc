// furnace plan's memory section against the model itself: the parameters each stage's ranks hold
// and the activation bytes of one micro-batch under each static policy are what a GptMoe of that
// shard allocates and what its arena peaks at (the CPU device, dropless routing: every rank's
// rows are N k, the balanced rows the plan assumes).
#include <algorithm>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "controller/cli/commands.h"
#include "controller/cli/format.h"
#include "controller/cli/job_model.h"
#include "controller/spec/job_spec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/device/device.h"
#include "runtime/memory/policy.h"
#include "runtime/model/gpt_moe.h"
#include "runtime/model/shard.h"
#include "runtime/tensor/arena.h"
#include "tests/testing/test_dir.h"

namespace furnace::cli {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using testing_util::TestDir;

std::string Job(const std::string& parallel, const std::string& memory = "") {
  return R"(name: planmem
kind: train
model: {vocab: 50, seq_len: 16, d_model: 32, heads: 4, layers: 4, moe_every: 2, dense_ffn: 48,
        expert_ffn: 40}
moe: {experts: 4, top_k: 2, capacity_factor: 0}
parallel: )" +
         parallel + "\ndata: {source: markov}\n" + memory;
}

v1::JobSpec Spec(const std::string& yaml) {
  absl::StatusOr<v1::JobSpec> spec = spec::ParseJobYaml(yaml, "job.yaml");
  EXPECT_TRUE(spec.ok()) << spec.status();
  return spec.ok() ? *spec : v1::JobSpec{};
}

topology::Topology Layout(const v1::JobSpec& spec) {
  absl::StatusOr<topology::Topology> t = TopologyOf(spec);
  EXPECT_TRUE(t.ok()) << t.status();
  return *std::move(t);
}

TEST(PlanMemoryTest, OneMicroBatchIsTheArenaPeakOfTheModelUnderEveryStaticPolicy) {
  const v1::JobSpec spec = Spec(Job("{dp: 2, micro_batch: 3}"));
  const std::vector<StageMemory> stages = PlanMemory(spec, Layout(spec), moe::Schedule::kDeepspeed);
  ASSERT_EQ(stages.size(), 1u);
  const StageMemory& s = stages[0];
  EXPECT_EQ(s.ranks, 2);
  EXPECT_EQ(s.micro_batches_in_flight, 1);
  ASSERT_EQ(s.policies.size(), 3u);

  const model::ModelConfig config = ModelConfigOf(spec.model(), spec.moe());
  std::unique_ptr<device::Device> device = device::CreateCpuDevice();
  const int B = 3, N = B * config.seq_len;
  std::vector<int32_t> tokens(N), targets(N);
  for (int i = 0; i < N; ++i) {
    tokens[i] = (7 * i + 3) % config.vocab;
    targets[i] = (5 * i + 1) % config.vocab;
  }
  for (const PolicyActivationBytes& declared : s.policies) {
    tensor::DeviceArena arena(*device, 0);
    absl::StatusOr<std::unique_ptr<model::GptMoe>> m =
        model::GptMoe::Create(config, 5, *device, arena);
    ASSERT_TRUE(m.ok()) << m.status();
    EXPECT_EQ((*m)->num_params(), s.parameters);
    absl::StatusOr<memory::MemoryPolicy> policy = memory::ParseMemoryPolicy(declared.policy);
    ASSERT_TRUE(policy.ok()) << policy.status();
    ASSERT_TRUE((*m)->SetMemoryPolicy(*policy).ok());
    absl::StatusOr<train::MicroBatchResult> r =
        (*m)->ForwardBackward(tokens.data(), targets.data(), B, 1.0 / N, 1.0);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(static_cast<int64_t>(arena.peak_bytes()), declared.one) << declared.policy;
    EXPECT_EQ(declared.in_flight, declared.one);
  }
  EXPECT_GT(s.policies[0].one, s.policies[1].one);  // none > selective > full_recompute
  EXPECT_GT(s.policies[1].one, s.policies[2].one);
  EXPECT_LE(s.least_activation_bytes, s.policies[2].one);
  ASSERT_TRUE(s.any_routing_bytes.has_value());  // one rank's rows: at most N k, the floor's
  EXPECT_EQ(*s.any_routing_bytes, s.least_activation_bytes);
}

TEST(PlanMemoryTest, EachStageHoldsItsShardsParametersAndOneFOneBsMicroBatches) {
  const v1::JobSpec spec = Spec(Job("{pp: 2, dp: 2, ep: 2, micro_batch: 2, micro_batches: 4}"));
  const topology::Topology topology = Layout(spec);
  const std::vector<StageMemory> stages = PlanMemory(spec, topology, moe::Schedule::kDeepspeed);
  ASSERT_EQ(stages.size(), 2u);
  const model::ModelConfig config = ModelConfigOf(spec.model(), spec.moe());
  std::unique_ptr<device::Device> device = device::CreateCpuDevice();
  for (int rank = 0; rank < topology.world_size(); ++rank) {
    const model::ModelShard shard = model::ShardOf(topology, rank, config);
    tensor::DeviceArena arena(*device, 0);
    absl::StatusOr<std::unique_ptr<model::GptMoe>> m =
        model::GptMoe::Create(config, 5, *device, arena, shard);
    ASSERT_TRUE(m.ok()) << m.status();
    EXPECT_EQ((*m)->num_params(), stages[shard.stage].parameters) << "rank " << rank;
    EXPECT_EQ(stages[shard.stage].model_state_bytes, 16 * (*m)->num_params());
  }
  EXPECT_EQ(stages[0].first_layer, 0);
  EXPECT_EQ(stages[0].end_layer, 2);
  EXPECT_EQ(stages[1].end_layer, 4);
  EXPECT_EQ(stages[0].ranks, 2);  // 4 ranks: pp 2 x dp 2 (ep splits the dp ranks' experts)
  // 1F1B: stage 0 holds pp - 0 = 2 micro-batches at once, the last stage one.
  EXPECT_EQ(stages[0].micro_batches_in_flight, 2);
  EXPECT_EQ(stages[1].micro_batches_in_flight, 1);
  for (const PolicyActivationBytes& b : stages[0].policies) EXPECT_GT(b.in_flight, b.one);
  for (const PolicyActivationBytes& b : stages[1].policies) EXPECT_EQ(b.in_flight, b.one);
  // Expert parallelism: routing can send a rank more rows than balanced.
  ASSERT_TRUE(stages[0].any_routing_bytes.has_value());
  EXPECT_GT(*stages[0].any_routing_bytes, stages[0].least_activation_bytes);
}

// furnace submit refuses what every rank would refuse at start: the floor it checks is the one a
// real model of the layout's shard reports (GptMoe::MinimumActivationBytes, which the ranks use).
TEST(PlanMemoryTest, SubmitRefusesABudgetBelowTheFloorTheRanksCheck) {
  const std::string layout = "{dp: 2, ep: 2, micro_batch: 2}";
  const v1::JobSpec plain = Spec(Job(layout));
  const topology::Topology topology = Layout(plain);
  const model::ModelConfig config = ModelConfigOf(plain.model(), plain.moe());
  std::unique_ptr<device::Device> device = device::CreateCpuDevice();
  int64_t floor = 0;
  for (int rank = 0; rank < topology.world_size(); ++rank) {
    tensor::DeviceArena arena(*device, 0);
    absl::StatusOr<std::unique_ptr<model::GptMoe>> m =
        model::GptMoe::Create(config, 5, *device, arena, model::ShardOf(topology, rank, config));
    ASSERT_TRUE(m.ok()) << m.status();
    floor = std::max(floor, (*m)->MinimumActivationBytes(2));
  }
  EXPECT_EQ(LayoutActivationFloor(plain, topology).bytes, floor);

  const auto budget = [&](int64_t bytes, const std::string& extra = "") {
    return Spec(Job(layout, "memory: {policy: adaptive, device_budget: " + std::to_string(bytes) +
                                "}\n" + extra));
  };
  absl::Status refused = CheckDeviceBudgetFloor(budget(floor - 1), "job.yaml");
  EXPECT_TRUE(absl::IsInvalidArgument(refused)) << refused;
  EXPECT_THAT(refused.message(),
              HasSubstr(absl::StrCat("job.yaml: memory.device_budget: ", floor - 1,
                                     " bytes is below ", floor,
                                     " bytes, the least any memory "
                                     "policy needs on a rank of pipeline stage 0 for one "
                                     "micro-batch of 2 sequences")));
  EXPECT_THAT(refused.message(), HasSubstr(absl::StrCat("(allowed: >= ", floor)));
  EXPECT_TRUE(CheckDeviceBudgetFloor(budget(floor), "job.yaml").ok());
  EXPECT_TRUE(CheckDeviceBudgetFloor(plain, "job.yaml").ok());  // no budget: nothing to check

  // A shrink layout whose ranks need more (expert sharding gathers rows) is judged too: an
  // attempt restarted under it would be refused.
  const std::string wide = "{dp: 4, micro_batch: 2}";
  const v1::JobSpec sharded = Spec(Job("{dp: 2, esp: 2, micro_batch: 2}"));
  const int64_t sharded_floor = LayoutActivationFloor(sharded, Layout(sharded)).bytes;
  const v1::JobSpec wide_spec = Spec(Job(wide));
  const int64_t wide_floor = LayoutActivationFloor(wide_spec, Layout(wide_spec)).bytes;
  ASSERT_GT(sharded_floor, wide_floor);
  const v1::JobSpec shrinking =
      Spec(Job(wide, "memory: {policy: adaptive, device_budget: " + std::to_string(wide_floor) +
                         "}\nrecovery: {shrink: [{dp: 2, esp: 2}]}\n"));
  refused = CheckDeviceBudgetFloor(shrinking, "job.yaml");
  EXPECT_THAT(refused.message(),
              HasSubstr(absl::StrCat(" bytes is below ", sharded_floor,
                                     " bytes, the least any memory policy needs on a rank of "
                                     "pipeline stage 0 of recovery.shrink[0] (pp 1 dp 2 tp 1 ep 1 "
                                     "esp 2)")));

  // The same refusal from `furnace submit --dry-run`, before anything is sent.
  TestDir dir;
  const std::string path = dir / "job.yaml";
  std::ofstream(path, std::ios::binary) << Job(
      layout, "memory: {policy: adaptive, device_budget: " + std::to_string(floor - 1) + "}\n");
  std::ostringstream out, err;
  CommandContext ctx;
  ctx.out = &out;
  ctx.err = &err;
  SubmitOptions options;
  options.dry_run = DryRun::kClient;
  absl::StatusOr<int> code = RunSubmit(ctx, path, options);
  EXPECT_TRUE(absl::IsInvalidArgument(code.status())) << code.status();
  EXPECT_THAT(std::string(code.status().message()), HasSubstr("memory.device_budget: "));
}

class PlanMemoryTextTest : public ::testing::Test {
 protected:
  std::string Plan(const std::string& yaml, bool json = false) {
    std::ofstream(job_, std::ios::binary) << yaml;
    std::ostringstream out, err;
    CommandContext ctx;
    ctx.out = &out;
    ctx.err = &err;
    ctx.json = json;
    absl::StatusOr<int> code = RunPlan(ctx, job_, {});
    EXPECT_TRUE(code.ok()) << code.status();
    return out.str();
  }
  int64_t Least(const std::string& yaml) {
    const v1::JobSpec spec = Spec(yaml);
    return PlanMemory(spec, Layout(spec), moe::Schedule::kDeepspeed)[0].least_activation_bytes;
  }

  TestDir dir_;
  std::string job_ = dir_ / "job.yaml";
};

TEST_F(PlanMemoryTextTest, TheJobsBudgetIsWeighedAgainstEveryStage) {
  const std::string layout = "{dp: 2, ep: 2, micro_batch: 2}";
  const std::string plain = Plan(Job(layout));
  EXPECT_THAT(plain, HasSubstr("memory per rank (micro-batches of 2 x 16 tokens; MoE layers under "
                               "deepspeed;"));
  EXPECT_THAT(plain, HasSubstr("stage 0 (layers 0-3, 2 ranks): "));
  EXPECT_THAT(plain, HasSubstr("activations, one micro-batch (balanced routing): none "));
  EXPECT_THAT(plain, HasSubstr("under the routing that sends this rank the most: none "));
  EXPECT_THAT(plain, HasSubstr("policy none, device_budget none (the device's memory)"));

  const v1::JobSpec spec = Spec(Job(layout));
  const StageMemory stage = PlanMemory(spec, Layout(spec), moe::Schedule::kDeepspeed)[0];
  const int64_t least = stage.least_activation_bytes;
  const int64_t none = stage.policies[0].in_flight;
  const int64_t none_worst = *stage.policies[0].worst_in_flight;
  ASSERT_LT(none, none_worst);  // expert parallelism: routing can send this rank more
  const auto with = [&](const std::string& policy, int64_t budget, const std::string& extra = "") {
    return Plan(Job(layout, "memory: {policy: " + policy +
                                ", device_budget: " + std::to_string(budget) + extra + "}\n"));
  };
  EXPECT_THAT(with("adaptive", least - 1), HasSubstr("its ranks refuse the job before the first"));
  EXPECT_THAT(with("none", least - 1), HasSubstr("its ranks refuse the job before the first"));
  EXPECT_THAT(with("adaptive", least),
              HasSubstr("covers balanced routing; a step routed far from balance can need up to "));
  EXPECT_THAT(with("adaptive", *stage.any_routing_bytes),
              HasSubstr(": leaves room for any routing\n"));
  // A static policy is judged by its own bytes, balanced and under the worst routing.
  const std::string none_short = with("none", none - 1);
  EXPECT_THAT(none_short, HasSubstr("policy none needs "));
  EXPECT_THAT(none_short, HasSubstr("restarts the job under adaptive"));
  const std::string none_balanced = with("none", none);
  EXPECT_THAT(none_balanced, HasSubstr("covers balanced routing; a step routed far from balance "
                                       "can need up to " +
                                       FormatBytes(none_worst) + " on stage 0 under none"));
  EXPECT_THAT(with("none", none_worst), HasSubstr(": leaves room for any routing\n"));
  // Offload is not projected: judged by none's bytes before its moves.
  EXPECT_THAT(with("offload", none - 1, ", offload_ratio: 0.5"),
              HasSubstr("none (offload before its moves, which this plan does not project)"));
  // Without restarts the job does not come back under adaptive.
  EXPECT_THAT(Plan(Job(layout, "memory: {policy: none, device_budget: " + std::to_string(none - 1) +
                                   "}\nrecovery: {max_restarts: 0}\n")),
              HasSubstr("with recovery.max_restarts 0 the job then fails"));

  const std::string json = Plan(Job(layout), true);
  EXPECT_THAT(json, HasSubstr("\"memory\": ["));
  EXPECT_THAT(json, HasSubstr("\"least_activation_bytes\": " + std::to_string(least)));
  EXPECT_THAT(json, HasSubstr("\"worst_routing_in_flight\": " + std::to_string(none_worst)));
}

// model.attention_probs recomputed: the plan says so, and every policy's activations are lower by
// the probabilities less the row statistics of each layer (seq_len 16: 16 floats a row against 2).
TEST_F(PlanMemoryTextTest, RecomputedAttentionProbsAreSaidAndCounted) {
  const std::string layout = "{dp: 2, ep: 2, micro_batch: 2}";
  const std::string stored_yaml = Job(layout);
  std::string recomputed_yaml = stored_yaml;
  const std::string field = "expert_ffn: 40}";
  recomputed_yaml.replace(recomputed_yaml.find(field), field.size(),
                          "expert_ffn: 40, attention_probs: recomputed}");
  EXPECT_THAT(Plan(recomputed_yaml),
              HasSubstr("; attention probabilities recomputed in backward "
                        "(model.attention_probs), 2 floats a query row kept instead of seq_len;"));
  EXPECT_THAT(Plan(stored_yaml), Not(HasSubstr("attention probabilities recomputed")));
  const v1::JobSpec stored = Spec(stored_yaml), recomputed = Spec(recomputed_yaml);
  const StageMemory a = PlanMemory(stored, Layout(stored), moe::Schedule::kDeepspeed)[0];
  const StageMemory b = PlanMemory(recomputed, Layout(recomputed), moe::Schedule::kDeepspeed)[0];
  ASSERT_EQ(a.policies.size(), b.policies.size());
  // One layer's probabilities (2 x 4 heads x 16 x 16 floats) less its statistics (x 2 floats).
  const int64_t per_layer = 4 * 2 * 4 * 16 * (16 - 2);
  for (size_t i = 0; i < a.policies.size(); ++i) {
    SCOPED_TRACE(a.policies[i].policy);
    // No pipeline: one micro-batch in flight, its 4 layers' probabilities held at the peak.
    EXPECT_EQ(a.policies[i].in_flight - b.policies[i].in_flight, 4 * per_layer);
  }
  // The floor (one module at a time, here the head's) does not hold the probabilities.
  EXPECT_LE(b.least_activation_bytes, a.least_activation_bytes);
}

}  // namespace
}  // namespace furnace::cli
