#include "runtime/checkpoint/checkpoint.h"

#include <fcntl.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "runtime/checkpoint/crc32.h"
#include "tests/testing/file_bytes.h"
#include "tests/testing/test_dir.h"

namespace furnace::train {
namespace {

namespace fs = std::filesystem;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing_util::ReadAll;
using testing_util::TestDir;
using testing_util::WriteAll;

// A 2-tensor model state whose values encode the step, so a load shows which step it came from.
struct State {
  std::vector<ParamInfo> params = {
      {.name = "w", .shape = {2, 3}, .offset = 0, .weight_decay = true},
      {.name = "b", .shape = {3}, .offset = 6}};
  std::vector<float> p, m, v;
  explicit State(int64_t step) {
    for (int i = 0; i < 9; ++i) {
      p.push_back(static_cast<float>(step * 100 + i));
      m.push_back(static_cast<float>(step * 100 + i) + 0.25f);
      v.push_back(static_cast<float>(step * 100 + i) + 0.5f);
    }
  }
  ShardState Shard(int64_t step) const {
    return {.step = step,
            .data_position = step,
            .seed = 42,
            .n = 9,
            .params = p.data(),
            .m = m.data(),
            .v = v.data()};
  }
};

absl::Status SaveStep(CheckpointStore& store, int64_t step) {
  State s(step);
  return store.Save(s.params, s.Shard(step));
}

TEST(CheckpointTest, TheDataPositionRoundTripsThroughTheManifest) {
  TestDir dir;
  CheckpointStore store(dir.path(), 3);
  State s(4);
  ShardState shard = s.Shard(4);
  ASSERT_TRUE(store.Save(s.params, shard).ok());
  auto unrecorded = store.LoadLatest();  // no position given: none recorded
  ASSERT_TRUE(unrecorded.ok());
  EXPECT_EQ(unrecorded->data.order, "");
  EXPECT_FALSE(
      nlohmann::json::parse(ReadAll(dir / "step-00000004/manifest.json")).contains("data"));

  shard.step = shard.data_position = 5;
  shard.data = {
      .order = "epoch sampler v1: ...",
      .sequences = 40,
      .epoch = 2,
      .index_in_epoch = 6,
      .epoch_sequences = 17,
      .datasets = {{.path = "a", .epoch = 2, .index_in_epoch = 6, .epoch_sequences = 17},
                   {.path = "b", .epoch = 0, .index_in_epoch = 9, .epoch_sequences = 40}}};
  ASSERT_TRUE(store.Save(s.params, shard).ok());
  auto loaded = store.LoadLatest();
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->data.order, "epoch sampler v1: ...");
  EXPECT_EQ(loaded->data.sequences, 40);
  EXPECT_EQ(loaded->data.epoch, 2);
  EXPECT_EQ(loaded->data.index_in_epoch, 6);
  EXPECT_EQ(loaded->data.epoch_sequences, 17);
  ASSERT_EQ(loaded->data.datasets.size(), 2u);
  EXPECT_EQ(loaded->data.datasets[1].path, "b");
  EXPECT_EQ(loaded->data.datasets[1].index_in_epoch, 9);
  EXPECT_EQ(loaded->data.datasets[1].epoch_sequences, 40);
  const auto manifest = nlohmann::json::parse(ReadAll(dir / "step-00000005/manifest.json"));
  EXPECT_EQ(manifest["data"]["index_in_epoch"], 6);
}

// The optimizer settings a resume compares (runtime/train/run_settings.h) travel as text, exactly.
TEST(CheckpointTest, TheSettingsRoundTripThroughTheManifest) {
  TestDir dir;
  CheckpointStore store(dir.path(), 3);
  State s(4);
  ShardState shard = s.Shard(4);
  ASSERT_TRUE(store.Save(s.params, shard).ok());
  auto unrecorded = store.LoadLatest();
  ASSERT_TRUE(unrecorded.ok());
  EXPECT_TRUE(unrecorded->settings.empty());
  EXPECT_FALSE(
      nlohmann::json::parse(ReadAll(dir / "step-00000004/manifest.json")).contains("settings"));

  shard.step = shard.data_position = 5;
  shard.settings = {{"train.lr", "2.9999999999999997e-05"}, {"train.schedule", "cosine"}};
  ASSERT_TRUE(store.Save(s.params, shard).ok());
  auto loaded = store.LoadLatest();
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->settings, shard.settings);
  auto manifest = store.ReadManifest(5);
  ASSERT_TRUE(manifest.ok());
  EXPECT_EQ(manifest->settings, shard.settings);
  EXPECT_EQ(nlohmann::json::parse(
                ReadAll(dir / "step-00000005/manifest.json"))["settings"]["train.schedule"],
            "cosine");
}

