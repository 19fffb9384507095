// Checkpoints of a parallel layout (ranks are threads here, comm::LocalGroup): every rank writes
// its shard and rank 0 commits one manifest; a run restored from step 2 and trained to step 4
// ends with shard files byte-identical to an uninterrupted run. A checkpoint loads into any other
// layout of the same model (dp 4 x ep 4 -> dp 2 x ep 2, pp 2 -> pp 1, tp 2 -> tp 1, one order
// -> another, 4 ranks -> 8 and -> 1): the parameters at the switch step, re-saved by the new
// layout and gathered whole, are bit-identical to the old layout's, and the loss curve continues
// the uninterrupted run's within the layout tests' tolerance (1e-5 relative: the layouts sum in
// other orders). A checkpoint of another model is refused naming the tensor.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gtest/gtest.h"
#include "kernels/blas.h"
#include "runtime/checkpoint/checkpoint.h"
#include "runtime/checkpoint/reshard.h"
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

struct TrainOptions {
  int micro_batches = 2;       // per data-parallel rank
  bool async = false;          // checkpoint.async
  bool save_restored = false;  // after restoring, save the restored state again (this layout)
  int d_model = 16;            // another model's checkpoint: another width
  std::vector<double>* losses = nullptr;                               // per step run (rank 0's)
  std::vector<std::vector<std::string>>* checkpoint_errors = nullptr;  // per rank, after Run
  std::string rank1_dir = "";  // rank 1's checkpoint.dir when not empty (another host's view)
  std::vector<std::string>* passed_over = nullptr;  // rank 0's account of the steps passed over
  // A checkpointed stop (StopToken::RequestCheckpointedStop) asked of rank `stop_rank` alone, in
  // the callback of step index `stop_after` (-1: none); each rank's step() and
  // stopped_on_request() after Run, in `stopped`.
  int stop_rank = -1;
  int stop_after = -1;
  std::vector<std::pair<int64_t, bool>>* stopped = nullptr;
};

