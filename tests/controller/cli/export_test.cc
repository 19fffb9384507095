// furnace export against a fake JobClient and real checkpoints written with the runtime's
// CheckpointStore in a temp dir; the output is read back with the runtime's safetensors reader.
#include <filesystem>
#include <fstream>
#include <sstream>

#include "controller/cli/commands.h"
#include "controller/cli/exit_codes.h"
#include "controller/cli/format.h"
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

// A three-tensor model with MODEL.md names whose values encode the step they were saved at, so an
// export shows by value which checkpoint it read.
struct Model {
  std::vector<train::ParamInfo> params = {
      {.name = "wte", .shape = {8, 4}, .offset = 0, .weight_decay = true},
      {.name = "layers.0.attn.wqkv", .shape = {4, 12}, .offset = 32, .weight_decay = true},
      {.name = "lnf.g", .shape = {4}, .offset = 80}};
  static constexpr int64_t kN = 84;
  std::vector<float> p, m, v;
  explicit Model(int64_t step) {
    for (int64_t i = 0; i < kN; ++i) {
      p.push_back(static_cast<float>(step) + 0.01f * static_cast<float>(i) - 0.5f);
      m.push_back(0.25f);
      v.push_back(0.5f);
    }
  }
  absl::Status Save(const std::string& dir, int64_t step, const std::string& job = "") const {
    train::ShardState s;
    s.job = job;
    s.step = step;
    s.data_position = step;
    s.seed = 7;
    s.n = kN;
    s.params = p.data();
    s.m = m.data();
    s.v = v.data();
    return train::CheckpointStore(dir, /*keep=*/0).Save(params, s);
  }
};

class ExportTest : public ::testing::Test {
 protected:
  void SetUp() override {
    setenv("TZ", "UTC", 1);
    tzset();
    ckpt_dir_ = dir_ / "ckpt";
    job_ = MakeTrainJob();
    job_.mutable_spec()->mutable_checkpoint()->set_dir(ckpt_dir_);
    job_.mutable_spec()->mutable_checkpoint()->set_every(10);
    job_.mutable_spec()->mutable_model()->set_d_model(4);
    job_.mutable_spec()->mutable_moe()->set_experts(4);
    client_.get_job = {job_};
    ctx_.client = &client_;
    ctx_.out = &out_;
    ctx_.err = &err_;
    ctx_.clock = &clock_;
    ctx_.sleep = [](double) {};
  }

  absl::StatusOr<int> Export(int64_t step = -1, std::string format = "safetensors") {
    ExportOptions options;
    options.step = step;
    options.format = std::move(format);
    options.output = output_;
    return RunExport(ctx_, "j-1", options);
  }