TEST(CheckpointTest, SaveLoadRoundTrip) {
  TestDir dir;
  CheckpointStore store(dir.path(), 3);
  State s(7);
  ASSERT_TRUE(store.Save(s.params, s.Shard(7)).ok());
  EXPECT_TRUE(fs::exists(dir / "step-00000007/shard-00000.bin"));
  EXPECT_TRUE(fs::exists(dir / "step-00000007/manifest.json"));
  EXPECT_EQ(ReadAll(dir / "LATEST"), "7\n");
  for (const auto& entry : fs::directory_iterator(dir / "step-00000007")) {
    EXPECT_EQ(entry.path().filename().string().find(".tmp"), std::string::npos)
        << "no temporary file is left: " << entry.path();
  }

  auto loaded = store.LoadLatest();
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->step, 7);
  EXPECT_EQ(loaded->data_position, 7);
  EXPECT_EQ(loaded->seed, 42u);
  EXPECT_EQ(loaded->param_data, s.p);
  EXPECT_EQ(loaded->m, s.m);
  EXPECT_EQ(loaded->v, s.v);
  EXPECT_TRUE(loaded->skipped.empty());
  ASSERT_EQ(loaded->params.size(), 2u);
  EXPECT_EQ(loaded->params[0].name, "w");
  EXPECT_EQ(loaded->params[0].shape, (std::vector<int64_t>{2, 3}));
  EXPECT_TRUE(loaded->params[0].weight_decay);
  EXPECT_EQ(loaded->params[1].offset, 6);

  auto manifest = nlohmann::json::parse(ReadAll(dir / "step-00000007/manifest.json"));
  EXPECT_EQ(manifest["step"], 7);
  EXPECT_EQ(manifest["shards"][0]["file"], "shard-00000.bin");
  EXPECT_EQ(manifest["shards"][0]["bytes"], 56 + 3 * 9 * 4);
}

TEST(CheckpointTest, EmptyDirectoryIsNotFound) {
  TestDir dir;
  CheckpointStore store(dir.path(), 3);
  auto loaded = store.LoadLatest();
  EXPECT_TRUE(absl::IsNotFound(loaded.status())) << loaded.status();
}

TEST(CheckpointTest, LatestMovesOnlyAfterTheManifest) {
  TestDir dir;
  CheckpointStore store(dir.path(), 3);
  ASSERT_TRUE(SaveStep(store, 10).ok());
  std::vector<std::string> seen;
  // Record what is on disk at each stage of the next save.
  store.SetStageHookForTest([&](absl::string_view stage) {
    seen.push_back(absl::StrCat(stage,
                                ": manifest=", fs::exists(dir / "step-00000020/manifest.json"),
                                " latest=", ReadAll(dir / "LATEST")));
    return absl::OkStatus();
  });
  ASSERT_TRUE(SaveStep(store, 20).ok());
  EXPECT_THAT(seen, ElementsAre("shard: manifest=0 latest=10\n", "manifest: manifest=1 latest=10\n",
                                "latest: manifest=1 latest=20\n"));

  // A crash after the shard (before the manifest): step 30 is not committed; LATEST stays at 20.
  store.SetStageHookForTest([](absl::string_view stage) {
    return stage == "shard" ? absl::AbortedError("crash") : absl::OkStatus();
  });
  EXPECT_FALSE(SaveStep(store, 30).ok());
  EXPECT_TRUE(fs::exists(dir / "step-00000030/shard-00000.bin"));
  EXPECT_FALSE(fs::exists(dir / "step-00000030/manifest.json"));
  EXPECT_EQ(ReadAll(dir / "LATEST"), "20\n");
  auto loaded = store.LoadLatest();
  ASSERT_TRUE(loaded.ok());
  EXPECT_EQ(loaded->step, 20);

  // A crash after the manifest, before LATEST moved: LATEST still rules, 40 is not published.
  store.SetStageHookForTest([](absl::string_view stage) {
    return stage == "manifest" ? absl::AbortedError("crash") : absl::OkStatus();
  });
  EXPECT_FALSE(SaveStep(store, 40).ok());
  EXPECT_EQ(ReadAll(dir / "LATEST"), "20\n");
  loaded = store.LoadLatest();
  ASSERT_TRUE(loaded.ok());
  EXPECT_EQ(loaded->step, 20);
  EXPECT_EQ(loaded->param_data[0], 2000.0f);
  // ... and says so: step 40's work is passed over, not lost without a word.
  ASSERT_EQ(loaded->skipped.size(), 1u);
  EXPECT_THAT(loaded->skipped[0], HasSubstr("committed step 40 above step 20, which LATEST names"));
  EXPECT_THAT(loaded->skipped[0], HasSubstr("uncommitted by this run's next checkpoint"));
}

