#include "runtime/data/token_file.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/base/file_error.h"
#include "runtime/data/tokenizer.h"
#include "tests/testing/file_bytes.h"
#include "tests/testing/test_dir.h"

namespace furnace::data {
namespace {

using ::testing::HasSubstr;
using testing_util::ReadAll;
using testing_util::TestDir;
using testing_util::WriteAll;

TEST(TokenFileTest, RoundTripBothWidths) {
  TestDir dir;
  for (int64_t vocab : {300, 100000}) {
    std::vector<int32_t> tokens;
    for (int i = 0; i < 1000; ++i) tokens.push_back(static_cast<int32_t>((i * 7919) % vocab));
    const std::string path = dir / ("tokens_" + std::to_string(vocab) + ".bin");
    ASSERT_TRUE(WriteTokenFile(path, tokens, vocab).ok());
    auto file = TokenFile::Open(path, vocab);
    ASSERT_TRUE(file.ok()) << file.status();
    EXPECT_EQ((*file)->size(), 1000);
    EXPECT_EQ((*file)->vocab(), vocab);
    EXPECT_EQ((*file)->token_bytes(), vocab <= 65536 ? 2 : 4);
    std::vector<int32_t> back(1000);
    ASSERT_TRUE((*file)->Read(0, 1000, back.data()).ok());
    EXPECT_EQ(back, tokens);
    EXPECT_EQ(ReadAll(path).size(), 28 + 1000u * (*file)->token_bytes());
  }
}

TEST(TokenFileTest, HeaderLayoutIsAsDocumented) {
  TestDir dir;
  ASSERT_TRUE(WriteTokenFile(dir / "t.bin", {1, 2, 258}, 300).ok());
  const std::string b = ReadAll(dir / "t.bin");
  ASSERT_EQ(b.size(), 28u + 6u);
  EXPECT_EQ(b.substr(0, 8), "FURNTOK1");
  EXPECT_EQ(b[8], 1);                                        // version
  EXPECT_EQ(b[12], 2);                                       // token bytes
  EXPECT_EQ(b[16], 3);                                       // count
  EXPECT_EQ(static_cast<unsigned char>(b[24]), 300 & 0xFF);  // vocab, little-endian
  EXPECT_EQ(b[25], 1);
  EXPECT_EQ(b[32], 2);  // token 258 = 0x0102, little-endian
  EXPECT_EQ(b[33], 1);
}

// Why a file could not be opened decides who fixes it: a path that names nothing, or names a
// directory, is the job's (NotFound, InvalidArgument: bad input); a file that is there but cannot
// be read now (EIO, ESTALE, EACCES, EMFILE) is no fault of the data (Unavailable: retried).
TEST(TokenFileTest, OpenErrorsSayWhoseFaultItIs) {
  TestDir dir;
  absl::StatusOr<std::unique_ptr<TokenFile>> missing = TokenFile::Open(dir / "none.bin");
  EXPECT_TRUE(absl::IsNotFound(missing.status())) << missing.status();
  absl::StatusOr<std::unique_ptr<TokenFile>> directory = TokenFile::Open(dir / "");
  EXPECT_TRUE(absl::IsInvalidArgument(directory.status())) << directory.status();
  EXPECT_THAT(directory.status().message(), ::testing::HasSubstr("not a regular file"));
  for (int error : {EIO, ESTALE, EACCES, EMFILE, ENOMEM}) {
    const absl::Status s = CannotOpenError("token file", "/data/t.bin", error);
    EXPECT_TRUE(absl::IsUnavailable(s)) << s;
    EXPECT_THAT(s.message(), ::testing::HasSubstr("token file /data/t.bin: cannot open: "));
    EXPECT_THAT(s.message(), ::testing::HasSubstr("a restart reads it again"));
  }
  for (int error : {ENOENT, ENOTDIR}) {
    EXPECT_TRUE(absl::IsNotFound(CannotOpenError("token file", "/data/t.bin", error)));
  }
  EXPECT_TRUE(absl::IsNotFound(Sha256OfFile(dir / "none.model").status()));
  // A tokenizer path naming a directory opens, then cannot be read: the path's fault, not retried.
  EXPECT_TRUE(absl::IsInvalidArgument(Sha256OfFile(dir / "").status()));
  EXPECT_TRUE(absl::IsInvalidArgument(TokenizerIdentity(dir / "").status()));
  // A FIFO where a file should be: refused at once, not opened by waiting for a writer (which
  // held the rank in its start-up until the watchdog ended it, reported as a hang).
  const std::string fifo = dir / "fifo.bin";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0) << std::strerror(errno);
  absl::StatusOr<std::unique_ptr<TokenFile>> pipe = TokenFile::Open(fifo);
  EXPECT_TRUE(absl::IsInvalidArgument(pipe.status())) << pipe.status();
  EXPECT_THAT(pipe.status().message(), ::testing::HasSubstr("not a regular file"));
  EXPECT_TRUE(absl::IsInvalidArgument(Sha256OfFile(fifo).status()));
}

TEST(TokenFileTest, RefusesWrongMagic) {
  TestDir dir;
  ASSERT_TRUE(WriteTokenFile(dir / "t.bin", {1, 2, 3}, 10).ok());
  std::string b = ReadAll(dir / "t.bin");
  b[0] = 'X';
  WriteAll(dir / "t.bin", b);
  auto file = TokenFile::Open(dir / "t.bin");
  ASSERT_FALSE(file.ok());
  EXPECT_THAT(file.status().message(), HasSubstr("bad magic"));
  EXPECT_THAT(file.status().message(), HasSubstr(dir / "t.bin"));
}

TEST(TokenFileTest, RefusesWrongVersion) {
  TestDir dir;
  ASSERT_TRUE(WriteTokenFile(dir / "t.bin", {1, 2, 3}, 10).ok());
  std::string b = ReadAll(dir / "t.bin");
  b[8] = 3;
  WriteAll(dir / "t.bin", b);
  auto file = TokenFile::Open(dir / "t.bin");
  ASSERT_FALSE(file.ok());
  EXPECT_THAT(file.status().message(), HasSubstr("unsupported version 3"));
  EXPECT_THAT(file.status().message(), HasSubstr("reads versions 1 and 2"));
}

TEST(TokenFileTest, RefusesBadTokenWidth) {
  TestDir dir;
  ASSERT_TRUE(WriteTokenFile(dir / "t.bin", {1, 2, 3}, 10).ok());
  std::string b = ReadAll(dir / "t.bin");
  b[12] = 3;
  WriteAll(dir / "t.bin", b);
  auto file = TokenFile::Open(dir / "t.bin");
  ASSERT_FALSE(file.ok());
  EXPECT_THAT(file.status().message(), HasSubstr("token width 3"));
}

TEST(TokenFileTest, RefusesTruncatedFile) {
  TestDir dir;
  ASSERT_TRUE(WriteTokenFile(dir / "t.bin", {1, 2, 3, 4}, 10).ok());
  std::string b = ReadAll(dir / "t.bin");
  WriteAll(dir / "t.bin", b.substr(0, b.size() - 1));
  auto file = TokenFile::Open(dir / "t.bin");
  ASSERT_FALSE(file.ok());
  EXPECT_THAT(file.status().message(), HasSubstr("truncated"));
  EXPECT_THAT(file.status().message(), HasSubstr("header says 4 tokens"));
  WriteAll(dir / "t.bin", b.substr(0, 10));
  file = TokenFile::Open(dir / "t.bin");
  ASSERT_FALSE(file.ok());
  EXPECT_THAT(file.status().message(), HasSubstr("truncated"));
}

// A token at or above the header's vocab is damage, found by the read that meets it (the file is
// opened by its header alone): DataLoss naming the token, its byte offset and value; reads that
// do not reach it succeed.
TEST(TokenFileTest, RefusesTokenOutsideVocabWhenRead) {
  TestDir dir;
  ASSERT_TRUE(WriteTokenFile(dir / "t.bin", {1, 2, 3, 4}, 10).ok());
  std::string b = ReadAll(dir / "t.bin");
  b[28 + 2 * 2] = 10;  // token 2 := 10 == vocab
  WriteAll(dir / "t.bin", b);
  auto file = TokenFile::Open(dir / "t.bin");
  ASSERT_TRUE(file.ok()) << file.status();
  std::vector<int32_t> back(4);
  ASSERT_TRUE((*file)->Read(0, 2, back.data()).ok());
  ASSERT_TRUE((*file)->Read(3, 1, back.data()).ok());
  EXPECT_EQ(back[0], 4);
  const absl::Status read = (*file)->Read(1, 3, back.data());
  EXPECT_TRUE(absl::IsDataLoss(read)) << read;
  EXPECT_THAT(read.message(), HasSubstr("token 2 (byte offset 32) has value 10"));
  EXPECT_THAT(read.message(), HasSubstr("vocab 10"));
  // A 4-byte token above INT32_MAX is refused, not wrapped to a negative id.
  ASSERT_TRUE(WriteTokenFile(dir / "w.bin", {1, 2}, 100000).ok());
  b = ReadAll(dir / "w.bin");
  b[28 + 4 + 3] = static_cast<char>(0x80);  // token 1 := 0x80000002
  WriteAll(dir / "w.bin", b);
  file = TokenFile::Open(dir / "w.bin");
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_THAT((*file)->Read(0, 2, back.data()).message(), HasSubstr("has value 2147483650"));
}

TEST(TokenFileTest, RefusesVocabLargerThanModel) {
  TestDir dir;
  ASSERT_TRUE(WriteTokenFile(dir / "t.bin", {1, 2}, 257).ok());
  EXPECT_TRUE(TokenFile::Open(dir / "t.bin", 257).ok());
  EXPECT_TRUE(TokenFile::Open(dir / "t.bin", 512).ok());  // a padded model vocab is fine
  auto file = TokenFile::Open(dir / "t.bin", 256);
  ASSERT_FALSE(file.ok());
  EXPECT_THAT(file.status().message(), HasSubstr("exceeds the model's vocab 256"));
}

TEST(TokenFileTest, WriterRefusesOutOfRangeTokens) {
  TestDir dir;
  auto writer = TokenFileWriter::Create(dir / "t.bin", 10, 2);
  ASSERT_TRUE(writer.ok());
  const int32_t bad[] = {3, 10};
  EXPECT_FALSE((*writer)->Append(bad, 2).ok());
  EXPECT_FALSE(TokenFileWriter::Create(dir / "u.bin", 70000, 2).ok());
  EXPECT_FALSE(TokenFile::Open(dir / "missing.bin").ok());
}

TEST(TokenFileTest, VersionTwoRecordsTheTokenizerIdentity) {
  TestDir dir;
  const std::string identity = "sentencepiece:" + std::string(64, 'a');
  ASSERT_TRUE(WriteTokenFile(dir / "t.bin", {1, 2, 258}, 300, identity).ok());
  const std::string b = ReadAll(dir / "t.bin");
  const size_t header = 28 + 4 + identity.size();
  ASSERT_EQ(b.size(), header + 6u);
  EXPECT_EQ(b.substr(0, 8), "FURNTOK1");
  EXPECT_EQ(b[8], 2);                                             // version
  EXPECT_EQ(static_cast<unsigned char>(b[28]), identity.size());  // identity length
  EXPECT_EQ(b.substr(32, identity.size()), identity);
  EXPECT_EQ(b[header + 4], 2);  // token 258 = 0x0102, little-endian
  EXPECT_EQ(b[header + 5], 1);
  auto file = TokenFile::Open(dir / "t.bin", 300);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ((*file)->version(), 2);
  EXPECT_EQ((*file)->identity(), identity);
  std::vector<int32_t> back(3);
  ASSERT_TRUE((*file)->Read(0, 3, back.data()).ok());
  EXPECT_EQ(back, (std::vector<int32_t>{1, 2, 258}));
}

// A version 1 file written byte by byte as the format was before identities (not by this build's
// writer) still reads, with its identity unknown.
TEST(TokenFileTest, ReadsVersionOneFiles) {
  TestDir dir;
  std::string b = "FURNTOK1";
  for (uint32_t v : {1u, 2u}) b += std::string(reinterpret_cast<const char*>(&v), 4);
  const uint64_t count = 2;
  b += std::string(reinterpret_cast<const char*>(&count), 8);
  const uint32_t vocab = 257;
  b += std::string(reinterpret_cast<const char*>(&vocab), 4);
  b += std::string("\x00\x01\x05\x00", 4);  // tokens 256, 5
  WriteAll(dir / "v1.bin", b);
  auto file = TokenFile::Open(dir / "v1.bin", 257);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ((*file)->version(), 1);
  EXPECT_EQ((*file)->identity(), "");
  std::vector<int32_t> back(2);
  ASSERT_TRUE((*file)->Read(0, 2, back.data()).ok());
  EXPECT_EQ(back, (std::vector<int32_t>{256, 5}));
  // A version 1 file does not say which tokenizer made it: any data.tokenizer passes.
  EXPECT_TRUE(CheckTokenizerIdentity(**file, "byte").ok());
}

TEST(TokenFileTest, RefusesBadIdentityLength) {
  TestDir dir;
  ASSERT_TRUE(WriteTokenFile(dir / "t.bin", {1, 2}, 10, "byte").ok());
  std::string b = ReadAll(dir / "t.bin");
  b[28] = 0;
  WriteAll(dir / "t.bin", b);
  auto file = TokenFile::Open(dir / "t.bin");
  ASSERT_FALSE(file.ok());
  EXPECT_THAT(file.status().message(), HasSubstr("identity length 0 (allowed: 1 to 256"));
  b[28] = 100;  // longer than the file
  WriteAll(dir / "t.bin", b);
  file = TokenFile::Open(dir / "t.bin");
  ASSERT_FALSE(file.ok());
  EXPECT_THAT(file.status().message(), HasSubstr("truncated"));
  WriteAll(dir / "t.bin", b.substr(0, 30));  // cut inside the identity's length: corrupt
  file = TokenFile::Open(dir / "t.bin");
  ASSERT_FALSE(file.ok());
  EXPECT_TRUE(absl::IsDataLoss(file.status())) << file.status();
  EXPECT_THAT(file.status().message(), HasSubstr("truncated: 30 bytes"));
  EXPECT_FALSE(TokenFileWriter::Create(dir / "u.bin", 10, 2, std::string(257, 'x')).ok());
}

TEST(TokenFileTest, TokenizerMismatchIsRefusedNamingBoth) {
  TestDir dir;
  WriteAll(dir / "tok.model", "not really a model, but its hash is an identity");
  ASSERT_TRUE(WriteTokenFile(dir / "byte.bin", {1, 2}, 257, "byte").ok());
  auto file = TokenFile::Open(dir / "byte.bin");
  ASSERT_TRUE(file.ok());
  EXPECT_TRUE(CheckTokenizerIdentity(**file, "byte").ok());
  absl::Status s = CheckTokenizerIdentity(**file, dir / "tok.model");
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr(dir / "byte.bin"));
  EXPECT_THAT(s.message(), HasSubstr("made by tokenizer byte"));
  EXPECT_THAT(s.message(),
              HasSubstr("data.tokenizer is " + dir / "tok.model" + " (sentencepiece:"));

