// Megatron indexed datasets written by the independent writer tests/reference/megatron_indexed.py
// (numpy, from the format description) read back through IndexedDataset, and damaged or
// unsupported files refused with errors that name the file.
#include "runtime/data/indexed_dataset.h"

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/data/data_sources.h"
#include "tests/testing/test_dir.h"

namespace furnace::data {
namespace {

using ::testing::HasSubstr;

// Runs the writer; returns the sequences it says it wrote (one per line of PREFIX.expected).
std::vector<std::vector<int32_t>> WriteWithReference(const std::string& prefix,
                                                     const std::string& args) {
  const std::string command = std::string(FURNACE_NUMPY_PYTHON) + " " + FURNACE_SOURCE_DIR +
                              "/tests/reference/megatron_indexed.py --prefix " + prefix + " " +
                              args;
  EXPECT_EQ(std::system(command.c_str()), 0) << command;
  std::vector<std::vector<int32_t>> sequences;
  std::ifstream in(prefix + ".expected");
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream fields(line.substr(line.find(':') + 1));
    std::vector<int32_t> seq;
    for (int32_t t; fields >> t;) seq.push_back(t);
    sequences.push_back(std::move(seq));
  }
  return sequences;
}

std::string Bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}
void Put(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

// Where token k of sequence `sequence` lies, as the reference writer laid out `expected` (uint16
// tokens; with --gaps, 4 unused bytes before every sequence s with s % 3 == 1): its stream
// position and its byte offset in the .bin.
struct TokenPlace {
  int64_t position = 0;
  int64_t byte = 0;
};
TokenPlace PlaceOf(const std::vector<std::vector<int32_t>>& expected, int64_t sequence, int64_t k,
                   bool gaps) {
  TokenPlace place;
  for (int64_t s = 0; s < sequence; ++s) place.position += static_cast<int64_t>(expected[s].size());
  place.position += k;
  place.byte = 2 * place.position;
  for (int64_t s = 0; gaps && s <= sequence; ++s) place.byte += s % 3 == 1 ? 4 : 0;
  return place;
}

std::string OpenError(const std::string& prefix, int64_t vocab = 1000) {
  auto ds = IndexedDataset::Open(prefix, vocab);
  return ds.ok() ? "opened" : std::string(ds.status().message());
}

// (dtype, whether the .bin has gaps between sequences)
class IndexedDtypeTest : public ::testing::TestWithParam<std::tuple<std::string, bool>> {};

TEST_P(IndexedDtypeTest, ReadsWhatTheIndependentWriterWrote) {
  const auto& [dtype, gaps] = GetParam();
  testing_util::TestDir dir;
  const std::string prefix = dir / "corpus";
  const int vocab = dtype == "uint8" || dtype == "int8" ? 100 : 30000;
  const auto expected = WriteWithReference(
      prefix, "--seed 7 --documents 23 --sequences-per-document 3 --max-sequence 50 --vocab " +
                  std::to_string(vocab) + " --dtype " + dtype + (gaps ? " --gaps" : ""));
  ASSERT_EQ(expected.size(), 69u);
  auto ds = IndexedDataset::Open(prefix, vocab);
  ASSERT_TRUE(ds.ok()) << ds.status();
  EXPECT_EQ((*ds)->num_sequences(), 69);
  EXPECT_EQ((*ds)->num_documents(), 23);
  EXPECT_EQ((*ds)->contiguous(), !gaps);
  std::vector<int32_t> stream;
  for (size_t i = 0; i < expected.size(); ++i) {
    const absl::StatusOr<std::vector<int32_t>> sequence = (*ds)->Sequence(static_cast<int64_t>(i));
    ASSERT_TRUE(sequence.ok()) << sequence.status();
    EXPECT_EQ(*sequence, expected[i]) << "sequence " << i;
    stream.insert(stream.end(), expected[i].begin(), expected[i].end());
  }
  // The stream is every sequence in file order; reads may start and end anywhere.
  ASSERT_EQ((*ds)->size(), static_cast<int64_t>(stream.size()));
  for (int64_t begin : {int64_t{0}, int64_t{1}, int64_t{37}, (*ds)->size() - 60}) {
    std::vector<int32_t> got(60);
    ASSERT_TRUE((*ds)->Read(begin, 60, got.data()).ok());
    EXPECT_EQ(got, std::vector<int32_t>(stream.begin() + begin, stream.begin() + begin + 60))
        << "from token " << begin;
  }
  // Every single token, so each sequence boundary (and empty sequence) is crossed.
  for (int64_t p = 0; p < (*ds)->size(); ++p) {
    int32_t t = -1;
    ASSERT_TRUE((*ds)->Read(p, 1, &t).ok());
    ASSERT_EQ(t, stream[p]) << "token " << p;
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, IndexedDtypeTest,
                         ::testing::Combine(::testing::Values("uint16", "int32", "int64", "uint8",
                                                              "int8", "int16"),
                                            ::testing::Bool()));

TEST(IndexedDatasetTest, SamplerWindowsAreCutFromTheStream) {
  testing_util::TestDir dir;
  const std::string prefix = dir / "corpus";
  const auto expected = WriteWithReference(prefix, "--seed 3 --documents 40 --vocab 500");
  std::vector<int32_t> stream;
  for (const auto& s : expected) stream.insert(stream.end(), s.begin(), s.end());
  const int T = 8;
  DataSourceConfig data;
  data.source = "indexed";
  data.paths = {{prefix}};
  data.model_vocab = 500;
  auto made = MakeSamplers(data, {.batch = 2, .seq_len = T, .seed = 1, .global_batch = 4});
  ASSERT_TRUE(made.ok()) << made.status();
  const int64_t windows = (static_cast<int64_t>(stream.size()) - 1) / T;
  EXPECT_EQ(made->train->PositionAt(0).epoch_sequences, windows);
  // Every sequence of a batch is some window k: inputs stream[kT, kT+T), targets shifted by one.
  const Batch batch = made->train->Sample(3, 0, 1).value();
  for (int b = 0; b < 2; ++b) {
    const int32_t* in = batch.inputs.data() + b * T;
    bool found = false;
    for (int64_t k = 0; k < windows && !found; ++k) {
      found = std::equal(in, in + T, stream.begin() + k * T) &&
              std::equal(batch.targets.begin() + b * T, batch.targets.begin() + (b + 1) * T,
                         stream.begin() + k * T + 1);
    }
    EXPECT_TRUE(found) << "sequence " << b << " is no window of the stream";
  }
}

// data.validation.path naming the training data (the same prefix, or a copy) is refused: its loss
// would be measured on what is trained on. Other held-out data is taken.
TEST(IndexedDatasetTest, HeldOutDataThatIsTheTrainingDataIsRefused) {
  testing_util::TestDir dir;
  const std::string train = dir / "train", copy = dir / "copy", other = dir / "other";
  WriteWithReference(train, "--seed 1 --documents 5");
  WriteWithReference(other, "--seed 2 --documents 5");
  for (const char* ext : {".bin", ".idx"}) Put(copy + ext, Bytes(train + ext));
  DataSourceConfig data;
  data.source = "indexed";
  data.paths = {{train}};
  data.model_vocab = 1000;
  const SamplerConfig sampler{.batch = 2, .seq_len = 8, .seed = 1, .global_batch = 4};
  for (const std::string& held_out : {train, copy}) {
    data.validation_paths = {{held_out}};
    auto made = MakeSamplers(data, sampler);
    ASSERT_FALSE(made.ok()) << held_out;
    EXPECT_TRUE(absl::IsInvalidArgument(made.status()));
    EXPECT_THAT(made.status().message(),
                HasSubstr("data.validation.path: " + held_out +
                          " has the same content as the training data " + train));
  }
  data.validation_paths = {{other}};
  auto made = MakeSamplers(data, sampler);
  ASSERT_TRUE(made.ok()) << made.status();
  EXPECT_NE(made->validation, nullptr);
}

// What a rank reads at start-up (its start-up watchdog's allowance): each prefix's .idx, training
// and held-out, and each dataset's fingerprint tokens; the .bin files are read as they are
// trained on; nothing for markov data.
TEST(IndexedDatasetTest, DataReadAtOpenCountsTheIndexAndFingerprintOfEveryPrefix) {
  testing_util::TestDir dir;
  const std::string train = dir / "train", held_out = dir / "held_out";
  WriteWithReference(train, "--seed 1 --documents 5");
  WriteWithReference(held_out, "--seed 2 --documents 3");
  uint64_t expected = 0;
  for (const std::string& prefix : {train, held_out}) expected += Bytes(prefix + ".idx").size();
  DataSourceConfig data;
  data.source = "indexed";
  data.paths = {{train}};
  data.validation_paths = {{held_out}};
  EXPECT_EQ(DataReadAtOpen(data).sequential_bytes, expected);
  EXPECT_EQ(DataReadAtOpen(data).scattered_reads, 2 * TokenStream::kFingerprintTokens);
  data.source = "tokens";
  EXPECT_EQ(DataReadAtOpen(data).sequential_bytes, 0u);
  EXPECT_EQ(DataReadAtOpen(data).scattered_reads, 2 * TokenStream::kFingerprintTokens);
  data.source = "markov";
  EXPECT_EQ(DataReadAtOpen(data).sequential_bytes, 0u);
  EXPECT_EQ(DataReadAtOpen(data).scattered_reads, 0);
}

TEST(IndexedDatasetTest, MissingFilesAreNamed) {
  testing_util::TestDir dir;
  const std::string prefix = dir / "corpus";
  EXPECT_THAT(OpenError(prefix), HasSubstr(prefix + ".idx"));
  WriteWithReference(prefix, "--documents 3");
  // data.path is the prefix: given with .bin or .idx, the error says so.
  EXPECT_THAT(OpenError(prefix + ".bin"),
              HasSubstr("(an indexed dataset is named by its prefix, without .bin: data.path: " +
                        prefix + " for " + prefix + ".bin)"));
  EXPECT_THAT(OpenError(prefix + ".idx"), HasSubstr("without .idx: data.path: " + prefix + " "));
  std::remove((prefix + ".bin").c_str());
  EXPECT_THAT(OpenError(prefix), HasSubstr(prefix + ".bin"));
}

TEST(IndexedDatasetTest, DamagedOrUnsupportedIndexesAreRefusedNamingTheFile) {
  testing_util::TestDir dir;
  const std::string prefix = dir / "corpus";
  const std::string idx = prefix + ".idx";
  WriteWithReference(prefix, "--seed 1 --documents 5");
  const std::string good = Bytes(idx);
  ASSERT_EQ(OpenError(prefix), "opened");

  std::string bad = good;
  bad.replace(0, 6, "TNTIDX");
  Put(idx, bad);
  EXPECT_THAT(OpenError(prefix), HasSubstr(idx + ": bad magic"));

  bad = good;
  bad[9] = 2;  // version 2
  Put(idx, bad);
  EXPECT_THAT(OpenError(prefix),
              HasSubstr(idx + ": unsupported version 2 (this build reads version 1)"));

  bad = good;
  bad[17] = 7;  // float32
  Put(idx, bad);
  EXPECT_THAT(OpenError(prefix), HasSubstr("unsupported dtype code 7"));
  EXPECT_THAT(OpenError(prefix), HasSubstr("8 uint16"));

  // A file cut short anywhere, even inside the magic or to nothing, is corrupt data (the job is
  // not retried: "prepare it again"), not a file of another format.
  for (size_t keep : {size_t{0}, size_t{4}, size_t{20}, good.size() - 3}) {
    Put(idx, good.substr(0, keep));
    const std::string error = OpenError(prefix);
    EXPECT_THAT(error, HasSubstr(idx));
    EXPECT_THAT(error, HasSubstr("truncated")) << "kept " << keep;
    EXPECT_TRUE(absl::IsDataLoss(IndexedDataset::Open(prefix, 1000).status())) << "kept " << keep;
  }

  // A damaged pointer near INT64_MAX, whose end would wrap past it: refused as corrupt, not read.
  {
    bad = good;
    uint64_t count = 0;
    std::memcpy(&count, bad.data() + 18, 8);
    ASSERT_GT(count, 0u);
    int32_t length = 0;  // the last sequence's: not empty, so its end would wrap
    std::memcpy(&length, bad.data() + kIndexedHeaderBytes + 4 * (count - 1), 4);
    ASSERT_GT(length, 0);
    const int64_t pointer = INT64_MAX - 1;  // even: a multiple of the uint16 width
    std::memcpy(&bad[kIndexedHeaderBytes + 4 * count + 8 * (count - 1)], &pointer, 8);
    Put(idx, bad);
    const absl::Status status = IndexedDataset::Open(prefix, 1000).status();
    EXPECT_TRUE(absl::IsDataLoss(status)) << status;
    EXPECT_THAT(status.message(),
                HasSubstr(".bin: truncated: sequence " + std::to_string(count - 1)));
  }

  Put(idx, good + std::string(3, '\0'));
  EXPECT_THAT(OpenError(prefix), HasSubstr(idx + ": has 3 bytes after"));

  // The .bin shorter than the index says.
  Put(idx, good);
  const std::string bin = Bytes(prefix + ".bin");
  Put(prefix + ".bin", bin.substr(0, bin.size() - 2));
  EXPECT_THAT(OpenError(prefix), HasSubstr(prefix + ".bin: truncated"));
}

TEST(IndexedDatasetTest, MultimodalAndFloatIndexesAreRefusedAsSuch) {
  testing_util::TestDir dir;
  WriteWithReference(dir / "mm", "--documents 4 --modes");
  EXPECT_THAT(OpenError(dir / "mm"), HasSubstr("multimodal"));
  WriteWithReference(dir / "f", "--documents 4 --dtype float32");
  EXPECT_THAT(OpenError(dir / "f"), HasSubstr(dir / "f.idx: unsupported dtype code 7"));
}

// A token beyond the model's vocab is refused when it is read (Open reads the index only), naming
// the .bin, the sequence, the token's place in it and its byte offset; a job whose data is for a
// much larger vocab is refused before training all the same, by the tokens its fingerprint reads.
TEST(IndexedDatasetTest, TokenBeyondTheVocabIsRefusedWithItsPlace) {
  for (const bool gaps : {false, true}) {
    testing_util::TestDir dir;
    const std::string prefix = dir / "corpus";
    const auto expected = WriteWithReference(
        prefix, std::string("--seed 2 --documents 30 --vocab 5000") + (gaps ? " --gaps" : ""));
    auto ds = IndexedDataset::Open(prefix, 100);
    ASSERT_TRUE(ds.ok()) << ds.status();
    // The first token >= 100 in file order, and where the reference put it.
    int64_t sequence = -1, k = -1;
    for (size_t s = 0; s < expected.size() && sequence < 0; ++s) {
      for (size_t j = 0; j < expected[s].size() && sequence < 0; ++j) {
        if (expected[s][j] >= 100) {
          sequence = static_cast<int64_t>(s);
          k = static_cast<int64_t>(j);
        }
      }
    }
    ASSERT_GE(sequence, 0);
    const auto [position, byte] = PlaceOf(expected, sequence, k, gaps);
    std::vector<int32_t> got((*ds)->size());
    ASSERT_TRUE((*ds)->Read(0, position, got.data()).ok());  // everything before it reads
    const absl::Status read = (*ds)->Read(0, (*ds)->size(), got.data());
    EXPECT_TRUE(absl::IsInvalidArgument(read)) << read;
    EXPECT_THAT(read.message(), HasSubstr(absl::StrCat(prefix, ".bin: token ", k, " of sequence ",
                                                       sequence, " (byte offset ", byte, ")")));
    EXPECT_THAT(read.message(), HasSubstr(absl::StrCat(") has value ", expected[sequence][k],
                                                       ", outside the model's vocab [0, 100)")));
    EXPECT_FALSE((*ds)->Sequence(sequence).ok());
    EXPECT_EQ(OpenError(prefix, 5000), "opened");

    DataSourceConfig data;
    data.source = "indexed";
    data.paths = {{prefix}};
    data.model_vocab = 100;
    auto made = MakeSamplers(data, {.batch = 1, .seq_len = 4, .seed = 1, .global_batch = 1});
    ASSERT_FALSE(made.ok());
    EXPECT_THAT(made.status().message(), HasSubstr("outside the model's vocab [0, 100)"));
  }
}

// One bad token planted in a late sequence, right after an empty one and (with --gaps) after
// unused bytes: the read that reaches it names its sequence, its place there and its byte offset;
// everything before it reads.
TEST(IndexedDatasetTest, APlantedBadTokenIsNamedAtItsPlace) {
  for (const bool gaps : {false, true}) {
    testing_util::TestDir dir;
    const std::string prefix = dir / "corpus";
    // One sequence a document: sequences 3, 10, 17 and 24 are empty (the writer's d % 7 == 3);
    // with --gaps, 4 bytes precede every sequence s with s % 3 == 1.
    const auto expected = WriteWithReference(
        prefix, std::string("--seed 2 --documents 30 --vocab 5000") + (gaps ? " --gaps" : ""));
    ASSERT_EQ(expected.size(), 30u);
    ASSERT_TRUE(expected[10].empty());
    ASSERT_GE(expected[11].size(), 3u);
    const auto [position, byte] = PlaceOf(expected, 11, 2, gaps);  // token 2 of sequence 11
    std::string bin = Bytes(prefix + ".bin");
    ASSERT_LT(static_cast<size_t>(byte) + 1, bin.size());
    bin[byte] = '\xff';
    bin[byte + 1] = '\xff';  // 65535
    Put(prefix + ".bin", bin);

    auto ds = IndexedDataset::Open(prefix, 5000);
    ASSERT_TRUE(ds.ok()) << ds.status();
    EXPECT_EQ((*ds)->contiguous(), !gaps);
    std::vector<int32_t> got((*ds)->size());
    ASSERT_TRUE((*ds)->Read(0, position, got.data()).ok());
    ASSERT_TRUE((*ds)->Read(position + 1, (*ds)->size() - position - 1, got.data()).ok());
    const absl::Status read = (*ds)->Read(position - 5, 10, got.data());
    EXPECT_TRUE(absl::IsInvalidArgument(read)) << read;
    EXPECT_THAT(read.message(),
                HasSubstr(absl::StrCat(prefix, ".bin: token 2 of sequence 11 (byte offset ", byte,
                                       ") has value 65535, outside the model's vocab [0, 5000)")))
        << (gaps ? "with gaps" : "contiguous");
    EXPECT_FALSE((*ds)->Sequence(11).ok());
    EXPECT_TRUE((*ds)->Sequence(12).ok());
    EXPECT_TRUE((*ds)->Sequence(10).ok());  // empty
  }
}

// An index of more sequences than Open reads at once (it validates the index in chunks of 65,536
// entries): every sequence reads back, on both sides of each chunk boundary, with and without
// gaps between sequences.
TEST(IndexedDatasetTest, AnIndexLargerThanOneReadChunkReadsBack) {
  for (const bool gaps : {false, true}) {
    testing_util::TestDir dir;
    const std::string prefix = dir / "corpus";
    const auto expected = WriteWithReference(
        prefix, std::string("--seed 4 --documents 140000 --max-sequence 3 --vocab 300") +
                    (gaps ? " --gaps" : ""));
    ASSERT_EQ(expected.size(), 140000u);
    auto ds = IndexedDataset::Open(prefix, 300);
    ASSERT_TRUE(ds.ok()) << ds.status();
    EXPECT_EQ((*ds)->contiguous(), !gaps);
    std::vector<int32_t> all;
    for (const std::vector<int32_t>& sequence : expected) {
      all.insert(all.end(), sequence.begin(), sequence.end());
    }
    ASSERT_EQ((*ds)->size(), static_cast<int64_t>(all.size()));
    std::vector<int32_t> got(all.size());
    ASSERT_TRUE((*ds)->Read(0, (*ds)->size(), got.data()).ok());
    EXPECT_EQ(got, all);
    for (int64_t i : {0, 65535, 65536, 65537, 131071, 131072, 139999}) {
      const absl::StatusOr<std::vector<int32_t>> sequence = (*ds)->Sequence(i);
      ASSERT_TRUE(sequence.ok()) << sequence.status();
      EXPECT_EQ(*sequence, expected[static_cast<size_t>(i)]) << "sequence " << i;
    }
  }
}

// A file cut short while a job has it open (rewritten in place by a copy, a preprocessing run
// writing to the same prefix): the read that meets the missing bytes is an error naming the file,
// retried by a restart that opens it again (Unavailable), never a SIGBUS that kills the rank
// without a word. Before the bytes are gone, everything reads.
TEST(IndexedDatasetTest, AFileCutShortWhileOpenIsAReadErrorNamingIt) {
  for (const bool gaps : {false, true}) {
    testing_util::TestDir dir;
    const std::string prefix = dir / "corpus";
    WriteWithReference(
        prefix, std::string("--seed 2 --documents 3000 --vocab 5000") + (gaps ? " --gaps" : ""));
    auto ds = IndexedDataset::Open(prefix, 5000);
    ASSERT_TRUE(ds.ok()) << ds.status();
    std::vector<int32_t> got((*ds)->size());
    ASSERT_TRUE((*ds)->Read(0, (*ds)->size(), got.data()).ok());
    const uintmax_t bin_bytes = std::filesystem::file_size(prefix + ".bin");
    std::filesystem::resize_file(prefix + ".bin", bin_bytes / 2);
    const absl::Status read = (*ds)->Read((*ds)->size() - 100, 100, got.data());
    EXPECT_TRUE(absl::IsUnavailable(read)) << read;
    EXPECT_THAT(read.message(), HasSubstr(absl::StrCat("indexed dataset data ", prefix, ".bin")));
    EXPECT_THAT(read.message(),
                HasSubstr(absl::StrCat("the file has ", bin_bytes / 2, " bytes now and had ",
                                       bin_bytes, " when opened")));
    EXPECT_TRUE((*ds)->Read(0, 100, got.data()).ok());  // what is still there reads

    // The index too, where a sequence's place is read from it as it is needed (without gaps;
    // with them, the places are kept in memory). 2998 is not empty.
    std::filesystem::resize_file(prefix + ".idx", 40);
    const absl::StatusOr<std::vector<int32_t>> sequence = (*ds)->Sequence(2998);
    EXPECT_TRUE(absl::IsUnavailable(sequence.status())) << sequence.status();
    EXPECT_THAT(sequence.status().message(),
                HasSubstr(absl::StrCat(prefix, gaps ? ".bin" : ".idx")));
    // Opened again, the files are judged for what they are now.
    EXPECT_THAT(OpenError(prefix, 5000), HasSubstr("truncated"));
  }
}

}  // namespace
}  // namespace furnace::data