// LATEST set back (here by a damaged digit: "30" read as "10") with committed steps above it:
// the resume says which it passes over.
TEST(CheckpointTest, CommittedStepsAboveLatestAreNamed) {
  TestDir dir;
  CheckpointStore store(dir.path(), 0);
  for (int64_t step : {10, 20, 30}) ASSERT_TRUE(SaveStep(store, step).ok());
  WriteAll(dir / "LATEST", "10\n");
  auto loaded = store.LoadLatest();
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->step, 10);
  ASSERT_EQ(loaded->skipped.size(), 1u);
  EXPECT_THAT(loaded->skipped[0], HasSubstr("committed steps 20, 30 above step 10"));
  EXPECT_THAT(loaded->skipped[0], HasSubstr("/LATEST"));
}

TEST(CheckpointTest, KeepsTheNewestN) {
  TestDir dir;
  CheckpointStore store(dir.path(), 2);
  for (int64_t step : {5, 10, 15, 20}) ASSERT_TRUE(SaveStep(store, step).ok());
  EXPECT_THAT(store.CommittedSteps(), ElementsAre(15, 20));
  EXPECT_FALSE(fs::exists(dir / "step-00000005"));
  EXPECT_FALSE(fs::exists(dir / "step-00000010"));
  CheckpointStore keep_all(dir.path(), 0);
  ASSERT_TRUE(SaveStep(keep_all, 25).ok());
  EXPECT_THAT(keep_all.CommittedSteps(), ElementsAre(15, 20, 25));
}

// A commit killed while writing LATEST leaves LATEST.tmp.XXXXXX; the next commit deletes those
// an hour old (a fresh one may be a writer still at work on a skewed shared file system).
TEST(CheckpointTest, ACommitDeletesTheLatestTemporariesOfDeadWriters) {
  TestDir dir;
  CheckpointStore store(dir.path(), 0);
  ASSERT_TRUE(SaveStep(store, 5).ok());
  WriteAll(dir / "LATEST.tmp.dead01", "3\n");
  WriteAll(dir / "LATEST.tmp.fresh1", "4\n");
  WriteAll(dir / "notes.tmp.dead02", "mine\n");
  for (const char* old : {"LATEST.tmp.dead01", "notes.tmp.dead02"}) {
    fs::last_write_time(dir / old, fs::file_time_type::clock::now() - std::chrono::hours(2));
  }
  ASSERT_TRUE(SaveStep(store, 10).ok());
  EXPECT_FALSE(fs::exists(dir / "LATEST.tmp.dead01"));
  EXPECT_TRUE(fs::exists(dir / "LATEST.tmp.fresh1"));
  EXPECT_TRUE(fs::exists(dir / "notes.tmp.dead02"));  // not the store's
  EXPECT_EQ(ReadAll(dir / "LATEST"), "10\n");
}

