#include "runtime/data/token_file.h"

#include <cstring>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/data/byte_tokenizer.h"
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
    (*file)->Read(0, 1000, back.data());
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
  b[8] = 2;
  WriteAll(dir / "t.bin", b);
  auto file = TokenFile::Open(dir / "t.bin");
  ASSERT_FALSE(file.ok());
  EXPECT_THAT(file.status().message(), HasSubstr("unsupported version 2"));
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

TEST(TokenFileTest, RefusesTokenOutsideVocab) {
  TestDir dir;
  ASSERT_TRUE(WriteTokenFile(dir / "t.bin", {1, 2, 3, 4}, 10).ok());
  std::string b = ReadAll(dir / "t.bin");
  b[28 + 2 * 2] = 10;  // token 2 := 10 == vocab
  WriteAll(dir / "t.bin", b);
  auto file = TokenFile::Open(dir / "t.bin");
  ASSERT_FALSE(file.ok());
  EXPECT_THAT(file.status().message(), HasSubstr("token 2 (byte offset 32) has value 10"));
  EXPECT_THAT(file.status().message(), HasSubstr("vocab 10"));
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

TEST(ByteTokenizerTest, TokenizesBytesAndAppendsEndOfDocument) {
  EXPECT_EQ(ByteTokenize("ab\xff", false), (std::vector<int32_t>{'a', 'b', 255}));
  EXPECT_EQ(ByteTokenize("ab", true), (std::vector<int32_t>{'a', 'b', 256}));
}

TEST(ByteTokenizerTest, PreparesATokenFileFromTextFiles) {
  TestDir dir;
  WriteAll(dir / "a.txt", "hello");
  WriteAll(dir / "b.txt", std::string("w\0\xfe", 3));
  auto stats = PrepareTokenFile({dir / "a.txt", dir / "b.txt"}, dir / "out.bin", true);
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->documents, 2);
  EXPECT_EQ(stats->tokens, 10);
  EXPECT_EQ(stats->vocab, 257);
  auto file = TokenFile::Open(dir / "out.bin", 257);
  ASSERT_TRUE(file.ok()) << file.status();
  std::vector<int32_t> tokens((*file)->size());
  (*file)->Read(0, (*file)->size(), tokens.data());
  EXPECT_EQ(tokens, (std::vector<int32_t>{'h', 'e', 'l', 'l', 'o', 256, 'w', 0, 254, 256}));

  auto plain = PrepareTokenFile({dir / "a.txt"}, dir / "plain.bin", false);
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(plain->vocab, 256);
  EXPECT_EQ(plain->tokens, 5);

  auto missing = PrepareTokenFile({dir / "nope.txt"}, dir / "x.bin", false);
  ASSERT_FALSE(missing.ok());
  EXPECT_THAT(missing.status().message(), HasSubstr("nope.txt"));
}

}  // namespace
}  // namespace furnace::data
