#include "runtime/comm/commcheck_payload.h"

#include <algorithm>
#include <numeric>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace furnace::comm {
namespace {

using ::testing::HasSubstr;

// What each collective would deliver if it worked: computed here, in the test, by simulating the
// collective on buffers filled by the Fill functions.

TEST(CommcheckPayloadTest, EncodeKeepsSourceIterationAndIndex) {
  EXPECT_EQ(DescribeElement(EncodeElement(3, 17, 2)), "src 3 iter 2 index 17");
  EXPECT_NE(EncodeElement(1, 5, 0), EncodeElement(2, 5, 0));
  EXPECT_NE(EncodeElement(1, 5, 0), EncodeElement(1, 6, 0));
  EXPECT_NE(EncodeElement(1, 5, 0), EncodeElement(1, 5, 1));
}

TEST(CommcheckPayloadTest, AllreduceOfFilledBuffersVerifiesAndCorruptionIsCaught) {
  const int world = 4;
  const uint32_t iter = 7;
  std::vector<float> sum(1000, 0.0f), part(1000);
  for (int r = 0; r < world; ++r) {
    FillAllreduce(r, iter, part);
    for (size_t i = 0; i < sum.size(); ++i) sum[i] += part[i];
  }
  EXPECT_EQ(VerifyAllreduce(world, iter, sum).errors, 0u);
  EXPECT_EQ(VerifyAllreduce(world, iter + 1, sum).errors, 1000u) << "a stale iteration";
  sum[123] += 1.0f;
  VerifyResult result = VerifyAllreduce(world, iter, sum);
  EXPECT_EQ(result.errors, 1u);
  EXPECT_THAT(result.first_error, HasSubstr("element 123"));
}

// At thousands of ranks every partial sum stays exact in float32, in whichever order a ring or a
// tree adds the contributions (was: (rank + 1) * term, inexact from about 366 ranks).
TEST(CommcheckPayloadTest, AllreduceIsExactAtThousandsOfRanksInAnyOrder) {
  const int world = 5000;
  const uint32_t iter = 3;
  std::vector<std::vector<float>> parts(world, std::vector<float>(64));
  for (int r = 0; r < world; ++r) FillAllreduce(r, iter, parts[r]);
  std::vector<float> forward(64, 0.0f), backward(64, 0.0f);
  for (int r = 0; r < world; ++r) {
    for (size_t i = 0; i < 64; ++i) forward[i] += parts[r][i];
  }
  for (int r = world - 1; r >= 0; --r) {
    for (size_t i = 0; i < 64; ++i) backward[i] += parts[r][i];
  }
  // Pairwise (tree) order.
  std::vector<std::vector<float>> level = parts;
  while (level.size() > 1) {
    std::vector<std::vector<float>> next;
    for (size_t k = 0; k + 1 < level.size(); k += 2) {
      std::vector<float> s(64);
      for (size_t i = 0; i < 64; ++i) s[i] = level[k][i] + level[k + 1][i];
      next.push_back(std::move(s));
    }
    if (level.size() % 2 == 1) next.push_back(level.back());
    level = std::move(next);
  }
  EXPECT_EQ(VerifyAllreduce(world, iter, forward).errors, 0u);
  EXPECT_EQ(VerifyAllreduce(world, iter, backward).errors, 0u);
  EXPECT_EQ(VerifyAllreduce(world, iter, level[0]).errors, 0u);
  // One rank missing, or the previous iteration's buffers, is caught at every element.
  std::vector<float> missing = forward;
  for (size_t i = 0; i < 64; ++i) missing[i] -= parts[1234][i];
  EXPECT_EQ(VerifyAllreduce(world, iter, missing).errors, 64u);
  EXPECT_EQ(VerifyAllreduce(world, iter + 1, forward).errors, 64u);
}

// Beyond 256 ranks the rank field wraps, but rank r + 256's element still differs from rank r's.
TEST(CommcheckPayloadTest, AllgatherCatchesAChunkFrom256RanksAway) {
  const int world = 300;
  const size_t per_rank = 8;
  std::vector<int32_t> out(world * per_rank), in(per_rank);
  for (int r = 0; r < world; ++r) {
    FillAllgatherInput(r, 0, in);
    std::copy(in.begin(), in.end(), out.begin() + r * per_rank);
  }
  EXPECT_EQ(VerifyAllgather(world, 0, out).errors, 0u);
  std::copy(out.begin() + 259 * per_rank, out.begin() + 260 * per_rank, out.begin() + 3 * per_rank);
  EXPECT_EQ(VerifyAllgather(world, 0, out).errors, per_rank);
}

TEST(CommcheckPayloadTest, AllgatherDetectsMisroutedChunk) {
  const int world = 3;
  const size_t per_rank = 64;
  std::vector<int32_t> out(world * per_rank), in(per_rank);
  for (int r = 0; r < world; ++r) {
    FillAllgatherInput(r, 0, in);
    std::copy(in.begin(), in.end(), out.begin() + r * per_rank);
  }
  EXPECT_EQ(VerifyAllgather(world, 0, out).errors, 0u);
  // Rank 2's element lands in rank 1's slot.
  out[per_rank + 5] = out[2 * per_rank + 5];
  VerifyResult result = VerifyAllgather(world, 0, out);
  EXPECT_EQ(result.errors, 1u);
  EXPECT_THAT(result.first_error, HasSubstr("src 2 iter 0 index 5"));
  EXPECT_THAT(result.first_error, HasSubstr("want 0x"));
  // An element left untouched by the collective.
  out[per_rank + 5] = kPoison;
  EXPECT_EQ(VerifyAllgather(world, 0, out).errors, 1u);
}

TEST(CommcheckPayloadTest, AlltoallvCountsAreUnevenAndSumToThePayload) {
  for (int world = 1; world <= 5; ++world) {
    for (int r = 0; r < world; ++r) {
      std::vector<int64_t> send = AlltoallvSendCounts(r, world, 1000);
      std::vector<int64_t> recv = AlltoallvRecvCounts(r, world, 1000);
      EXPECT_EQ(std::accumulate(send.begin(), send.end(), int64_t{0}), 1000);
      for (int64_t count : send) EXPECT_GT(count, 0);
      if (world >= 2) {
        EXPECT_NE(*std::min_element(send.begin(), send.end()),
                  *std::max_element(send.begin(), send.end()))
            << "world " << world << " rank " << r;
        EXPECT_NE(*std::min_element(recv.begin(), recv.end()),
                  *std::max_element(recv.begin(), recv.end()))
            << "world " << world << " rank " << r;
      }
    }
  }
}

// Simulates alltoallv for every rank and returns what `rank` receives.
std::vector<int32_t> SimulateAlltoallv(int rank, int world, uint64_t elements, uint32_t iter) {
  std::vector<int32_t> out;
  for (int src = 0; src < world; ++src) {
    std::vector<int32_t> in(elements);
    FillAlltoallvInput(src, iter, in);
    const std::vector<int64_t> counts = AlltoallvSendCounts(src, world, elements);
    const int64_t offset = std::accumulate(counts.begin(), counts.begin() + rank, int64_t{0});
    out.insert(out.end(), in.begin() + offset, in.begin() + offset + counts[rank]);
  }
  return out;
}

TEST(CommcheckPayloadTest, AlltoallvDetectsWrongSourceAndWrongOffset) {
  const int world = 4;
  const uint64_t elements = 1024;
  for (int rank = 0; rank < world; ++rank) {
    EXPECT_EQ(VerifyAlltoallv(rank, world, elements, 3, SimulateAlltoallv(rank, world, elements, 3))
                  .errors,
              0u);
  }
  // Rank 1 receives what was meant for rank 2: sources are right but offsets are not.
  std::vector<int32_t> wrong_dst = SimulateAlltoallv(2, world, elements, 3);
  EXPECT_GT(VerifyAlltoallv(1, world, elements, 3, wrong_dst).errors, 0u);
  // One element from the wrong source.
  std::vector<int32_t> out = SimulateAlltoallv(1, world, elements, 3);
  out[0] = EncodeElement(3, 0, 3);
  VerifyResult result = VerifyAlltoallv(1, world, elements, 3, out);
  EXPECT_EQ(result.errors, 1u);
  EXPECT_THAT(result.first_error, HasSubstr("got 0x"));
  EXPECT_THAT(result.first_error, HasSubstr("src 3"));
  // A stale buffer from the previous iteration fails everywhere.
  EXPECT_EQ(VerifyAlltoallv(1, world, elements, 4, SimulateAlltoallv(1, world, elements, 3)).errors,
            out.size());
}

TEST(CommcheckPayloadTest, BroadcastRootRotatesAndPoisonIsCaught) {
  EXPECT_EQ(BroadcastRoot(0, 3), 0);
  EXPECT_EQ(BroadcastRoot(4, 3), 1);
  std::vector<int32_t> root_buf(32), other(32);
  FillBroadcast(1, 1, 4, root_buf);
  FillBroadcast(0, 1, 4, other);
  EXPECT_EQ(VerifyBroadcast(1, 4, root_buf).errors, 0u);
  EXPECT_EQ(VerifyBroadcast(1, 4, other).errors, 32u) << "an unwritten receiver buffer must fail";
  root_buf[31] = EncodeElement(0, 31, 4);  // the wrong root's data
  EXPECT_EQ(VerifyBroadcast(1, 4, root_buf).errors, 1u);
}

}  // namespace
}  // namespace furnace::comm
