// furnace export of a parallel job's checkpoint: one shard per rank, written with the runtime's
// CheckpointStore::WriteShard / Commit as the parallel trainer does, reassembled into whole
// tensors. Values encode their coordinates in the whole tensor, so a misplaced element shows up by
// value; the expected tensors are computed here from the coordinates, not with GlobalIndex.
#include "controller/cli/whole_checkpoint.h"

#include <atomic>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "controller/cli/commands.h"
#include "controller/cli/exit_codes.h"
#include "gtest/gtest.h"
#include "runtime/checkpoint/checkpoint.h"
#include "runtime/checkpoint/safetensors.h"
#include "tests/controller/cli/fake_job_client.h"
#include "tests/controller/cli/job_fixtures.h"
#include "tests/testing/test_dir.h"

namespace furnace::cli {
namespace {

namespace fs = std::filesystem;
using testing::FakeJobClient;
using testing::kT0;
using testing::MakeTrainJob;
using testing_util::TestDir;
using train::ParamInfo;

ParamInfo Param(const std::string& name, std::vector<int64_t> shape, int64_t offset = 0) {
  ParamInfo p;
  p.name = name;
  p.shape = std::move(shape);
  p.offset = offset;
  return p;
}

// The value of element (row, col) of tensor `t` in the whole model saved at `step`.
float Value(int64_t step, int t, int64_t row, int64_t col) {
  return static_cast<float>(step * 1000 + t * 100 + row * 10 + col) + 0.25f;
}

constexpr int kWte = 0, kWpe = 1, kWqkv = 2, kLnf = 3;
constexpr int64_t kV = 4, kT = 2, kD = 3, kCols = 8;  // wqkv: [kD, kCols]

// Columns of wqkv on each of the two ranks: two ranges each (like q, k, v heads of a rank).
const std::vector<std::pair<int64_t, int64_t>> kRanges[2] = {{{0, 2}, {4, 6}}, {{2, 4}, {6, 8}}};

// One rank's shard of a two-rank model. Rank 0: wte, wpe, its wqkv columns. Rank 1: its wqkv
// columns, lnf.weight, and the tied wte again (replicated). Values are laid out as the trainer
// does: each parameter at its offset in one flat array.
struct Shard {
  std::vector<ParamInfo> params;
  std::vector<float> p, m, v;

  void AddWhole(const std::string& name, int t, std::vector<int64_t> shape, int64_t step) {
    ParamInfo info = Param(name, shape, static_cast<int64_t>(p.size()));
    const int64_t rows = shape.size() == 2 ? shape[0] : 1;
    const int64_t cols = shape.back();
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) p.push_back(Value(step, t, r, c));
    }
    params.push_back(std::move(info));
  }
  void AddColumns(const std::string& name, int t,
                  const std::vector<std::pair<int64_t, int64_t>>& ranges, int64_t step) {
    int64_t local_cols = 0;
    for (const auto& [b, e] : ranges) local_cols += e - b;
    ParamInfo info = Param(name, {kD, local_cols}, static_cast<int64_t>(p.size()));
    info.weight_decay = true;
    info.shard.global_shape = {kD, kCols};
    info.shard.dim = 1;
    info.shard.ranges = ranges;
    for (int64_t r = 0; r < kD; ++r) {
      for (const auto& [b, e] : ranges) {
        for (int64_t c = b; c < e; ++c) p.push_back(Value(step, t, r, c));
      }
    }
    params.push_back(std::move(info));
  }
};

std::vector<Shard> TwoRanks(int64_t step) {
  std::vector<Shard> shards(2);
  shards[0].AddWhole("wte", kWte, {kV, kD}, step);
  shards[0].AddWhole("wpe", kWpe, {kT, kD}, step);
  shards[0].AddColumns("layers.0.attn.wqkv", kWqkv, kRanges[0], step);
  shards[1].AddColumns("layers.0.attn.wqkv", kWqkv, kRanges[1], step);
  shards[1].AddWhole("lnf.weight", kLnf, {kD}, step);
  shards[1].AddWhole("wte", kWte, {kV, kD}, step);
  return shards;
}