// A run that resumed from an earlier checkpoint (the newest was damaged) left a timeline: its
// steps after the one resumed from are uncommitted at the next commit. Before, LATEST passing
// them again made the damaged one count among the `keep` and good ones were deleted instead.
TEST(CheckpointTest, StepsOfATimelineTheRunLeftAreUncommitted) {
  TestDir dir;
  CheckpointStore store(dir.path(), 2);
  for (int64_t step : {100, 200, 300}) ASSERT_TRUE(SaveStep(store, step).ok());
  const std::string shard = dir / "step-00000300/shard-00000.bin";
  std::string bytes = ReadAll(shard);
  bytes[80] ^= 0x01;
  WriteAll(shard, bytes);
  auto resumed = store.LoadLatest();
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  ASSERT_EQ(resumed->step, 200);
  ASSERT_TRUE(SaveStep(store, 250).ok());  // off the old grid: checkpoint.every auto
  EXPECT_THAT(store.CommittedSteps(), ElementsAre(200, 250));
  ASSERT_TRUE(SaveStep(store, 350).ok());
  EXPECT_THAT(store.CommittedSteps(), ElementsAre(250, 350));
  EXPECT_FALSE(fs::exists(dir / "step-00000300"));  // deleted once LATEST passed it
  auto loaded = store.LoadLatest();
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->step, 350);
  EXPECT_TRUE(loaded->skipped.empty());
}

// Once LATEST has moved the checkpoint is committed: an older one that cannot be deleted (here
// an immutable shard, as a file another host holds open on NFS) is said, not a failed save.
TEST(CheckpointTest, AnOldCheckpointThatCannotBeDeletedDoesNotFailTheCommit) {
  TestDir dir;
  CheckpointStore store(dir.path(), 1);
  ASSERT_TRUE(SaveStep(store, 1).ok());
  const std::string shard = dir / "step-00000001/shard-00000.bin";
  const int fd = ::open(shard.c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  int flags = 0;
  const bool immutable = ::ioctl(fd, FS_IOC_GETFLAGS, &flags) == 0 &&
                         (flags |= FS_IMMUTABLE_FL, ::ioctl(fd, FS_IOC_SETFLAGS, &flags) == 0);
  if (!immutable) {
    ::close(fd);
    GTEST_SKIP() << "cannot make a file immutable here (needs CAP_LINUX_IMMUTABLE)";
  }
  State s(2);
  std::string retention;
  const absl::Status saved = store.Save(s.params, s.Shard(2), &retention);
  flags &= ~FS_IMMUTABLE_FL;
  ::ioctl(fd, FS_IOC_SETFLAGS, &flags);
  ::close(fd);
  ASSERT_TRUE(saved.ok()) << saved;
  EXPECT_THAT(retention, HasSubstr("cannot delete"));
  EXPECT_THAT(retention, HasSubstr("step-00000001"));
  auto loaded = store.LoadLatest();
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->step, 2);
  // Tried again at the next commit, which succeeds now.
  ASSERT_TRUE(store.Save(State(3).params, State(3).Shard(3), &retention).ok());
  EXPECT_EQ(retention, "");
  EXPECT_THAT(store.CommittedSteps(), ElementsAre(3));
  EXPECT_FALSE(fs::exists(dir / "step-00000001"));
}

