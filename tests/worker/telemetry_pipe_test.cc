#include "worker/telemetry_pipe.h"

#include <fcntl.h>
#include <unistd.h>

#include <string>

#include "gtest/gtest.h"

namespace furnace::worker {
namespace {

furnace::v1::TelemetryRecord MakeRecord(uint64_t step, size_t message_bytes = 0) {
  furnace::v1::TelemetryRecord record;
  record.set_job_id("job-1");
  record.set_attempt(2);
  record.set_rank(3);
  record.set_step(step);
  record.set_phase("running");
  record.set_message(std::string(message_bytes, 'm'));
  record.mutable_train()->set_loss(1.5);
  return record;
}

TEST(TelemetryPipeTest, RoundTripByteByByte) {
  std::string stream;
  // The second record is long enough for a two-byte length varint, the third for three bytes.
  AppendFramedRecord(MakeRecord(1), &stream);
  AppendFramedRecord(MakeRecord(2, 300), &stream);
  AppendFramedRecord(MakeRecord(3, 20000), &stream);
  TelemetryDecoder decoder;
  std::vector<furnace::v1::TelemetryRecord> got;
  for (char c : stream) {
    decoder.Feed(std::string_view(&c, 1));
    furnace::v1::TelemetryRecord record;
    while (true) {
      absl::StatusOr<bool> next = decoder.Next(&record);
      ASSERT_TRUE(next.ok()) << next.status();
      if (!*next) break;
      got.push_back(record);
    }
  }
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(got[0].step(), 1u);
  EXPECT_EQ(got[1].message().size(), 300u);
  EXPECT_EQ(got[2].message().size(), 20000u);
  EXPECT_EQ(got[2].train().loss(), 1.5);
  EXPECT_EQ(decoder.pending_bytes(), 0u);
}

TEST(TelemetryPipeTest, ChunksSplittingRecordsAnywhere) {
  std::string stream;
  for (uint64_t i = 0; i < 50; ++i) AppendFramedRecord(MakeRecord(i, i * 7), &stream);
  for (size_t chunk : {2u, 5u, 13u, 129u, 4096u}) {
    TelemetryDecoder decoder;
    uint64_t expected = 0;
    for (size_t pos = 0; pos < stream.size(); pos += chunk) {
      decoder.Feed(std::string_view(stream).substr(pos, chunk));
      furnace::v1::TelemetryRecord record;
      while (true) {
        absl::StatusOr<bool> next = decoder.Next(&record);
        ASSERT_TRUE(next.ok());
        if (!*next) break;
        EXPECT_EQ(record.step(), expected++);
      }
    }
    EXPECT_EQ(expected, 50u) << "chunk " << chunk;
  }
}

TEST(TelemetryPipeTest, EmptyRecordIsARecord) {
  TelemetryDecoder decoder;
  decoder.Feed(FrameRecord(furnace::v1::TelemetryRecord()));
  furnace::v1::TelemetryRecord record;
  absl::StatusOr<bool> next = decoder.Next(&record);
  ASSERT_TRUE(next.ok());
  EXPECT_TRUE(*next);
}

TEST(TelemetryPipeTest, CorruptStreamsAreDataLoss) {
  furnace::v1::TelemetryRecord record;
  TelemetryDecoder bad_varint;
  bad_varint.Feed(std::string(10, '\xff'));
  EXPECT_EQ(bad_varint.Next(&record).status().code(), absl::StatusCode::kDataLoss);
  // Sticky: more bytes do not revive it.
  bad_varint.Feed(FrameRecord(MakeRecord(1)));
  EXPECT_EQ(bad_varint.Next(&record).status().code(), absl::StatusCode::kDataLoss);

  TelemetryDecoder oversize;
  oversize.Feed(std::string("\xff\xff\xff\xff\x0f", 5));  // 4 GiB
  EXPECT_EQ(oversize.Next(&record).status().code(), absl::StatusCode::kDataLoss);

  TelemetryDecoder unparsable;
  unparsable.Feed(std::string("\x02\xff\xff", 3));
  EXPECT_EQ(unparsable.Next(&record).status().code(), absl::StatusCode::kDataLoss);
}

// A record whose strings are not valid UTF-8 (a file name in an error message) is framed with each
// invalid byte a '?', nested fields too: protobuf would refuse to parse it, and the agent gave up
// on the rank's telemetry (and then called it hung).
TEST(TelemetryPipeTest, StringsThatAreNotUtf8AreFramedValid) {
  furnace::v1::TelemetryRecord record = MakeRecord(5);
  record.set_message("cannot open /data/\xff\xfe.bin");
  record.mutable_watchdog()->set_detail("checkpoint \xc3");
  std::string stream;
  AppendFramedRecord(record, &stream);
  TelemetryDecoder decoder;
  decoder.Feed(stream);
  furnace::v1::TelemetryRecord got;
  absl::StatusOr<bool> next = decoder.Next(&got);
  ASSERT_TRUE(next.ok()) << next.status();
  ASSERT_TRUE(*next);
  EXPECT_EQ(got.step(), 5u);
  EXPECT_EQ(got.message(), "cannot open /data/??.bin");
  EXPECT_EQ(got.watchdog().detail(), "checkpoint ?");
  EXPECT_EQ(got.train().loss(), 1.5);
}

TEST(TelemetryPipeTest, WriterThroughARealPipe) {
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  TelemetryWriter writer(fds[1]);
  ASSERT_TRUE(writer.connected());
  ASSERT_TRUE(writer.Write(MakeRecord(7)).ok());
  ASSERT_TRUE(writer.Write(MakeRecord(8, 1000)).ok());
  close(fds[1]);
  TelemetryDecoder decoder;
  char buffer[256];
  ssize_t n;
  while ((n = read(fds[0], buffer, sizeof(buffer))) > 0) decoder.Feed(std::string_view(buffer, n));
  close(fds[0]);
  furnace::v1::TelemetryRecord record;
  ASSERT_TRUE(*decoder.Next(&record));
  EXPECT_EQ(record.step(), 7u);
  ASSERT_TRUE(*decoder.Next(&record));
  EXPECT_EQ(record.step(), 8u);
  EXPECT_FALSE(*decoder.Next(&record));
}

TEST(TelemetryPipeTest, WriterWithoutAPipeDiscards) {
  TelemetryWriter writer(987);  // not open
  EXPECT_FALSE(writer.connected());
  EXPECT_TRUE(writer.Write(MakeRecord(1)).ok());
}

}  // namespace
}  // namespace furnace::worker