// Writes every shard, then commits, as SaveCheckpointParallel does.
absl::Status Save(const std::string& dir, int64_t step, std::vector<Shard> shards, int keep = 0) {
  train::CheckpointStore store(dir, keep);
  std::vector<train::ShardRecord> records;
  train::ShardState first;
  for (size_t k = 0; k < shards.size(); ++k) {
    Shard& s = shards[k];
    s.m.assign(s.p.size(), 0.125f);
    s.v.assign(s.p.size(), 0.5f);
    train::ShardState state;
    state.step = step;
    state.data_position = step;
    state.seed = 7;
    state.shard = static_cast<int>(k);
    state.num_shards = static_cast<int>(shards.size());
    state.n = static_cast<int64_t>(s.p.size());
    state.params = s.p.data();
    state.m = s.m.data();
    state.v = s.v.data();
    absl::StatusOr<train::ShardRecord> record = store.WriteShard(state);
    if (!record.ok()) return record.status();
    record->params = s.params;
    record->n = state.n;
    records.push_back(*std::move(record));
    if (k == 0) first = state;
  }
  return store.Commit(shards[0].params, first, records);
}

class ParallelExportTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ckpt_dir_ = dir_ / "ckpt";
    job_ = MakeTrainJob();
    job_.mutable_spec()->mutable_checkpoint()->set_dir(ckpt_dir_);
    client_.get_job = {job_};
    ctx_.client = &client_;
    ctx_.out = &out_;
    ctx_.err = &err_;
    ctx_.clock = &clock_;
    ctx_.sleep = [](double) {};
  }

  absl::StatusOr<int> Export(int64_t step = -1) {
    ExportOptions options;
    options.step = step;
    options.output = output_;
    return RunExport(ctx_, "j-1", options);
  }

  // Every tensor of the export against the whole model saved at `step`.
  void ExpectWholeModel(int64_t step) {
    absl::StatusOr<train::SafetensorsFile> file = train::ReadSafetensors(output_);
    ASSERT_TRUE(file.ok()) << file.status();
    struct Want {
      std::string name;
      int t;
      std::vector<int64_t> shape;
    };
    const std::vector<Want> want = {{"wte", kWte, {kV, kD}},
                                    {"wpe", kWpe, {kT, kD}},
                                    {"layers.0.attn.wqkv", kWqkv, {kD, kCols}},
                                    {"lnf.weight", kLnf, {kD}}};
    ASSERT_EQ(file->tensors.size(), want.size());
    for (const Want& w : want) {
      auto it = file->tensors.find(w.name);
      ASSERT_NE(it, file->tensors.end()) << w.name;
      ASSERT_EQ(it->second.shape, w.shape) << w.name;
      const int64_t rows = w.shape.size() == 2 ? w.shape[0] : 1;
      const int64_t cols = w.shape.back();
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t c = 0; c < cols; ++c) {
          ASSERT_EQ(it->second.data[r * cols + c], Value(step, w.t, r, c))
              << w.name << "[" << r << ", " << c << "]";
        }
      }
    }
    EXPECT_EQ(file->metadata["furnace.step"], std::to_string(step));
  }

  TestDir dir_;
  std::string ckpt_dir_;
  std::string output_ = dir_ / "model.safetensors";
  v1::JobDetail job_;
  FakeJobClient client_;
  std::ostringstream out_, err_;
  FakeClock clock_{kT0};
  CommandContext ctx_;
};

TEST_F(ParallelExportTest, ReassemblesColumnSplitAndReplicatedTensors) {
  ASSERT_TRUE(Save(ckpt_dir_, 10, TwoRanks(10)).ok());
  auto code = Export();
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, kExitOk);
  ExpectWholeModel(10);
  EXPECT_EQ(err_.str(), "");
  // 12 wte + 6 wpe + 24 wqkv + 3 lnf.
  EXPECT_NE(out_.str().find("exported job j-1 step 10 to " + output_ + ": 4 tensors, 45 fp32"),
            std::string::npos)
      << out_.str();
  EXPECT_NE(out_.str().find("step-00000010 (reassembled from 2 shards)\n"), std::string::npos)
      << out_.str();
}

TEST_F(ParallelExportTest, ChosenStepAndJson) {
  ASSERT_TRUE(Save(ckpt_dir_, 10, TwoRanks(10)).ok());
  ASSERT_TRUE(Save(ckpt_dir_, 20, TwoRanks(20)).ok());
  ctx_.json = true;
  auto code = Export(10);
  ASSERT_TRUE(code.ok()) << code.status();
  ExpectWholeModel(10);
  for (const char* want :
       {"\"step\": 10", "\"shards\": 2", "\"tensors\": 4", "\"parameters\": 45"}) {
    EXPECT_NE(out_.str().find(want), std::string::npos) << want << "\n" << out_.str();
  }
}