// A shard size in the manifest whose product wraps around to the bytes given is damage, not an
// allocation of 2^62 values.
TEST(CheckpointTest, AShardSizeThatOverflowsIsDamage) {
  TestDir dir;
  CheckpointStore store(dir.path(), 0);
  ASSERT_TRUE(SaveStep(store, 1).ok());
  const std::string path = dir / "step-00000001/manifest.json";
  nlohmann::json m = nlohmann::json::parse(ReadAll(path));
  m.erase("manifest_crc32");                       // as written before manifests had one
  m["num_params"] = ((int64_t{1} << 62) + 2) / 3;  // 56 + 12 n wraps to 64
  m["shards"][0]["bytes"] = 64;
  m["params"] = nlohmann::json::array(
      {{{"name", "w"}, {"shape", {1}}, {"offset", 0}, {"weight_decay", false}}});
  WriteAll(path, m.dump(1));
  auto manifest = store.ReadManifest(1);
  ASSERT_FALSE(manifest.ok());
  EXPECT_EQ(manifest.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(manifest.status().message(), HasSubstr("do not match"));
}

// A shard is a file of the step's directory: a manifest (without its checksum, as written before
// manifests had one) naming a path, the directory itself or its parent is damage.
TEST(CheckpointTest, AShardNameThatIsNoFileOfTheStepIsDamage) {
  TestDir dir;
  CheckpointStore store(dir.path(), 0);
  ASSERT_TRUE(SaveStep(store, 1).ok());
  const std::string path = dir / "step-00000001/manifest.json";
  const nlohmann::json saved = nlohmann::json::parse(ReadAll(path));
  for (const char* name : {"", ".", "..", "../step-00000001/shard-00000.bin", "a/b"}) {
    nlohmann::json m = saved;
    m.erase("manifest_crc32");
    m["shards"][0]["file"] = name;
    WriteAll(path, m.dump(1));
    auto manifest = store.ReadManifest(1);
    ASSERT_FALSE(manifest.ok()) << name;
    EXPECT_EQ(manifest.status().code(), absl::StatusCode::kDataLoss) << name;
    EXPECT_THAT(manifest.status().message(),
                HasSubstr(absl::StrCat("bad shard file name \"", name, "\"")));
  }
}

// The manifest carries its own checksum: two tensors' offsets swapped (a damaged manifest) would
// load each one's values into the other, every shard checksum still right.
TEST(CheckpointTest, AChangedManifestIsDamageAndLoadLatestFallsBack) {
  TestDir dir;
  CheckpointStore store(dir.path(), 0);
  ASSERT_TRUE(SaveStep(store, 1).ok());
  ASSERT_TRUE(SaveStep(store, 2).ok());
  const std::string path = dir / "step-00000002/manifest.json";
  nlohmann::json m = nlohmann::json::parse(ReadAll(path));
  ASSERT_TRUE(m.contains("manifest_crc32"));
  m["params"][0]["offset"] = 3;
  m["params"][1]["offset"] = 0;
  WriteAll(path, m.dump(1));
  auto manifest = store.ReadManifest(2);
  ASSERT_FALSE(manifest.ok());
  EXPECT_EQ(manifest.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(manifest.status().message(), HasSubstr("checksum mismatch"));
  auto loaded = store.LoadLatest();
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->step, 1);
  // A manifest written before the checksum (none recorded) still loads.
  nlohmann::json old = nlohmann::json::parse(ReadAll(dir / "step-00000001/manifest.json"));
  old.erase("manifest_crc32");
  WriteAll(dir / "step-00000001/manifest.json", old.dump(1));
  EXPECT_TRUE(store.Load(1).ok());
}

TEST(CheckpointTest, CorruptedShardIsRefusedAndLoadLatestFallsBack) {
  TestDir dir;
  CheckpointStore store(dir.path(), 3);
  ASSERT_TRUE(SaveStep(store, 1).ok());
  ASSERT_TRUE(SaveStep(store, 2).ok());
  const std::string shard = dir / "step-00000002/shard-00000.bin";
  std::string bytes = ReadAll(shard);
  bytes[80] ^= 0x01;  // one bit of a parameter
  WriteAll(shard, bytes);

  auto direct = store.Load(2);
  ASSERT_FALSE(direct.ok());
  EXPECT_THAT(direct.status().message(), HasSubstr("checksum mismatch"));
  EXPECT_THAT(direct.status().message(), HasSubstr(shard));

  auto loaded = store.LoadLatest();
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->step, 1);
  EXPECT_EQ(loaded->param_data[0], 100.0f);
  ASSERT_EQ(loaded->skipped.size(), 1u);
  EXPECT_THAT(loaded->skipped[0], HasSubstr("checksum mismatch"));
}

TEST(CheckpointTest, TruncatedShardIsRefusedAndLoadLatestFallsBack) {
  TestDir dir;
  CheckpointStore store(dir.path(), 3);
  ASSERT_TRUE(SaveStep(store, 1).ok());
  ASSERT_TRUE(SaveStep(store, 2).ok());
  const std::string shard = dir / "step-00000002/shard-00000.bin";
  std::string bytes = ReadAll(shard);
  WriteAll(shard, bytes.substr(0, bytes.size() - 5));

  auto direct = store.Load(2);
  ASSERT_FALSE(direct.ok());
  EXPECT_THAT(direct.status().message(), HasSubstr("truncated"));
  EXPECT_THAT(direct.status().message(), HasSubstr(shard));
  EXPECT_THAT(direct.status().message(), HasSubstr(std::to_string(bytes.size())));

  auto loaded = store.LoadLatest();
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->step, 1);
  EXPECT_THAT(loaded->skipped[0], HasSubstr("truncated"));
}

