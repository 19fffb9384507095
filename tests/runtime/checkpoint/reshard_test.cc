// Loading a checkpoint into another layout (runtime/checkpoint/reshard.h): a checkpoint written by
// two "ranks" holding column blocks of one tensor and a replica of another is gathered into a
// whole tensor, into row blocks (a split along another dim), into non-contiguous column ranges
// and back into its own layout, parameters and Adam moments alike; a shard is read only when it
// holds something the rank needs; another model is refused naming the tensor; an element on no
// shard and a damaged shard the rank needs are DataLoss, and the latest-loader falls back.
#include "runtime/checkpoint/reshard.h"

#include <filesystem>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/file_bytes.h"
#include "tests/testing/test_dir.h"

namespace furnace::train {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing_util::ReadAll;
using testing_util::TestDir;
using testing_util::WriteAll;

constexpr int64_t kRows = 4, kCols = 6, kB = 3;

// Element g of tensor "a" is 1000 + g, of "b" 2000 + g, plus step * 10000; m and v add 0.25 and
// 0.5, so every loaded value says where it came from.
float Value(const std::string& name, int64_t g, int64_t step) {
  return static_cast<float>(step * 10000 + (name == "a" ? 1000 : 2000) + g);
}

ParamInfo ColumnsOfA(int64_t offset, std::vector<std::pair<int64_t, int64_t>> ranges) {
  int64_t width = 0;
  for (auto [b, e] : ranges) width += e - b;
  return {.name = "a",
          .shape = {kRows, width},
          .offset = offset,
          .shard = {.global_shape = {kRows, kCols}, .dim = 1, .ranges = std::move(ranges)}};
}

ParamInfo RowsOfA(int64_t offset, int64_t begin, int64_t end) {
  return {.name = "a",
          .shape = {end - begin, kCols},
          .offset = offset,
          .shard = {.global_shape = {kRows, kCols}, .dim = 0, .ranges = {{begin, end}}}};
}

ParamInfo WholeB(int64_t offset) { return {.name = "b", .shape = {kB}, .offset = offset}; }

int64_t Count(const std::vector<ParamInfo>& params) {
  int64_t n = 0;
  for (const ParamInfo& p : params) n = std::max(n, p.offset + p.numel());
  return n;
}

// Writes and commits step `step` of the two-shard layout (columns [0, 3) and [3, 6) of "a", each
// shard with a replica of "b"), or of `layouts` when given.
absl::Status WriteLayout(CheckpointStore& store, int64_t step,
                         std::vector<std::vector<ParamInfo>> layouts = {}) {
  if (layouts.empty()) {
    layouts = {{ColumnsOfA(0, {{0, 3}}), WholeB(12)}, {ColumnsOfA(0, {{3, 6}}), WholeB(12)}};
  }
  const int shards = static_cast<int>(layouts.size());
  std::vector<ShardRecord> records;
  ShardState state;
  for (int s = 0; s < shards; ++s) {
    const std::vector<ParamInfo>& params = layouts[s];
    const int64_t n = Count(params);
    std::vector<float> p(n), m(n), v(n);
    for (const ParamInfo& info : params) {
      for (int64_t i = 0; i < info.numel(); ++i) {
        p[info.offset + i] = Value(info.name, info.GlobalIndex(i), step);
        m[info.offset + i] = p[info.offset + i] + 0.25f;
        v[info.offset + i] = p[info.offset + i] + 0.5f;
      }
    }
    state = {.step = step,
             .data_position = step,
             .seed = 5,
             .shard = s,
             .num_shards = shards,
             .n = n,
             .params = p.data(),
             .m = m.data(),
             .v = v.data()};
    auto record = store.WriteShard(state);
    if (!record.ok()) return record.status();
    record->params = params;
    record->n = n;
    records.push_back(*record);
  }
  return store.Commit(layouts[0], state, records);
}

// Every element of `mine` holds the value of its global element at `step`.
void ExpectGathered(const LoadedCheckpoint& loaded, const std::vector<ParamInfo>& mine,
                    int64_t step) {
  ASSERT_EQ(loaded.param_data.size(), static_cast<size_t>(Count(mine)));
  for (const ParamInfo& p : mine) {
    for (int64_t i = 0; i < p.numel(); ++i) {
      const float want = Value(p.name, p.GlobalIndex(i), step);
      ASSERT_EQ(loaded.param_data[p.offset + i], want) << p.name << " element " << i;
      ASSERT_EQ(loaded.m[p.offset + i], want + 0.25f) << p.name << " element " << i;
      ASSERT_EQ(loaded.v[p.offset + i], want + 0.5f) << p.name << " element " << i;
    }
  }
}

TEST(ParamInfoTest, LocalIndexInvertsGlobalIndex) {
  for (const ParamInfo& p :
       {ColumnsOfA(0, {{0, 1}, {4, 6}}), RowsOfA(0, 1, 3), ColumnsOfA(0, {{3, 6}}), WholeB(0)}) {
    for (int64_t i = 0; i < p.numel(); ++i) EXPECT_EQ(p.LocalIndex(p.GlobalIndex(i)), i);
    const int64_t whole = p.shard.sharded() ? kRows * kCols : kB;
    int64_t held = 0;
    for (int64_t g = 0; g < whole; ++g) held += p.LocalIndex(g) >= 0 ? 1 : 0;
    EXPECT_EQ(held, p.numel()) << p.name;
  }
}

TEST(ReshardTest, GathersIntoEveryLayoutFromTheShardsThatHoldIt) {
  TestDir dir;
  CheckpointStore store(dir.path(), 0);
  ASSERT_TRUE(WriteLayout(store, 4).ok());

  // One process: the whole tensor from both shards, b from the first.
  const std::vector<ParamInfo> whole = {{.name = "a", .shape = {kRows, kCols}, .offset = 0},
                                        WholeB(kRows * kCols)};
  auto one = LoadIntoLayout(store, 4, whole, Count(whole), 0);
  ASSERT_TRUE(one.ok()) << one.status();
  ExpectGathered(*one, whole, 4);
  EXPECT_THAT(one->shards_read, ElementsAre(0, 1));
  EXPECT_EQ(one->num_shards, 2);
  EXPECT_EQ(one->step, 4);
  EXPECT_EQ(one->seed, 5u);
  EXPECT_THAT(one->tensors.at("a"), ElementsAre(kRows, kCols));

  // Rows instead of columns (another dim), b first in the flat array: needs both shards.
  const std::vector<ParamInfo> rows = {WholeB(0), RowsOfA(kB, 2, 4)};
  auto by_rows = LoadIntoLayout(store, 4, rows, Count(rows), 1);
  ASSERT_TRUE(by_rows.ok()) << by_rows.status();
  ExpectGathered(*by_rows, rows, 4);
  EXPECT_THAT(by_rows->shards_read, ElementsAre(1, 0));

  // Non-contiguous column ranges.
  const std::vector<ParamInfo> ranges = {ColumnsOfA(0, {{0, 1}, {4, 6}})};
  auto ranged = LoadIntoLayout(store, 4, ranges, Count(ranges), 0);
  ASSERT_TRUE(ranged.ok()) << ranged.status();
  ExpectGathered(*ranged, ranges, 4);

  // The layout that wrote it: its own shard holds everything; nothing else is read.
  const std::vector<ParamInfo> own = {ColumnsOfA(0, {{3, 6}}), WholeB(12)};
  auto same = LoadIntoLayout(store, 4, own, Count(own), 1);
  ASSERT_TRUE(same.ok()) << same.status();
  ExpectGathered(*same, own, 4);
  EXPECT_THAT(same->shards_read, ElementsAre(1));
  // A rank beyond the writer's shards (a larger layout) tries them in order: shard 0 for the
  // replica of b, shard 1 for its columns of a.
  auto extra = LoadIntoLayout(store, 4, own, Count(own), 7);
  ASSERT_TRUE(extra.ok()) << extra.status();
  ExpectGathered(*extra, own, 4);
  EXPECT_THAT(extra->shards_read, ElementsAre(0, 1));
}

TEST(ReshardTest, AnotherModelIsRefusedNamingTheTensor) {
  TestDir dir;
  CheckpointStore store(dir.path(), 0);
  ASSERT_TRUE(WriteLayout(store, 4).ok());
  const std::vector<ParamInfo> unknown = {WholeB(0), {.name = "c", .shape = {2}, .offset = 3}};
  auto missing = LoadIntoLayout(store, 4, unknown, 5, 0);
  ASSERT_EQ(missing.status().code(), absl::StatusCode::kFailedPrecondition) << missing.status();
  EXPECT_THAT(missing.status().message(), HasSubstr("has no tensor c"));

  const std::vector<ParamInfo> wider = {{.name = "a", .shape = {kRows, kCols + 1}, .offset = 0}};
  auto shape = LoadLatestIntoLayout(store, wider, Count(wider), 0);
  ASSERT_EQ(shape.status().code(), absl::StatusCode::kFailedPrecondition) << shape.status();
  EXPECT_THAT(shape.status().message(), HasSubstr("tensor a is [4, 6] there and [4, 7]"));

  // A rank checks only its own tensors; the caller compares the whole model's set.
  auto loaded = LoadIntoLayout(store, 4, {WholeB(0)}, kB, 0);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  const absl::Status fewer = CompareTensorSets(loaded->path, loaded->tensors, {{"b", {kB}}});
  ASSERT_EQ(fewer.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(fewer.message(), HasSubstr("holds tensor a [4, 6], which this model does not have"));
  const absl::Status more = CompareTensorSets(loaded->path, loaded->tensors,
                                              {{"a", {kRows, kCols}}, {"b", {kB}}, {"c", {1}}});
  EXPECT_THAT(more.message(), HasSubstr("has no tensor c"));
  EXPECT_TRUE(
      CompareTensorSets(loaded->path, loaded->tensors, {{"a", {kRows, kCols}}, {"b", {kB}}}).ok());
}

TEST(ReshardTest, AnElementOnNoShardIsDataLoss) {
  TestDir dir;
  CheckpointStore store(dir.path(), 0);
  // Column 5 of "a" is on neither shard.
  ASSERT_TRUE(
      WriteLayout(store, 2, {{ColumnsOfA(0, {{0, 3}}), WholeB(12)}, {ColumnsOfA(0, {{3, 5}})}})
          .ok());
  const std::vector<ParamInfo> whole = {{.name = "a", .shape = {kRows, kCols}, .offset = 0}};
  auto loaded = LoadIntoLayout(store, 2, whole, Count(whole), 0);
  ASSERT_EQ(loaded.status().code(), absl::StatusCode::kDataLoss) << loaded.status();
  EXPECT_THAT(loaded.status().message(), HasSubstr("4 of 24 elements of tensor a are on no shard"));
}

TEST(ReshardTest, ADamagedShardTheRankNeedsFallsBackToThePreviousCheckpoint) {
  TestDir dir;
  CheckpointStore store(dir.path(), 0);
  ASSERT_TRUE(WriteLayout(store, 2).ok());
  ASSERT_TRUE(WriteLayout(store, 4).ok());
  const std::string shard1 = store.StepDir(4) + "/" + CheckpointStore::ShardFileName(1);
  std::string bytes = ReadAll(shard1);
  bytes[bytes.size() - 3] ^= 0x40;
  WriteAll(shard1, bytes);

  // Shard 0's layout never reads shard 1: step 4 loads.
  const std::vector<ParamInfo> own = {ColumnsOfA(0, {{0, 3}}), WholeB(12)};
  auto same = LoadLatestIntoLayout(store, own, Count(own), 0);
  ASSERT_TRUE(same.ok()) << same.status();
  EXPECT_EQ(same->step, 4);

  // The whole tensor needs shard 1: step 2, saying why step 4 was passed over.
  const std::vector<ParamInfo> whole = {{.name = "a", .shape = {kRows, kCols}, .offset = 0}};
  auto older = LoadLatestIntoLayout(store, whole, Count(whole), 0);
  ASSERT_TRUE(older.ok()) << older.status();
  EXPECT_EQ(older->step, 2);
  ExpectGathered(*older, whole, 2);
  ASSERT_EQ(older->skipped.size(), 1u);
  EXPECT_THAT(older->skipped[0], HasSubstr("checksum mismatch"));

  // Nothing committed: NotFound.
  TestDir empty;
  auto none = LoadLatestIntoLayout(CheckpointStore(empty.path(), 0), whole, Count(whole), 0);
  EXPECT_EQ(none.status().code(), absl::StatusCode::kNotFound) << none.status();
}

// A shard the rank needs that exists but cannot be read (here a directory in its place) is not
// damage: returned at once (Unavailable), not passed over for the previous step.
TEST(ReshardTest, AShardThatCannotBeReadIsNotPassedOver) {
  TestDir dir;
  CheckpointStore store(dir.path(), 0);
  ASSERT_TRUE(WriteLayout(store, 2).ok());
  ASSERT_TRUE(WriteLayout(store, 4).ok());
  const std::string shard1 = store.StepDir(4) + "/" + CheckpointStore::ShardFileName(1);
  std::filesystem::remove(shard1);
  std::filesystem::create_directory(shard1);
  const std::vector<ParamInfo> whole = {{.name = "a", .shape = {kRows, kCols}, .offset = 0}};
  auto loaded = LoadLatestIntoLayout(store, whole, Count(whole), 0);
  ASSERT_FALSE(loaded.ok()) << "loaded step " << loaded->step;
  EXPECT_EQ(loaded.status().code(), absl::StatusCode::kUnavailable) << loaded.status();
  EXPECT_THAT(loaded.status().message(), HasSubstr(shard1));
}

}  // namespace
}  // namespace furnace::train
