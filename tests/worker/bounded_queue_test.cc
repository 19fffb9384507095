// The agent's drop-oldest buffers (worker/bounded_queue.h): both bounds (items and bytes), batches
// bounded in bytes, and put-back after a failed send.
#include "worker/bounded_queue.h"

#include <string>

#include "furnace/v1/agent.pb.h"
#include "gtest/gtest.h"

namespace furnace::worker {
namespace {

BoundedQueue<std::string> Queue(size_t capacity, size_t max_bytes) {
  return BoundedQueue<std::string>(capacity, max_bytes,
                                   [](const std::string& s) { return s.size(); });
}

TEST(BoundedQueueTest, DropsTheOldestPastEitherBound) {
  auto by_count = Queue(3, 1000);
  for (const char* s : {"a", "b", "c", "d"}) by_count.Push(s);
  EXPECT_EQ(by_count.size(), 3u);
  EXPECT_EQ(by_count.TakeDropped(), 1u);
  EXPECT_EQ(by_count.Take(10), (std::vector<std::string>{"b", "c", "d"}));

  auto by_bytes = Queue(100, 10);
  by_bytes.Push(std::string(4, 'x'));
  by_bytes.Push(std::string(4, 'y'));
  EXPECT_EQ(by_bytes.bytes(), 8u);
  by_bytes.Push(std::string(4, 'z'));  // 12 bytes: the oldest goes
  EXPECT_EQ(by_bytes.size(), 2u);
  EXPECT_EQ(by_bytes.bytes(), 8u);
  EXPECT_EQ(by_bytes.TakeDropped(), 1u);
  by_bytes.Push(std::string(50, 'w'));  // larger than the bound alone: it stays, alone
  EXPECT_EQ(by_bytes.size(), 1u);
  EXPECT_EQ(by_bytes.bytes(), 50u);
  EXPECT_EQ(by_bytes.TakeDropped(), 2u);
}

TEST(BoundedQueueTest, BatchesAreBoundedInBytesAndALargeItemGoesAlone) {
  auto q = Queue(100, 1000);
  for (const char* s : {"aaaa", "bbbb", "cccc"}) q.Push(s);
  EXPECT_EQ(q.Take(10, 9), (std::vector<std::string>{"aaaa", "bbbb"}));
  EXPECT_EQ(q.bytes(), 4u);
  q.Push(std::string(20, 'd'));
  EXPECT_EQ(q.Take(10, 9), (std::vector<std::string>{"cccc"}));
  EXPECT_EQ(q.Take(10, 9).size(), 1u);  // 20 bytes, over the batch bound: alone
  EXPECT_EQ(q.size(), 0u);
  EXPECT_EQ(q.bytes(), 0u);
}

TEST(BoundedQueueTest, PutBackKeepsOrderAndTheBounds) {
  auto q = Queue(100, 12);
  for (const char* s : {"aaaa", "bbbb"}) q.Push(s);
  std::vector<std::string> sent = q.Take(10);
  q.Push("cccc");
  q.Push("dddd");
  q.PutBack(sent);  // 16 bytes: the oldest put-back item is dropped
  EXPECT_EQ(q.TakeDropped(), 1u);
  EXPECT_EQ(q.Take(10), (std::vector<std::string>{"bbbb", "cccc", "dddd"}));
}

TEST(BoundedQueueTest, MessagesAreSizedByTheirWireSize) {
  BoundedQueue<furnace::v1::LogLine> q(100, 1000);
  furnace::v1::LogLine line;
  line.set_text(std::string(300, 'x'));
  q.Push(line);
  q.Push(line);
  q.Push(line);
  q.Push(line);  // over 1,000 bytes of lines: the oldest goes
  EXPECT_EQ(q.size(), 3u);
  EXPECT_EQ(q.bytes(), 3 * line.ByteSizeLong());
}

}  // namespace
}  // namespace furnace::worker