TEST(CheckpointTest, MissingShardAndBrokenManifestAreRefused) {
  TestDir dir;
  CheckpointStore store(dir.path(), 3);
  ASSERT_TRUE(SaveStep(store, 1).ok());
  ASSERT_TRUE(SaveStep(store, 2).ok());
  ASSERT_TRUE(SaveStep(store, 3).ok());
  fs::remove(dir / "step-00000003/shard-00000.bin");
  WriteAll(dir / "step-00000002/manifest.json", "{\"step\": 2");
  EXPECT_THAT(store.Load(3).status().message(), HasSubstr("missing"));
  EXPECT_THAT(store.Load(2).status().message(), HasSubstr("not valid JSON"));
  auto loaded = store.LoadLatest();
  ASSERT_TRUE(loaded.ok());
  EXPECT_EQ(loaded->step, 1);
  EXPECT_EQ(loaded->skipped.size(), 2u);

  fs::remove(dir / "step-00000001/shard-00000.bin");
  auto none = store.LoadLatest();
  ASSERT_FALSE(none.ok());
  EXPECT_TRUE(absl::IsDataLoss(none.status()));
  EXPECT_THAT(none.status().message(), HasSubstr("no usable checkpoint"));
}

// A shard that exists but cannot be read (an I/O error of a network file system, a permission
// or mount change; here a directory in its place) is not damage: LoadLatest does not fall back to
// the older step, from which the run would resume and whose next commit would uncommit the newer
// one. The attempt fails (Unavailable, retried) and the next one loads the newest step.
TEST(CheckpointTest, AShardThatCannotBeReadIsNotPassedOver) {
  TestDir dir;
  CheckpointStore store(dir.path(), 3);
  ASSERT_TRUE(SaveStep(store, 1).ok());
  ASSERT_TRUE(SaveStep(store, 2).ok());
  const std::string shard = dir / "step-00000002/shard-00000.bin";
  fs::rename(shard, dir / "aside.bin");
  fs::create_directory(shard);
  auto direct = store.Load(2);
  ASSERT_FALSE(direct.ok());
  EXPECT_EQ(direct.status().code(), absl::StatusCode::kUnavailable) << direct.status();
  EXPECT_THAT(direct.status().message(), HasSubstr(shard));
  EXPECT_THAT(direct.status().message(), HasSubstr("not damage"));
  auto latest = store.LoadLatest();
  ASSERT_FALSE(latest.ok()) << "loaded step " << latest->step;
  EXPECT_EQ(latest.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_FALSE(IsDamage(latest.status()));

  // Readable again (the next attempt): the newest step loads, nothing was lost.
  fs::remove(shard);
  fs::rename(dir / "aside.bin", shard);
  auto again = store.LoadLatest();
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->step, 2);
  EXPECT_TRUE(again->skipped.empty());

  // A manifest gone between the listing and the read (deleted while loading) is damage, passed
  // over, never "no checkpoint" (which would start the run afresh).
  auto gone = store.ReadManifest(7);
  EXPECT_EQ(gone.status().code(), absl::StatusCode::kDataLoss) << gone.status();
  EXPECT_THAT(gone.status().message(), HasSubstr("missing"));
}