TEST_F(ParallelExportTest, ReplicasWithinToleranceAreQuiet) {
  std::vector<Shard> shards = TwoRanks(10);
  // wte on rank 1, element [0, 1]: one float step away (about 1e-7 relative).
  const int64_t at = shards[1].params[2].offset + 1;
  shards[1].p[at] = std::nextafter(shards[1].p[at], 1e9f);
  ASSERT_TRUE(Save(ckpt_dir_, 10, shards).ok());
  auto code = Export();
  ASSERT_TRUE(code.ok()) << code.status();
  ExpectWholeModel(10);
  EXPECT_EQ(err_.str(), "");
}

TEST_F(ParallelExportTest, ReplicasThatDisagreeWarnAndKeepTheFirstCopy) {
  std::vector<Shard> shards = TwoRanks(10);
  // wte on rank 1, element [2, 1]: off by a relative 1e-3.
  const int64_t at = shards[1].params[2].offset + 2 * kD + 1;
  shards[1].p[at] = shards[1].p[at] * 1.001f;
  ASSERT_TRUE(Save(ckpt_dir_, 10, shards).ok());
  auto code = Export();
  ASSERT_TRUE(code.ok()) << code.status();
  ExpectWholeModel(10);  // rank 0's wte
  EXPECT_NE(err_.str().find("furnace: warning: checkpoint " + ckpt_dir_ +
                            "/step-00000010: replicas of wte disagree: shard 1's copy differs in "
                            "1 of 12 shared elements by more than 1e-06 relative"),
            std::string::npos)
      << err_.str();
  EXPECT_NE(err_.str().find("at [2, 1]); kept the copy read first"), std::string::npos)
      << err_.str();
}

TEST_F(ParallelExportTest, ColumnsOnNoShardAreRefused) {
  std::vector<Shard> shards = TwoRanks(10);
  // Rank 1 holds only columns [2, 4): columns 6 and 7 are nowhere.
  shards[1] = Shard();
  shards[1].AddColumns("layers.0.attn.wqkv", kWqkv, {{2, 4}}, 10);
  shards[1].AddWhole("lnf.weight", kLnf, {kD}, 10);
  ASSERT_TRUE(Save(ckpt_dir_, 10, shards).ok());
  auto code = Export(10);
  EXPECT_EQ(ExitCodeForStatus(code.status()), kExitLocalError);
  EXPECT_TRUE(absl::IsDataLoss(code.status())) << code.status();
  EXPECT_EQ(code.status().message(),
            "checkpoint " + ckpt_dir_ +
                "/step-00000010: tensor layers.0.attn.wqkv [3, 8]: 6 of 24 elements are on no "
                "shard (the first at [0, 6])");
  EXPECT_FALSE(fs::exists(output_));
}

TEST_F(ParallelExportTest, DamagedNewestFallsBackToTheOlderCheckpoint) {
  ASSERT_TRUE(Save(ckpt_dir_, 10, TwoRanks(10)).ok());
  std::vector<Shard> broken = TwoRanks(20);
  broken[1].params[0].shard.ranges = {{2, 4}};  // 4 local columns, ranges for 2
  ASSERT_TRUE(Save(ckpt_dir_, 20, broken).ok());
  auto code = Export();
  ASSERT_TRUE(code.ok()) << code.status();
  ExpectWholeModel(10);
  // The loader checks every shard's entries when it reads the manifest.
  EXPECT_NE(
      err_.str().find("furnace: skipped a newer checkpoint: checkpoint manifest " + ckpt_dir_ +
                      "/step-00000020/manifest.json: shard shard-00001.bin: parameter "
                      "layers.0.attn.wqkv: local shape [3, 4], a part of [3, 8] along dim "
                      "1: the ranges hold 2 of dim 1, the shape 4"),
      std::string::npos)
      << err_.str();
}

