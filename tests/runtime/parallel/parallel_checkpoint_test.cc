// Checkpoints of a parallel layout (ranks are threads here, comm::LocalGroup): every rank writes
// its shard and rank 0 commits one manifest; a run restored from step 2 and trained to step 4
// ends with shard files byte-identical to an uninterrupted run; loading into another layout is
// refused with the tensor that differs.
#include <filesystem>
#include <memory>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/blas.h"
#include "runtime/checkpoint/checkpoint.h"
#include "runtime/data/markov.h"
#include "runtime/data/sampler.h"
#include "runtime/device/device.h"
#include "runtime/model/gpt_moe.h"
#include "runtime/tensor/arena.h"
#include "runtime/train/rank_layout.h"
#include "runtime/train/trainer.h"
#include "tests/runtime/parallel/local_world.h"
#include "tests/testing/file_bytes.h"

namespace furnace::testing {
namespace {

using testing_util::ReadAll;

model::ModelConfig Tiny() {
  model::ModelConfig c;
  c.vocab = 32;
  c.seq_len = 8;
  c.d_model = 16;
  c.heads = 4;
  c.layers = 2;
  c.experts = 4;
  c.expert_ffn = 16;
  c.top_k = 2;
  return c;
}

// Trains `steps` steps (restoring first when `restore`), checkpointing every 2 steps into dir
// (asynchronously when `async`).
absl::Status TrainLayout(const topology::ParallelSizes& sizes, const std::string& dir, int steps,
                         bool restore, bool async = false) {
  LocalWorld world;
  const model::ModelConfig c = Tiny();
  auto topo = topology::Topology::Create(sizes, sizes.world(), train::DimsOf(c));
  if (!topo.ok()) return topo.status();
  const auto statuses = LocalWorld::Run(sizes.world(), [&](int rank) -> absl::Status {
    auto layout = train::BuildRankLayout(*topo, rank, c, world.Factory());
    if (!layout.ok()) return layout.status();
    auto cpu = device::CreateCpuDevice();
    tensor::DeviceArena arena(*cpu, 0);
    auto model =
        model::GptMoe::Create(c, 3, *cpu, arena, (*layout)->shard, (*layout)->model_groups());
    if (!model.ok()) return model.status();
    data::MarkovConfig mc;
    mc.vocab = c.vocab;
    mc.seed = 9;
    auto chain = data::MarkovChain::Create(mc);
    if (!chain.ok()) return chain.status();
    data::SamplerConfig sc;
    sc.batch = 2;
    sc.seq_len = c.seq_len;
    sc.seed = 3;
    auto sampler = data::MakeMarkovSampler(std::move(*chain), sc);
    if (!sampler.ok()) return sampler.status();
    train::TrainConfig tc;
    tc.steps = steps;
    tc.micro_batches = 2;
    tc.seed = 3;
    tc.schedule.lr = 3e-3;
    tc.schedule.max_steps = 4;
    tc.checkpoint.dir = dir;
    tc.checkpoint.every = 2;
    tc.checkpoint.keep = 0;
    tc.checkpoint.async = async;
    auto trainer =
        train::Trainer::Create(model->get(), sampler->get(), tc, nullptr, &(*layout)->runtime);
    if (!trainer.ok()) return trainer.status();
    if (restore) {
      auto loaded = (*trainer)->RestoreLatest();
      if (!loaded.ok()) return loaded.status();
    }
    return (*trainer)->Run();
  });
  for (const absl::Status& s : statuses) {
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

class ParallelCheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    kernels::cpu::SetBlasThreads(1);
    root_ = absl::StrCat(::testing::TempDir(), "/parallel-ckpt-", getpid());
    std::filesystem::remove_all(root_);
  }
  void TearDown() override { std::filesystem::remove_all(root_); }
  std::string root_;
};

TEST_F(ParallelCheckpointTest, ResumedRunEndsBitIdenticalAndOtherLayoutsAreRefused) {
  topology::ParallelSizes dp2_ep2;
  dp2_ep2.dp = 2;
  dp2_ep2.ep = 2;
  const std::string full = root_ + "/full", resumed = root_ + "/resumed";
  ASSERT_TRUE(TrainLayout(dp2_ep2, full, 4, false).ok());
  ASSERT_TRUE(TrainLayout(dp2_ep2, resumed, 2, false).ok());
  ASSERT_TRUE(TrainLayout(dp2_ep2, resumed, 4, true).ok());

  train::CheckpointStore store(full, 0);
  auto steps = store.CommittedSteps();
  ASSERT_EQ(steps, (std::vector<int64_t>{2, 4}));
  for (int shard = 0; shard < 2; ++shard) {
    const std::string name = train::CheckpointStore::ShardFileName(shard);
    const std::string a = ReadAll(store.StepDir(4) + "/" + name);
    const std::string b = ReadAll(train::CheckpointStore(resumed, 0).StepDir(4) + "/" + name);
    ASSERT_FALSE(a.empty());
    EXPECT_TRUE(a == b) << name << " differs after the resume";
  }
  // Each shard's manifest entry lists its own parameters: rank 1 holds experts 2 and 3.
  auto loaded = store.Load(4, 1);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  bool has_expert_2 = false, has_expert_0 = false;
  for (const train::ParamInfo& p : loaded->params) {
    has_expert_2 |= p.name == "layers.0.moe.experts.2.w1";
    has_expert_0 |= p.name == "layers.0.moe.experts.0.w1";
  }
  EXPECT_TRUE(has_expert_2);
  EXPECT_FALSE(has_expert_0);

  // The same world size with another layout: refused, naming a tensor.
  topology::ParallelSizes tp2;
  tp2.tp = 2;
  const absl::Status other = TrainLayout(tp2, full, 6, true);
  ASSERT_FALSE(other.ok());
  EXPECT_EQ(other.code(), absl::StatusCode::kFailedPrecondition) << other;
  EXPECT_NE(other.message().find("tensor"), absl::string_view::npos) << other;
}

TEST_F(ParallelCheckpointTest, AsyncCheckpointsCommitTheSameShardsAndResumeBitIdentical) {
  topology::ParallelSizes dp2_ep2;
  dp2_ep2.dp = 2;
  dp2_ep2.ep = 2;
  const std::string sync = root_ + "/sync", full = root_ + "/full", resumed = root_ + "/resumed";
  ASSERT_TRUE(TrainLayout(dp2_ep2, sync, 4, false).ok());
  ASSERT_TRUE(TrainLayout(dp2_ep2, full, 4, false, true).ok());
  ASSERT_TRUE(TrainLayout(dp2_ep2, resumed, 2, false, true).ok());
  ASSERT_TRUE(TrainLayout(dp2_ep2, resumed, 4, true, true).ok());

  train::CheckpointStore store(full, 0);
  ASSERT_EQ(store.CommittedSteps(), (std::vector<int64_t>{2, 4}));
  for (const std::string& dir : {full, resumed}) {
    train::CheckpointStore other(dir, 0);
    auto latest = other.LatestStep();
    ASSERT_TRUE(latest.ok());
    EXPECT_EQ(*latest, std::optional<int64_t>(4)) << dir;
    for (int shard = 0; shard < 2; ++shard) {
      auto loaded = other.Load(4, shard);
      ASSERT_TRUE(loaded.ok()) << loaded.status();
      const std::string name = train::CheckpointStore::ShardFileName(shard);
      const std::string a = ReadAll(train::CheckpointStore(sync, 0).StepDir(4) + "/" + name);
      const std::string b = ReadAll(other.StepDir(4) + "/" + name);
      ASSERT_FALSE(a.empty());
      EXPECT_TRUE(a == b) << dir << "/" << name << " differs from the synchronous run's";
    }
  }
}

TEST_F(ParallelCheckpointTest, SameShapesOtherSlicesAndOtherWorldSizesAreRefused) {
  // dp2 x tp2 with TP neighbours (tp-dp-pp) against the same sizes with DP neighbours: every
  // rank holds tensors of the same shapes, but ranks 1 and 2 hold other column blocks.
  topology::ParallelSizes tp_first;
  tp_first.dp = 2;
  tp_first.tp = 2;
  const std::string dir = root_ + "/dp2tp2";
  ASSERT_TRUE(TrainLayout(tp_first, dir, 2, false).ok());
  topology::ParallelSizes dp_first = tp_first;
  dp_first.order = "dp-tp-pp";
  const absl::Status swapped = TrainLayout(dp_first, dir, 4, true);
  ASSERT_FALSE(swapped.ok());
  EXPECT_EQ(swapped.code(), absl::StatusCode::kFailedPrecondition) << swapped;
  EXPECT_NE(swapped.message().find("(dim "), absl::string_view::npos) << swapped;
  EXPECT_NE(swapped.message().find("parallel layout that wrote it"), absl::string_view::npos);

  // 4 ranks' checkpoint into 8 ranks: the extra ranks have no shard; into 2: too few ranks.
  topology::ParallelSizes dp8;
  dp8.dp = 8;
  const absl::Status bigger = TrainLayout(dp8, dir, 4, true);
  ASSERT_FALSE(bigger.ok());
  EXPECT_EQ(bigger.code(), absl::StatusCode::kFailedPrecondition) << bigger;
  topology::ParallelSizes dp2;
  dp2.dp = 2;
  const absl::Status smaller = TrainLayout(dp2, dir, 4, true);
  ASSERT_FALSE(smaller.ok());
  EXPECT_EQ(smaller.code(), absl::StatusCode::kFailedPrecondition) << smaller;
  EXPECT_NE(smaller.message().find("written by 4 rank(s); this job has 2"), absl::string_view::npos)
      << smaller;
}

}  // namespace
}  // namespace furnace::testing