// A manifest whose status cannot be read (here a symlink loop: ELOOP, as an NFS server's EIO or
// ESTALE would be) is not taken for a missing one: the loader reports it instead of falling back
// to an older step, and retention does not delete the step as an interrupted save's leftover.
TEST(CheckpointTest, AManifestThatCannotBeStatedIsNeitherPassedOverNorPruned) {
  TestDir dir;
  CheckpointStore store(dir.path(), 3);
  for (int64_t step : {1, 2, 3}) ASSERT_TRUE(SaveStep(store, step).ok());
  const fs::path manifest = dir / "step-00000003/manifest.json";
  fs::rename(manifest, dir / "aside.json");
  fs::create_symlink("manifest.json", manifest);  // points at itself
  EXPECT_THAT(store.CommittedSteps(), ElementsAre(1, 2, 3));
  auto latest = store.LoadLatest();
  ASSERT_FALSE(latest.ok()) << "loaded step " << latest->step;
  EXPECT_FALSE(IsDamage(latest.status())) << latest.status();

  ASSERT_TRUE(SaveStep(store, 4).ok());  // keep 3: 4, 3, 2; step 1 goes
  EXPECT_TRUE(fs::exists(dir / "step-00000003")) << "step 3 deleted as an interrupted save";
  EXPECT_FALSE(fs::exists(dir / "step-00000001"));
  fs::remove(manifest);
  fs::rename(dir / "aside.json", manifest);
  EXPECT_THAT(store.CommittedSteps(), ElementsAre(2, 3, 4));
}

// Rank 0 commits only shards it can see whole: ranks whose checkpoint.dir is not the same file
// system wrote theirs elsewhere, and a manifest naming them would be a checkpoint no restart loads.
TEST(CheckpointTest, ACommitOfAShardNotVisibleHereIsRefused) {
  TestDir dir;
  CheckpointStore store(dir.path(), 3);
  ASSERT_TRUE(SaveStep(store, 1).ok());
  State s(2);
  ShardState shard = s.Shard(2);
  shard.num_shards = 2;
  auto mine = store.WriteShard(shard);
  ASSERT_TRUE(mine.ok()) << mine.status();
  ShardRecord elsewhere = *mine;
  elsewhere.file = "shard-00001.bin";  // written on another host's disk
  absl::Status committed = store.Commit(s.params, shard, {*mine, elsewhere});
  EXPECT_EQ(committed.code(), absl::StatusCode::kFailedPrecondition) << committed;
  EXPECT_THAT(committed.message(), HasSubstr("shard 1's file"));
  EXPECT_THAT(committed.message(), HasSubstr("not visible here"));
  EXPECT_THAT(committed.message(), HasSubstr("one file system that every rank's host shares"));
  // A shard cut short in transit is refused too.
  WriteAll(dir / "step-00000002/shard-00001.bin", "short");
  committed = store.Commit(s.params, shard, {*mine, elsewhere});
  EXPECT_THAT(committed.message(), HasSubstr("5 bytes, not the"));
  EXPECT_THAT(store.CommittedSteps(), ElementsAre(1));
  auto latest = store.LatestStep();
  ASSERT_TRUE(latest.ok() && latest->has_value());
  EXPECT_EQ(**latest, 1);
}

// A checkpoint of a newer format version (a newer furnace wrote it; this build is older) is not
// damage either, even where its checksum would not verify by this build's rule: refused at once
// (FailedPrecondition, bad input), not passed over for an older step.
TEST(CheckpointTest, ACheckpointOfANewerVersionIsRefusedNotPassedOver) {
  TestDir dir;
  CheckpointStore store(dir.path(), 3);
  ASSERT_TRUE(SaveStep(store, 1).ok());
  ASSERT_TRUE(SaveStep(store, 2).ok());
  const std::string path = dir / "step-00000002/manifest.json";
  nlohmann::json m = nlohmann::json::parse(ReadAll(path));
  m["version"] = kCheckpointVersion + 1;
  m["manifest_crc32"] = 0;  // computed some other way
  WriteAll(path, m.dump(1));
  auto direct = store.Load(2);
  ASSERT_FALSE(direct.ok());
  EXPECT_EQ(direct.status().code(), absl::StatusCode::kFailedPrecondition) << direct.status();
  EXPECT_THAT(direct.status().message(),
              HasSubstr(absl::StrCat("format version ", kCheckpointVersion + 1,
                                     ", this build reads version ", kCheckpointVersion)));
  EXPECT_THAT(direct.status().message(), HasSubstr("newer furnace"));
  auto latest = store.LoadLatest();
  ASSERT_FALSE(latest.ok()) << "loaded step " << latest->step;
  EXPECT_EQ(latest.status().code(), absl::StatusCode::kFailedPrecondition);
}