TEST_F(ParallelExportTest, CorruptSecondShardFallsBack) {
  ASSERT_TRUE(Save(ckpt_dir_, 10, TwoRanks(10)).ok());
  ASSERT_TRUE(Save(ckpt_dir_, 20, TwoRanks(20)).ok());
  const std::string shard = train::CheckpointStore(ckpt_dir_, 0).StepDir(20) + "/" +
                            train::CheckpointStore::ShardFileName(1);
  {
    std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(train::kShardHeaderBytes + 3);
    f.put('\x7f');
  }
  auto code = Export();
  ASSERT_TRUE(code.ok()) << code.status();
  ExpectWholeModel(10);
  EXPECT_NE(err_.str().find("furnace: skipped a newer checkpoint: checkpoint shard " + shard),
            std::string::npos)
      << err_.str();
  // Asked for by step, the damage is the error.
  code = Export(20);
  EXPECT_TRUE(absl::IsDataLoss(code.status())) << code.status();
  EXPECT_NE(code.status().message().find("checkpoint shard " + shard + ": checksum mismatch"),
            std::string::npos)
      << code.status();
}

// A running job with checkpoint.keep 1 deletes the step an export is reading when it commits the
// next: the export reads again from the new LATEST instead of failing with "no usable checkpoint".
TEST_F(ParallelExportTest, AStepPrunedWhileItIsReadIsReadAgainFromTheNewLatest) {
  ASSERT_TRUE(Save(ckpt_dir_, 1, TwoRanks(1), /*keep=*/1).ok());
  constexpr int64_t kLastStep = 100;
  std::atomic<bool> done{false};
  absl::Status written;
  std::thread job([&] {
    for (int64_t step = 2; step <= kLastStep && written.ok(); ++step) {
      written = Save(ckpt_dir_, step, TwoRanks(step), /*keep=*/1);
    }
    done = true;
  });
  const train::CheckpointStore store(ckpt_dir_, /*keep=*/0);
  int reads = 0;
  std::vector<std::string> failures;
  do {
    absl::StatusOr<WholeCheckpoint> whole = LoadLatestWholeCheckpoint(store);
    ++reads;
    if (!whole.ok()) {
      failures.push_back(std::string(whole.status().message()));
      continue;
    }
    // Whatever step it read, it read all of that step's values.
    for (const WholeTensor& t : whole->tensors) {
      if (t.name == "wte" && t.data[0] != Value(whole->step, kWte, 0, 0)) {
        failures.push_back(absl::StrCat("step ", whole->step, ": wte[0] is ", t.data[0]));
      }
    }
  } while (!done);
  job.join();
  ASSERT_TRUE(written.ok()) << written;
  EXPECT_GT(reads, 0);
  EXPECT_TRUE(failures.empty()) << failures.size() << " of " << reads
                                << " reads failed; the first: "
                                << (failures.empty() ? "" : failures.front());
}

// TensorAssembler alone: order and inconsistent shards.

ParamInfo Scalar(const std::string& name, int64_t offset) { return Param(name, {1}, offset); }

std::vector<std::string> Names(const std::vector<WholeTensor>& tensors) {
  std::vector<std::string> names;
  for (const WholeTensor& t : tensors) names.push_back(t.name);
  return names;
}

TEST(TensorAssemblerTest, SingleProcessOrderWhateverTheRankOrder) {
  // Rank 0: the second pipeline stage (layer 1, lnf, the tied wte). Ranks 1 and 2: the first
  // stage, experts 0-1 and 2-3 of layer 0 (expert parallelism).
  const std::vector<std::vector<std::string>> ranks = {
      {"layers.1.ln1.weight", "layers.1.mlp.w1", "lnf.weight", "lnf.bias", "wte"},
      {"wte", "wpe", "layers.0.ln1.weight", "layers.0.moe.experts.0.w1",
       "layers.0.moe.experts.1.w1", "layers.0.moe.experts.0.b1", "layers.0.moe.experts.1.b1"},
      {"wte", "wpe", "layers.0.ln1.weight", "layers.0.moe.experts.2.w1",
       "layers.0.moe.experts.3.w1", "layers.0.moe.experts.2.b1", "layers.0.moe.experts.3.b1"}};
  TensorAssembler a("checkpoint x", /*max_elements=*/64);
  const std::vector<float> data(8, 1.0f);
  for (size_t r = 0; r < ranks.size(); ++r) {
    std::vector<ParamInfo> params;
    for (const std::string& name : ranks[r]) {
      params.push_back(Scalar(name, static_cast<int64_t>(params.size())));
    }
    ASSERT_TRUE(a.AddShard(static_cast<int>(r), params, data.data(), 8).ok());
  }
  absl::StatusOr<std::vector<WholeTensor>> tensors = a.Finish();
  ASSERT_TRUE(tensors.ok()) << tensors.status();
  EXPECT_EQ(Names(*tensors), (std::vector<std::string>{
                                 "wte", "wpe", "layers.0.ln1.weight", "layers.0.moe.experts.0.w1",
                                 "layers.0.moe.experts.1.w1", "layers.0.moe.experts.2.w1",
                                 "layers.0.moe.experts.3.w1", "layers.0.moe.experts.0.b1",
                                 "layers.0.moe.experts.1.b1", "layers.0.moe.experts.2.b1",
                                 "layers.0.moe.experts.3.b1", "layers.1.ln1.weight",
                                 "layers.1.mlp.w1", "lnf.weight", "lnf.bias"}));
  EXPECT_TRUE(a.warnings().empty());
}