  auto identity = TokenizerIdentity(dir / "tok.model");
  ASSERT_TRUE(identity.ok());
  ASSERT_TRUE(WriteTokenFile(dir / "sp.bin", {1, 2}, 300, *identity).ok());
  file = TokenFile::Open(dir / "sp.bin");
  ASSERT_TRUE(file.ok());
  EXPECT_TRUE(CheckTokenizerIdentity(**file, dir / "tok.model").ok());
  s = CheckTokenizerIdentity(**file, "byte");
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("made by tokenizer " + *identity));
  // The model changed since the data was made: another identity.
  WriteAll(dir / "tok.model", "retrained");
  EXPECT_EQ(CheckTokenizerIdentity(**file, dir / "tok.model").code(),
            absl::StatusCode::kFailedPrecondition);
  // The job's model cannot be read: NOT_FOUND naming it.
  s = CheckTokenizerIdentity(**file, dir / "missing.model");
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(s.message(), HasSubstr("missing.model"));
}

TEST(TokenizerIdentityTest, Sha256OfKnownText) {
  // FIPS 180-2 test vector.
  EXPECT_EQ(Sha256Hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  TestDir dir;
  WriteAll(dir / "abc", "abc");
  EXPECT_EQ(*Sha256OfFile(dir / "abc"), Sha256Hex("abc"));
  EXPECT_EQ(*TokenizerIdentity(dir / "abc"), "sentencepiece:" + Sha256Hex("abc"));
  EXPECT_EQ(*TokenizerIdentity("byte"), "byte");
}

// A token file cut short while a job has it open: the read that meets the missing tokens is an
// error naming the file and the byte offset (Unavailable: a restart opens it again and judges what
// it finds), never a SIGBUS; the tokens still there read.
TEST(TokenFileTest, AFileCutShortWhileOpenIsAReadErrorNamingIt) {
  TestDir dir;
  const std::string path = dir / "t.bin";
  std::vector<int32_t> tokens(10000);
  for (int i = 0; i < 10000; ++i) tokens[i] = i % 300;
  ASSERT_TRUE(WriteTokenFile(path, tokens, 300).ok());
  auto file = TokenFile::Open(path, 300);
  ASSERT_TRUE(file.ok()) << file.status();
  std::filesystem::resize_file(path, 28 + 2 * 5000);
  std::vector<int32_t> back(100);
  ASSERT_TRUE((*file)->Read(4900, 100, back.data()).ok());
  EXPECT_EQ(back[99], 4999 % 300);
  const absl::Status read = (*file)->Read(9000, 100, back.data());
  EXPECT_TRUE(absl::IsUnavailable(read)) << read;
  EXPECT_THAT(read.message(), HasSubstr("token file " + path +
                                        ": cannot read 200 bytes at byte offset 18028: the file "
                                        "has 10028 bytes now and had 20028 when opened"));
  EXPECT_TRUE(absl::IsDataLoss(TokenFile::Open(path, 300).status()));
}

}  // namespace
}  // namespace furnace::data