// A damaged version (one bit: 1 -> 9) is damage, not a newer format: the checksum verifies with
// this build's version in its place, so the step is passed over for the one before.
TEST(CheckpointTest, ADamagedVersionIsDamageNotANewerFormat) {
  TestDir dir;
  CheckpointStore store(dir.path(), 3);
  ASSERT_TRUE(SaveStep(store, 1).ok());
  ASSERT_TRUE(SaveStep(store, 2).ok());
  const std::string path = dir / "step-00000002/manifest.json";
  std::string text = ReadAll(path);
  const std::string field = absl::StrCat("\"version\": ", kCheckpointVersion);
  const size_t at = text.find(field);
  ASSERT_NE(at, std::string::npos) << text;
  text[at + field.size() - 1] ^= 0x08;  // '1' -> '9'
  WriteAll(path, text);
  auto direct = store.Load(2);
  ASSERT_FALSE(direct.ok());
  EXPECT_EQ(direct.status().code(), absl::StatusCode::kDataLoss) << direct.status();
  EXPECT_THAT(direct.status().message(), HasSubstr("the version was damaged"));
  auto latest = store.LoadLatest();
  ASSERT_TRUE(latest.ok()) << latest.status();
  EXPECT_EQ(latest->step, 1);
}

// Export and sampling keep a shard's parameters only (a third of its memory); its Adam moments are
// still read through the checksum, so damage to them is found all the same.
TEST(CheckpointTest, AParamsOnlyLoadKeepsNoMomentsAndStillVerifiesThem) {
  TestDir dir;
  CheckpointStore store(dir.path(), 3);
  ASSERT_TRUE(SaveStep(store, 1).ok());
  ASSERT_TRUE(SaveStep(store, 2).ok());
  auto params = store.Load(2, 0, ShardParts::kParams);
  ASSERT_TRUE(params.ok()) << params.status();
  EXPECT_EQ(params->param_data, State(2).p);
  EXPECT_TRUE(params->m.empty());
  EXPECT_TRUE(params->v.empty());
  const std::string shard = dir / "step-00000002/shard-00000.bin";
  std::string bytes = ReadAll(shard);
  bytes[bytes.size() - 2] ^= 0x01;  // a bit of the last v
  WriteAll(shard, bytes);
  auto damaged = store.Load(2, 0, ShardParts::kParams);
  ASSERT_FALSE(damaged.ok());
  EXPECT_THAT(damaged.status().message(), HasSubstr("checksum mismatch"));
  auto latest = store.LoadLatest(0, ShardParts::kParams);
  ASSERT_TRUE(latest.ok()) << latest.status();
  EXPECT_EQ(latest->step, 1);
  EXPECT_TRUE(latest->m.empty());
}

TEST(CheckpointTest, ResavingACommittedStepReplacesIt) {
  TestDir dir;
  CheckpointStore store(dir.path(), 3);
  ASSERT_TRUE(SaveStep(store, 4).ok());
  State other(9);
  ASSERT_TRUE(store.Save(other.params, other.Shard(4)).ok());
  auto loaded = store.LoadLatest();
  ASSERT_TRUE(loaded.ok());
  EXPECT_EQ(loaded->param_data, other.p);
}

TEST(Crc32Test, MatchesTheStandardCheckValueAndIsIncremental) {
  // The CRC-32/ISO-HDLC check value (zlib, PNG, gzip): what older shards were written with.
  EXPECT_EQ(Crc32(0, "123456789", 9), 0xCBF43926u);
  EXPECT_EQ(Crc32(0, "", 0), 0u);
  std::string text;
  for (int i = 0; i < 100000; ++i) text.push_back(static_cast<char>((i * 131) ^ (i >> 7)));
  const uint32_t whole = Crc32(0, text.data(), text.size());
  EXPECT_EQ(Crc32(Crc32(0, text.data(), 4097), text.data() + 4097, text.size() - 4097), whole);
  text[54321] ^= 0x10;  // one flipped bit changes it
  EXPECT_NE(Crc32(0, text.data(), text.size()), whole);
}

}  // namespace
}  // namespace furnace::train