TEST(TensorAssemblerTest, ShapesThatDisagreeBetweenShards) {
  TensorAssembler a("checkpoint x", /*max_elements=*/64);
  const std::vector<float> data(8, 0.0f);
  ASSERT_TRUE(a.AddShard(0, {Param("wpe", {2, 3})}, data.data(), 8).ok());
  absl::Status s = a.AddShard(1, {Param("wpe", {3, 2})}, data.data(), 8);
  EXPECT_TRUE(absl::IsDataLoss(s)) << s;
  EXPECT_EQ(s.message(),
            "checkpoint x, shard 1: parameter wpe: the whole tensor is [3, 2] here but [2, 3] on "
            "shard 0");
}

TEST(TensorAssemblerTest, PartOutsideTheStoredValues) {
  TensorAssembler a("checkpoint x", /*max_elements=*/64);
  const std::vector<float> data(8, 0.0f);
  absl::Status s = a.AddShard(0, {Param("wpe", {2, 3}, 4)}, data.data(), 8);
  EXPECT_TRUE(absl::IsDataLoss(s)) << s;
  EXPECT_EQ(s.message(),
            "checkpoint x, shard 0: parameter wpe [4, +6) lies outside the 8 stored values");
}

TEST(TensorAssemblerTest, ImplausiblyLargeWholeTensor) {
  TensorAssembler a("checkpoint x", /*max_elements=*/64);
  ParamInfo p = Param("wpe", {2, 3});
  p.shard.global_shape = {2, int64_t{1} << 40};
  p.shard.dim = 1;
  p.shard.ranges = {{0, 3}};
  const std::vector<float> data(6, 0.0f);
  absl::Status s = a.AddShard(0, {p}, data.data(), 6);
  EXPECT_TRUE(absl::IsDataLoss(s)) << s;
  EXPECT_EQ(s.message(),
            "checkpoint x, shard 0: parameter wpe: the whole tensor [2, 1099511627776] has more "
            "elements than all shards store (64)");
}

TEST(TensorAssemblerTest, RowSplitPlacesRows) {
  // Row-parallel [4, 2] on two ranks along dim 0, rank 1 listed first.
  TensorAssembler a("checkpoint x", /*max_elements=*/64);
  ParamInfo top = Param("layers.0.attn.wo", {2, 2});
  top.shard.global_shape = {4, 2};
  top.shard.dim = 0;
  top.shard.ranges = {{0, 2}};
  ParamInfo bottom = top;
  bottom.shard.ranges = {{2, 4}};
  const std::vector<float> first = {0, 1, 2, 3}, second = {4, 5, 6, 7};
  ASSERT_TRUE(a.AddShard(1, {bottom}, second.data(), 4).ok());
  ASSERT_TRUE(a.AddShard(0, {top}, first.data(), 4).ok());
  absl::StatusOr<std::vector<WholeTensor>> tensors = a.Finish();
  ASSERT_TRUE(tensors.ok()) << tensors.status();
  ASSERT_EQ(tensors->size(), 1u);
  EXPECT_EQ((*tensors)[0].shape, (std::vector<int64_t>{4, 2}));
  EXPECT_EQ((*tensors)[0].data, (std::vector<float>{0, 1, 2, 3, 4, 5, 6, 7}));
}

}  // namespace
}  // namespace furnace::cli