  // Checks every tensor of `output_` against the model saved at `step`.
  void ExpectExportOf(int64_t step) {
    absl::StatusOr<train::SafetensorsFile> file = train::ReadSafetensors(output_);
    ASSERT_TRUE(file.ok()) << file.status();
    const Model want(step);
    ASSERT_EQ(file->tensors.size(), want.params.size());
    for (const auto& p : want.params) {
      auto it = file->tensors.find(p.name);
      ASSERT_NE(it, file->tensors.end()) << p.name;
      EXPECT_EQ(it->second.shape, p.shape) << p.name;
      ASSERT_EQ(static_cast<int64_t>(it->second.data.size()), p.numel()) << p.name;
      for (int64_t i = 0; i < p.numel(); ++i) {
        ASSERT_EQ(it->second.data[i], want.p[p.offset + i]) << p.name << "[" << i << "]";
      }
    }
    EXPECT_EQ(file->metadata["furnace.step"], std::to_string(step));
    EXPECT_EQ(file->metadata["furnace.job_id"], "j-1");
    EXPECT_EQ(file->metadata["furnace.seed"], "7");
    EXPECT_EQ(file->metadata["furnace.model"], "{\"d_model\":4}");
    EXPECT_EQ(file->metadata["furnace.moe"], "{\"experts\":4}");
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

TEST_F(ExportTest, NewestCheckpointByDefault) {
  ASSERT_TRUE(Model(10).Save(ckpt_dir_, 10).ok());
  ASSERT_TRUE(Model(20).Save(ckpt_dir_, 20).ok());
  auto code = Export();
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, kExitOk);
  EXPECT_EQ(client_.get_job_ids, std::vector<std::string>{"j-1"});
  ExpectExportOf(20);
  const auto bytes = fs::file_size(output_);
  EXPECT_EQ(out_.str(), "exported job j-1 step 20 to " + output_ + ": 3 tensors, 84 fp32 " +
                            "parameters, " + FormatBytes(bytes) + " (" +
                            FormatCount(static_cast<int64_t>(bytes)) + " bytes)\n  from " +
                            ckpt_dir_ + "/step-00000020\n");
  EXPECT_EQ(err_.str(), "");
}

TEST_F(ExportTest, ChosenStep) {
  ASSERT_TRUE(Model(10).Save(ckpt_dir_, 10).ok());
  ASSERT_TRUE(Model(20).Save(ckpt_dir_, 20).ok());
  auto code = Export(10);
  ASSERT_TRUE(code.ok()) << code.status();
  ExpectExportOf(10);
  EXPECT_NE(out_.str().find("exported job j-1 step 10"), std::string::npos) << out_.str();
}

// A directory two jobs wrote in turn (a later job named j-1's checkpoint.dir once it had ended):
// j-1's export is its own newest step, never the later job's weights under j-1's name.
TEST_F(ExportTest, AStepAnotherJobWroteInTheSameDirectoryIsNotThisJobs) {
  ASSERT_TRUE(Model(10).Save(ckpt_dir_, 10, "j-1").ok());
  ASSERT_TRUE(Model(20).Save(ckpt_dir_, 20, "j-2").ok());
  auto code = Export();
  ASSERT_TRUE(code.ok()) << code.status();
  ExpectExportOf(10);
  EXPECT_NE(err_.str().find("steps after 10 in " + ckpt_dir_ +
                            " (the newest, 20) were written by job j-2, not j-1"),
            std::string::npos)
      << err_.str();

  // Asked for by step: refused, naming the job that wrote it.
  code = Export(20);
  EXPECT_EQ(ExitCodeForStatus(code.status()), kExitLocalError);
  EXPECT_EQ(code.status().message(),
            "step 20 in " + ckpt_dir_ +
                " was written by job j-2, not j-1 (the directory was used by both): furnace "
                "export j-2 --step 20");

  // None of its own: refused, not another job's weights.
  fs::remove_all(ckpt_dir_);
  ASSERT_TRUE(Model(20).Save(ckpt_dir_, 20, "j-2").ok());
  code = Export();
  EXPECT_EQ(ExitCodeForStatus(code.status()), kExitLocalError);
  EXPECT_NE(code.status().message().find("job j-1 has no checkpoint of its own in " + ckpt_dir_ +
                                         ": its newest committed step, 20, was written by job j-2"),
            std::string::npos)
      << code.status();
}

TEST_F(ExportTest, StepNotCommittedNamesTheCommittedOnes) {
  ASSERT_TRUE(Model(10).Save(ckpt_dir_, 10).ok());
  ASSERT_TRUE(Model(20).Save(ckpt_dir_, 20).ok());
  auto code = Export(15);
  EXPECT_EQ(ExitCodeForStatus(code.status()), kExitLocalError);
  EXPECT_EQ(code.status().message(), "job j-1 has no committed checkpoint at step 15 in " +
                                         ckpt_dir_ + " (committed: 10, 20)");
  EXPECT_FALSE(fs::exists(output_));
}

TEST_F(ExportTest, NoCheckpointYet) {
  fs::create_directories(ckpt_dir_);
  auto code = Export();
  EXPECT_EQ(ExitCodeForStatus(code.status()), kExitLocalError) << code.status();
  EXPECT_EQ(code.status().message(),
            "job j-1 has no checkpoint yet: no committed checkpoint in " + ckpt_dir_ +
                " (job RUNNING at step 50/100; checkpoint.every 10 steps)");
  EXPECT_FALSE(fs::exists(output_));
}

TEST_F(ExportTest, CheckpointDirectoryNotOnThisMachine) {
  auto code = Export();
  EXPECT_EQ(ExitCodeForStatus(code.status()), kExitLocalError);
  EXPECT_NE(code.status().message().find("has no checkpoint yet: the checkpoint directory " +
                                         ckpt_dir_ + " does not exist on this machine"),
            std::string::npos)
      << code.status();
}

TEST_F(ExportTest, JobWithoutCheckpointDirectory) {
  job_.mutable_spec()->mutable_checkpoint()->clear_dir();
  client_.get_job = {job_};
  auto code = Export();
  EXPECT_EQ(ExitCodeForStatus(code.status()), kExitLocalError);
  EXPECT_EQ(code.status().message(),
            "job j-1 has no checkpoint directory (spec.checkpoint.dir is empty; it is a train "
            "job): nothing to export");
}

// Flips one parameter byte of a committed shard: its CRC no longer matches the manifest.
void Corrupt(const std::string& ckpt_dir, int64_t step) {
  const train::CheckpointStore store(ckpt_dir, 0);
  const std::string shard = store.StepDir(step) + "/" + train::CheckpointStore::ShardFileName(0);
  std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(train::kShardHeaderBytes + 5);
  char c = 0;
  f.read(&c, 1);
  c = static_cast<char>(c ^ 0x40);
  f.seekp(train::kShardHeaderBytes + 5);
  f.write(&c, 1);
}

TEST_F(ExportTest, CorruptNewestFallsBackAndSaysSo) {
  ASSERT_TRUE(Model(10).Save(ckpt_dir_, 10).ok());
  ASSERT_TRUE(Model(20).Save(ckpt_dir_, 20).ok());
  Corrupt(ckpt_dir_, 20);
  auto code = Export();
  ASSERT_TRUE(code.ok()) << code.status();
  ExpectExportOf(10);
  EXPECT_NE(err_.str().find("furnace: skipped a newer checkpoint: checkpoint shard "),
            std::string::npos)
      << err_.str();
  EXPECT_NE(err_.str().find("step-00000020"), std::string::npos) << err_.str();
}

TEST_F(ExportTest, CorruptCheckpointGivesTheLoadersMessage) {
  ASSERT_TRUE(Model(20).Save(ckpt_dir_, 20).ok());
  Corrupt(ckpt_dir_, 20);
  for (int64_t step : {int64_t{-1}, int64_t{20}}) {
    auto code = Export(step);
    EXPECT_EQ(ExitCodeForStatus(code.status()), kExitLocalError) << step;
    EXPECT_TRUE(absl::IsDataLoss(code.status())) << code.status();
    EXPECT_NE(code.status().message().find("checkpoint shard " + ckpt_dir_ + "/step-00000020"),
              std::string::npos)
        << code.status();
    EXPECT_FALSE(fs::exists(output_));
  }
}

TEST_F(ExportTest, UnknownJobIsExit4) {
  client_.get_job = {absl::NotFoundError("no job j-1")};
  auto code = Export();
  EXPECT_EQ(ExitCodeForStatus(code.status()), kExitJobNotFound);
  EXPECT_EQ(code.status().message(), "no job j-1");
}

TEST_F(ExportTest, OnlySafetensorsAndAskedBeforeAnyRpc) {
  auto code = Export(-1, "onnx");
  EXPECT_EQ(ExitCodeForStatus(code.status()), kExitUsage);
  EXPECT_EQ(code.status().message(), "export: unknown --format \"onnx\" (allowed: safetensors)");
  EXPECT_EQ(client_.get_job_calls, 0);
  output_.clear();
  code = Export();
  EXPECT_EQ(ExitCodeForStatus(code.status()), kExitUsage);
}

TEST_F(ExportTest, JsonDocument) {
  ASSERT_TRUE(Model(10).Save(ckpt_dir_, 10).ok());
  ctx_.json = true;
  auto code = Export();
  ASSERT_TRUE(code.ok()) << code.status();
  for (const char* want : {"\"step\": 10", "\"tensors\": 3", "\"parameters\": 84",
                           "\"format\": \"safetensors\"", "\"bytes\": "}) {
    EXPECT_NE(out_.str().find(want), std::string::npos) << want << "\n" << out_.str();
  }
}

}  // namespace
}  // namespace furnace::cli