// Trains `steps` steps (restoring first when `restore`), checkpointing every 2 steps into dir.
absl::Status TrainLayout(const topology::ParallelSizes& sizes, const std::string& dir, int steps,
                         bool restore, const TrainOptions& o = {}) {
  LocalWorld world;
  model::ModelConfig c = Tiny();
  c.d_model = o.d_model;
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
    tc.micro_batches = o.micro_batches;
    tc.seed = 3;
    tc.schedule.lr = 3e-3;
    tc.schedule.max_steps = 4;
    tc.checkpoint.dir = rank == 1 && !o.rank1_dir.empty() ? o.rank1_dir : dir;
    tc.checkpoint.every = 2;
    tc.checkpoint.keep = 0;
    tc.checkpoint.async = o.async;
    auto trainer =
        train::Trainer::Create(model->get(), sampler->get(), tc, nullptr, &(*layout)->runtime);
    if (!trainer.ok()) return trainer.status();
    if (restore) {
      auto loaded = (*trainer)->RestoreLatest();
      if (!loaded.ok()) return loaded.status();
      if (rank == 0 && o.passed_over != nullptr) *o.passed_over = loaded->skipped;
      if (o.save_restored) {
        if (absl::Status s = (*trainer)->SaveCheckpoint(); !s.ok()) return s;
      }
    }
    train::StopToken stop;
    absl::Status ran = (*trainer)->Run(
        [&](const train::StepStats& s) {
          if (rank == 0 && o.losses != nullptr) o.losses->push_back(s.loss);
          if (rank == o.stop_rank && s.step == o.stop_after) stop.RequestCheckpointedStop();
        },
        &stop);
    if (o.stopped != nullptr) {
      (*o.stopped)[rank] = {(*trainer)->step(), (*trainer)->stopped_on_request()};
    }
    if (o.checkpoint_errors != nullptr)
      (*o.checkpoint_errors)[rank] = (*trainer)->checkpoint_errors();
    return ran;
  });
  for (const absl::Status& s : statuses) {
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

// Committed step `step` of `dir` gathered into whole tensors (one process's layout), by name.
absl::StatusOr<std::map<std::string, std::vector<float>>> WholeAt(const std::string& dir,
                                                                  int64_t step) {
  train::CheckpointStore store(dir, 0);
  auto manifest = store.ReadManifest(step);
  if (!manifest.ok()) return manifest.status();
  std::vector<train::ParamInfo> whole;
  int64_t n = 0;
  for (const train::ShardRecord& shard : manifest->shards) {
    for (const train::ParamInfo& p : shard.params) {
      if (std::any_of(whole.begin(), whole.end(),
                      [&](const train::ParamInfo& w) { return w.name == p.name; })) {
        continue;
      }
      train::ParamInfo w;
      w.name = p.name;
      w.offset = n;
      w.shape = p.shard.sharded() ? p.shard.global_shape : p.shape;
      n += w.numel();
      whole.push_back(std::move(w));
    }
  }
  auto loaded = train::LoadIntoLayout(store, step, whole, n, 0);
  if (!loaded.ok()) return loaded.status();
  std::map<std::string, std::vector<float>> out;
  for (const train::ParamInfo& p : whole) {
    for (const std::vector<float>* a : {&loaded->param_data, &loaded->m, &loaded->v}) {
      out[p.name].insert(out[p.name].end(), a->begin() + p.offset,
                         a->begin() + p.offset + p.numel());
    }
  }
  return out;
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

TEST_F(ParallelCheckpointTest, ResumedRunEndsBitIdentical) {
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
}

// A checkpointed stop asked of one rank (its agent got SIGUSR1: a cancel, a drained worker) stops
// every rank after the same step, the one whose all-reduce carried it, with that step's checkpoint
// committed; the run resumed from it ends bit-identical to one never stopped. Sync and async.
TEST_F(ParallelCheckpointTest, ACheckpointedStopOfOneRankStopsAllAfterTheSameStepAndSavesIt) {
  topology::ParallelSizes dp2_ep2;
  dp2_ep2.dp = 2;
  dp2_ep2.ep = 2;
  const std::string full = root_ + "/full";
  ASSERT_TRUE(TrainLayout(dp2_ep2, full, 4, false).ok());
  for (const bool async : {false, true}) {
    SCOPED_TRACE(async ? "async" : "sync");
    const std::string dir = root_ + (async ? "/stopped-async" : "/stopped");
    std::vector<std::pair<int64_t, bool>> stopped(2);
    TrainOptions o;
    o.async = async;
    o.stop_rank = 1;
    o.stop_after = 1;  // asked after step index 1: agreed in step index 2's all-reduce
    o.stopped = &stopped;
    ASSERT_TRUE(TrainLayout(dp2_ep2, dir, 6, false, o).ok());
    for (int rank = 0; rank < 2; ++rank) {
      EXPECT_EQ(stopped[rank], std::make_pair(int64_t{3}, true)) << "rank " << rank;
    }
    EXPECT_EQ(train::CheckpointStore(dir, 0).CommittedSteps(), (std::vector<int64_t>{2, 3}));

    TrainOptions resumed;
    resumed.async = async;
    ASSERT_TRUE(TrainLayout(dp2_ep2, dir, 4, true, resumed).ok());
    for (int shard = 0; shard < 2; ++shard) {
      const std::string name = train::CheckpointStore::ShardFileName(shard);
      const std::string a = ReadAll(train::CheckpointStore(full, 0).StepDir(4) + "/" + name);
      const std::string b = ReadAll(train::CheckpointStore(dir, 0).StepDir(4) + "/" + name);
      ASSERT_FALSE(a.empty());
      EXPECT_TRUE(a == b) << name << " differs after the stop and resume";
    }
  }
}

TEST_F(ParallelCheckpointTest, AsyncCheckpointsCommitTheSameShardsAndResumeBitIdentical) {
  topology::ParallelSizes dp2_ep2;
  dp2_ep2.dp = 2;
  dp2_ep2.ep = 2;
  const std::string sync = root_ + "/sync", full = root_ + "/full", resumed = root_ + "/resumed";
  ASSERT_TRUE(TrainLayout(dp2_ep2, sync, 4, false).ok());
  ASSERT_TRUE(TrainLayout(dp2_ep2, full, 4, false, {.async = true}).ok());
  ASSERT_TRUE(TrainLayout(dp2_ep2, resumed, 2, false, {.async = true}).ok());
  ASSERT_TRUE(TrainLayout(dp2_ep2, resumed, 4, true, {.async = true}).ok());

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

// Rank 0 commits in the background; when that fails (here LATEST cannot be replaced: a
// directory stands in its place), every rank reports the uncommitted checkpoint at the same point
// and training goes on to the end, where the final checkpoint, written again in the foreground,
// fails every rank: the run does not end as a success without it.
TEST_F(ParallelCheckpointTest, AFailedBackgroundCommitIsReportedByEveryRankAndTrainingGoesOn) {
  topology::ParallelSizes dp2_ep2;
  dp2_ep2.dp = 2;
  dp2_ep2.ep = 2;
  const std::string dir = root_ + "/latest-blocked";
  std::filesystem::create_directories(dir + "/LATEST");
  std::vector<std::vector<std::string>> errors(2);
  const absl::Status ran =
      TrainLayout(dp2_ep2, dir, 4, false, {.async = true, .checkpoint_errors = &errors});
  EXPECT_NE(ran.message().find("the final checkpoint (step 4) failed in the background and "
                               "again in the foreground"),
            std::string::npos)
      << ran;
  for (int rank = 0; rank < 2; ++rank) {
    ASSERT_EQ(errors[rank].size(), 2u) << "rank " << rank;
    EXPECT_NE(errors[rank][0].find("checkpoint of step 2 not committed"), std::string::npos)
        << errors[rank][0];
    EXPECT_NE(errors[rank][1].find("checkpoint of step 4 not committed"), std::string::npos)
        << errors[rank][1];
  }
  // Rank 0 has the cause; rank 1 knows where it is.
  EXPECT_NE(errors[0][0].find("LATEST"), std::string::npos) << errors[0][0];
  EXPECT_NE(errors[1][0].find("rank 0"), std::string::npos) << errors[1][0];
  EXPECT_FALSE(train::CheckpointStore(dir, 0).LatestStep().ok());
}

struct Reshard {
  const char* name;
  int pp, dp, tp, ep;
  const char* order;
};

topology::ParallelSizes SizesOf(const Reshard& r) {
  topology::ParallelSizes s;
  s.pp = r.pp;
  s.dp = r.dp;
  s.tp = r.tp;
  s.ep = r.ep;
  if (r.order != nullptr) s.order = r.order;
  return s;
}

// The global batch is 4 micro-batches of 2 sequences on every layout: m = 4 / dp.
constexpr int kGlobalMicroBatches = 4;

TEST_F(ParallelCheckpointTest, ACheckpointLoadsIntoEveryOtherLayout) {
  const std::vector<std::pair<Reshard, std::vector<Reshard>>> cases = {
      {{"dp4 x ep4", 1, 4, 1, 4, nullptr},
       {{"dp2 x ep2", 1, 2, 1, 2, nullptr}, {"one rank", 1, 1, 1, 1, nullptr}}},
      {{"pp2 x dp2", 2, 2, 1, 1, nullptr},
       {{"pp1 x dp2", 1, 2, 1, 1, nullptr}, {"pp2 x dp4 x ep2", 2, 4, 1, 2, nullptr}}},
      {{"tp2 x dp2", 1, 2, 2, 1, nullptr},
       {{"tp1 x dp2", 1, 2, 1, 1, nullptr}, {"tp2 x dp2, dp-tp-pp", 1, 2, 2, 1, "dp-tp-pp"}}},
  };
  for (const auto& [from, targets] : cases) {
    SCOPED_TRACE(from.name);
    const std::string full = root_ + "/full", base = root_ + "/base";
    std::filesystem::remove_all(full);
    std::filesystem::remove_all(base);
    std::vector<double> want;
    ASSERT_TRUE(TrainLayout(SizesOf(from), full, 4, false,
                            {.micro_batches = kGlobalMicroBatches / from.dp, .losses = &want})
                    .ok());
    ASSERT_TRUE(
        TrainLayout(SizesOf(from), base, 2, false, {.micro_batches = kGlobalMicroBatches / from.dp})
            .ok());
    auto at_switch = WholeAt(base, 2);
    ASSERT_TRUE(at_switch.ok()) << at_switch.status();
    for (const Reshard& to : targets) {
      SCOPED_TRACE(to.name);
      const std::string dir = root_ + "/" + std::to_string(to.pp * 100 + to.dp * 10 + to.tp);
      std::filesystem::remove_all(dir);
      std::filesystem::copy(base, dir, std::filesystem::copy_options::recursive);
      std::vector<double> got;
      const absl::Status resumed = TrainLayout(
          SizesOf(to), dir, 4, true,
          {.micro_batches = kGlobalMicroBatches / to.dp, .save_restored = true, .losses = &got});
      ASSERT_TRUE(resumed.ok()) << resumed;
      // Step 2 re-saved by the new layout holds the old layout's values, bit for bit.
      auto resaved = WholeAt(dir, 2);
      ASSERT_TRUE(resaved.ok()) << resaved.status();
      ASSERT_EQ(resaved->size(), at_switch->size());
      for (const auto& [name, values] : *at_switch) {
        const std::vector<float>& other = resaved->at(name);
        ASSERT_EQ(other.size(), values.size()) << name;
        EXPECT_EQ(std::memcmp(other.data(), values.data(), values.size() * sizeof(float)), 0)
            << name << " changed when " << to.name << " loaded and re-saved it";
      }
      // Steps 2 and 3 continue the uninterrupted run's losses.
      ASSERT_EQ(got.size(), 2u);
      for (size_t i = 0; i < got.size(); ++i) {
        EXPECT_NEAR(got[i], want[2 + i], 1e-5 * std::fabs(want[2 + i]))
            << "step " << 2 + i << " after switching to " << to.name;
      }
    }
  }
}

TEST_F(ParallelCheckpointTest, AnotherModelsCheckpointIsRefusedNamingTheTensor) {
  topology::ParallelSizes dp2;
  dp2.dp = 2;
  const std::string dir = root_ + "/dp2";
  ASSERT_TRUE(TrainLayout(dp2, dir, 2, false).ok());
  // The same tensors, 32 wide: every rank refuses with the same cause.
  const absl::Status wider = TrainLayout(dp2, dir, 4, true, {.d_model = 32});
  ASSERT_FALSE(wider.ok());
  EXPECT_EQ(wider.code(), absl::StatusCode::kFailedPrecondition) << wider;
  EXPECT_NE(wider.message().find("there and [32"), absl::string_view::npos) << wider;
  EXPECT_NE(wider.message().find("written by another model"), absl::string_view::npos) << wider;
}

// Two damaged shards of different steps: rank 0's of step 6, rank 1's of step 4. Rank 0 finds 4,
// rank 1 finds 6, they agree on 4, which rank 1 cannot load: both go down to 2 and resume from
// it. Before, every attempt failed the same way.
TEST_F(ParallelCheckpointTest, TwoDamagedShardsOfDifferentStepsResumeFromTheStepBelowBoth) {
  topology::ParallelSizes dp2;
  dp2.dp = 2;
  const std::string dir = root_ + "/dp2";
  ASSERT_TRUE(TrainLayout(dp2, dir, 6, false).ok());
  train::CheckpointStore store(dir, 0);
  ASSERT_EQ(store.CommittedSteps(), (std::vector<int64_t>{2, 4, 6}));
  for (const auto& [step, shard] : {std::pair<int64_t, int>{6, 0}, {4, 1}}) {
    const std::string path =
        store.StepDir(step) + "/" + train::CheckpointStore::ShardFileName(shard);
    std::string bytes = ReadAll(path);
    bytes[80] ^= 0x01;
    testing_util::WriteAll(path, bytes);
  }
  std::vector<double> losses;
  std::vector<std::string> passed;
  const absl::Status resumed =
      TrainLayout(dp2, dir, 8, true, {.losses = &losses, .passed_over = &passed});
  ASSERT_TRUE(resumed.ok()) << resumed;
  EXPECT_EQ(losses.size(), 6u);  // steps 3 to 8: resumed from 2
  // Rank 0's account names the rank that could not load each step (its own log says why).
  const std::string account = absl::StrJoin(passed, " | ");
  EXPECT_NE(account.find("step 4: rank 1 could not load its shard"), std::string::npos) << account;
  EXPECT_EQ(store.CommittedSteps(), (std::vector<int64_t>{2, 4, 6, 8}));  // 4 and 6 rewritten
  EXPECT_TRUE(store.Load(4, 1).ok());
  EXPECT_TRUE(store.Load(6, 0).ok());
}

// A shard one rank needs exists but cannot be read (a network file system's I/O error; here a
// directory in its place): every rank fails, retryably, rather than resume from the step before,
// whose next checkpoint would uncommit the newer steps. Readable again, the run resumes from the
// newest step.
TEST_F(ParallelCheckpointTest, AShardThatCannotBeReadFailsEveryRankAndLosesNoStep) {
  topology::ParallelSizes dp2;
  dp2.dp = 2;
  const std::string dir = root_ + "/dp2";
  ASSERT_TRUE(TrainLayout(dp2, dir, 6, false).ok());
  train::CheckpointStore store(dir, 0);
  const std::string shard = store.StepDir(6) + "/" + train::CheckpointStore::ShardFileName(1);
  std::filesystem::rename(shard, root_ + "/aside");
  std::filesystem::create_directory(shard);
  const absl::Status resumed = TrainLayout(dp2, dir, 8, true);
  ASSERT_FALSE(resumed.ok());
  EXPECT_EQ(resumed.code(), absl::StatusCode::kUnavailable) << resumed;
  EXPECT_NE(resumed.message().find(shard), absl::string_view::npos) << resumed;
  EXPECT_EQ(store.CommittedSteps(), (std::vector<int64_t>{2, 4, 6}));

  std::filesystem::remove(shard);
  std::filesystem::rename(root_ + "/aside", shard);
  std::vector<double> losses;
  ASSERT_TRUE(TrainLayout(dp2, dir, 8, true, {.losses = &losses}).ok());
  EXPECT_EQ(losses.size(), 2u);  // steps 7 and 8: resumed from 6
}

// One rank's checkpoint.dir is not rank 0's (its host lacks the shared mount): every rank fails
// at the start, retryably, naming it, before anything is loaded or written. Before, every rank
// started afresh and wrote step 2 over the run's checkpoints.
TEST_F(ParallelCheckpointTest, ARankThatSeesNoCheckpointWhereOthersDoFailsEveryRank) {
  topology::ParallelSizes dp2;
  dp2.dp = 2;
  const std::string dir = root_ + "/dp2", empty = root_ + "/unmounted";
  ASSERT_TRUE(TrainLayout(dp2, dir, 2, false).ok());
  std::filesystem::create_directories(empty);
  const absl::Status resumed = TrainLayout(dp2, dir, 4, true, {.rank1_dir = empty});
  ASSERT_FALSE(resumed.ok());
  EXPECT_EQ(resumed.code(), absl::StatusCode::kUnavailable) << resumed;
  EXPECT_NE(
      resumed.message().find("is not the directory rank 0 writes in on the host of rank(s) 1"),
      absl::string_view::npos)
      << resumed;
  EXPECT_NE(resumed.message().find("one file system that every rank's host shares"),
            absl::string_view::npos)
      << resumed;
  EXPECT_EQ(train::CheckpointStore(dir, 0).CommittedSteps(), (std::vector<int64_t>{2}));
}

}  // namespace
}  // namespace furnace::testing
