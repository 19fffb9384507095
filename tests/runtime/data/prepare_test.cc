// runtime/data/prepare.h: text and JSON Lines into token files with either tokenizer, streamed in
// blocks (a file larger than a block, a line longer than one), and its errors.
#include "runtime/data/prepare.h"

#include <filesystem>
#include <fstream>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/data/byte_tokenizer.h"
#include "runtime/data/sentencepiece_tokenizer.h"
#include "runtime/data/token_file.h"
#include "tests/runtime/data/text_corpus.h"
#include "tests/testing/file_bytes.h"
#include "tests/testing/test_dir.h"

namespace furnace::data {
namespace {

using ::testing::HasSubstr;
using testing_util::ReadAll;
using testing_util::TestDir;
using testing_util::WriteAll;

std::vector<int32_t> ReadTokens(const std::string& path) {
  auto file = TokenFile::Open(path);
  EXPECT_TRUE(file.ok()) << file.status();
  if (!file.ok()) return {};
  std::vector<int32_t> tokens((*file)->size());
  const absl::Status read = (*file)->Read(0, (*file)->size(), tokens.data());
  EXPECT_TRUE(read.ok()) << read;
  return tokens;
}

// The documents of a token file: its ids split at the end-of-document id, each decoded.
std::vector<std::string> Documents(const Tokenizer& t, const std::vector<int32_t>& tokens) {
  std::vector<std::string> docs;
  std::vector<int32_t> doc;
  for (int32_t id : tokens) {
    if (id == t.eod_id()) {
      docs.push_back(t.Decode(doc));
      doc.clear();
    } else {
      doc.push_back(id);
    }
  }
  EXPECT_TRUE(doc.empty()) << "the last document has no end-of-document id";
  return docs;
}

TEST(PrepareTest, ByteTokenizerTextFiles) {
  TestDir dir;
  WriteAll(dir / "a.txt", "hello");
  WriteAll(dir / "b.txt", std::string("w\0\xfe", 3));
  std::vector<std::pair<int64_t, int64_t>> progress;
  auto stats = PrepareTokenFile(
      ByteTokenizer(true), {.inputs = {dir / "a.txt", dir / "b.txt"}, .output = dir / "out.bin"},
      [&](int64_t done, int64_t total) { progress.emplace_back(done, total); });
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->documents, 2);
  EXPECT_EQ(stats->tokens, 10);
  EXPECT_EQ(stats->vocab, 257);
  EXPECT_EQ(stats->input_bytes, 8);
  EXPECT_EQ(ReadTokens(dir / "out.bin"),
            (std::vector<int32_t>{'h', 'e', 'l', 'l', 'o', 256, 'w', 0, 254, 256}));
  auto file = TokenFile::Open(dir / "out.bin");
  EXPECT_EQ((*file)->identity(), "byte");
  ASSERT_FALSE(progress.empty());
  EXPECT_EQ(progress.back(), (std::pair<int64_t, int64_t>{8, 8}));

  auto plain = PrepareTokenFile(ByteTokenizer(false),
                                {.inputs = {dir / "a.txt"}, .output = dir / "plain.bin"});
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(plain->vocab, 256);
  EXPECT_EQ(ReadTokens(dir / "plain.bin"), (std::vector<int32_t>{'h', 'e', 'l', 'l', 'o'}));
}

// Larger than the 1 MiB block, with multi-byte characters everywhere and a line longer than a
// block: the blocks are cut between characters and the file decodes back to itself.
TEST(PrepareTest, StreamsFilesLargerThanABlock) {
  TestDir dir;
  std::string big;
  while (big.size() < (3u << 20) / 2) big += "naïve café 日本語 ";  // one 1.5 MiB line
  big += "\n" + testing_corpus::Corpus(2000);
  WriteAll(dir / "big.txt", big);
  WriteAll(dir / "small.txt", "é");
  ByteTokenizer tokenizer(true);
  auto stats = PrepareTokenFile(
      tokenizer, {.inputs = {dir / "big.txt", dir / "small.txt"}, .output = dir / "big.bin"});
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(Documents(tokenizer, ReadTokens(dir / "big.bin")),
            (std::vector<std::string>{big, "é"}));
}

TEST(PrepareTest, JsonLinesOneDocumentPerLine) {
  TestDir dir;
  WriteAll(dir / "a.jsonl",
           "{\"text\": \"first \\u00e9 doc\\nline two\", \"id\": 1}\n"
           "\n"
           "{\"id\": 2, \"text\": \"日本語\"}\n");
  WriteAll(dir / "b.jsonl", "{\"text\": \"\"}\n{\"text\": \"last\"}");  // no final newline
  ByteTokenizer tokenizer(true);
  auto stats = PrepareTokenFile(tokenizer, {.inputs = {dir / "a.jsonl", dir / "b.jsonl"},
                                            .jsonl_field = "text",
                                            .output = dir / "j.bin"});
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->documents, 4);
  EXPECT_EQ(Documents(tokenizer, ReadTokens(dir / "j.bin")),
            (std::vector<std::string>{"first é doc\nline two", "日本語", "", "last"}));
}

TEST(PrepareTest, ErrorsNameTheFileAndKeepTheOldOutput) {
  TestDir dir;
  WriteAll(dir / "ok.txt", "fine");
  WriteAll(dir / "empty.txt", "");
  WriteAll(dir / "bad.jsonl", "{\"text\": \"a\"}\n{\"body\": \"b\"}\n");
  WriteAll(dir / "broken.jsonl", "{\"text\": \"a\"}\nnot json\n");
  WriteAll(dir / "array.jsonl", "[1, 2]\n");
  WriteAll(dir / "latin1.jsonl", "{\"text\": \"caf\xe9\"}\n");  // Latin-1, not UTF-8
  WriteAll(dir / "blank.jsonl", "\n\n");
  WriteAll(dir / "out.bin", "an older file");
  ByteTokenizer tokenizer(true);
  struct Case {
    std::vector<std::string> inputs;
    std::string jsonl_field;
    absl::StatusCode code;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{dir / "ok.txt", dir / "empty.txt"},
       "",
       absl::StatusCode::kInvalidArgument,
       "input " + dir / "empty.txt" + " is empty"},
      {{dir / "ok.txt", dir / "missing.txt"},
       "",
       absl::StatusCode::kNotFound,
       "input " + dir / "missing.txt" + ": cannot read"},
      {{dir / "bad.jsonl"},
       "text",
       absl::StatusCode::kInvalidArgument,
       "input " + dir / "bad.jsonl" + " line 2: no string field \"text\" (--jsonl-field)"},
      {{dir / "broken.jsonl"},
       "text",
       absl::StatusCode::kInvalidArgument,
       "input " + dir / "broken.jsonl" + " line 2: not JSON: [json.exception.parse_error"},
      {{dir / "array.jsonl"},
       "text",
       absl::StatusCode::kInvalidArgument,
       "input " + dir / "array.jsonl" + " line 1: not a JSON object"},
      {{dir / "latin1.jsonl"},
       "text",
       absl::StatusCode::kInvalidArgument,
       "input " + dir / "latin1.jsonl" + " line 1: not JSON: "},
      {{dir / "blank.jsonl"},
       "text",
       absl::StatusCode::kInvalidArgument,
       "input " + dir / "blank.jsonl" + " has no JSON Lines document"},
  };
  for (const Case& c : cases) {
    auto stats = PrepareTokenFile(
        tokenizer, {.inputs = c.inputs, .jsonl_field = c.jsonl_field, .output = dir / "out.bin"});
    ASSERT_FALSE(stats.ok()) << c.message;
    EXPECT_EQ(stats.status().code(), c.code) << stats.status();
    EXPECT_THAT(stats.status().message(), HasSubstr(c.message));
    EXPECT_EQ(ReadAll(dir / "out.bin"), "an older file") << "the old output is kept";
    for (const auto& entry : std::filesystem::directory_iterator(dir / "")) {
      EXPECT_EQ(entry.path().filename().string().find("out.bin.tmp"), std::string::npos)
          << "no temporary file is left: " << entry.path();
    }
  }
}

// Train a vocabulary, prepare with it, read back: the documents decode to the inputs.
TEST(PrepareTest, SentencePieceEndToEnd) {
  TestDir dir;
  const std::string corpus = testing_corpus::Corpus();
  WriteAll(dir / "corpus.txt", corpus);
  WriteAll(dir / "other.txt", "Ünïcödé that the vocabulary never saw: 🙂\n");
  auto trained = TrainSentencePiece({.inputs = {dir / "corpus.txt"},
                                     .vocab = 320,
                                     .model_type = "bpe",
                                     .output = dir / "tok.model"});
  ASSERT_TRUE(trained.ok()) << trained.status();
  auto tokenizer = OpenTokenizer(dir / "tok.model");
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  auto stats = PrepareTokenFile(
      **tokenizer, {.inputs = {dir / "corpus.txt", dir / "other.txt"}, .output = dir / "sp.bin"});
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->vocab, 320);
  EXPECT_LT(stats->tokens * 4, static_cast<int64_t>(corpus.size()) * 3);  // subwords, not bytes
  auto file = TokenFile::Open(dir / "sp.bin");
  ASSERT_TRUE(file.ok());
  EXPECT_EQ((*file)->identity(), trained->identity);
  EXPECT_TRUE(CheckTokenizerIdentity(**file, dir / "tok.model").ok());
  EXPECT_EQ(CheckTokenizerIdentity(**file, "byte").code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(Documents(**tokenizer, ReadTokens(dir / "sp.bin")),
            (std::vector<std::string>{corpus, ReadAll(dir / "other.txt")}));
}

// SentencePiece would encode bytes that are not UTF-8 as U+FFFD, so a model's text must be UTF-8:
// the run fails naming the file and the byte, wherever it lies (past a block, in a file's last
// bytes); a character across a block boundary is no error. The byte tokenizer takes any bytes.
TEST(PrepareTest, TextForASentencePieceModelMustBeUtf8) {
  TestDir dir;
  WriteAll(dir / "corpus.txt", testing_corpus::Corpus());
  ASSERT_TRUE(TrainSentencePiece(
                  {.inputs = {dir / "corpus.txt"}, .vocab = 320, .output = dir / "tok.model"})
                  .ok());
  auto tokenizer = OpenTokenizer(dir / "tok.model");
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  // 2^20 is 1 mod 3 and 4 mod 19: block ends fall inside characters.
  std::string cjk_line, cjk_lines;
  while (cjk_line.size() < (3u << 20) / 2) cjk_line += "日本語";
  while (cjk_lines.size() < (3u << 20) / 2) cjk_lines += "日本語 日本語\n";
  WriteAll(dir / "line.txt", cjk_line);
  WriteAll(dir / "lines.txt", cjk_lines);
  auto stats = PrepareTokenFile(
      **tokenizer, {.inputs = {dir / "line.txt", dir / "lines.txt"}, .output = dir / "ok.bin"});
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(Documents(**tokenizer, ReadTokens(dir / "ok.bin")),
            (std::vector<std::string>{cjk_line, cjk_lines}));

  const size_t at = cjk_lines.size() - 100;
  const std::string latin1 = cjk_lines.substr(0, at) + "caf\xe9 " + cjk_lines.substr(at);
  const std::string cut_short = cjk_lines + "\xe6\x97";  // the first two bytes of a character
  WriteAll(dir / "latin1.txt", latin1);
  WriteAll(dir / "cut.txt", cut_short);
  for (const auto& [name, offset] : std::vector<std::pair<std::string, size_t>>{
           {"latin1.txt", at + 3}, {"cut.txt", cjk_lines.size()}}) {
    SCOPED_TRACE(name);
    stats = PrepareTokenFile(**tokenizer,
                             {.inputs = {dir / "line.txt", dir / name}, .output = dir / "x.bin"});
    ASSERT_FALSE(stats.ok());
    EXPECT_EQ(stats.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(stats.status().message(),
                HasSubstr("data prepare: input " + dir / name + ": not UTF-8 at byte " +
                          std::to_string(offset) + " "));
    EXPECT_FALSE(std::filesystem::exists(dir / "x.bin"));
  }
  stats = PrepareTokenFile(ByteTokenizer(true), {.inputs = {dir / "latin1.txt", dir / "cut.txt"},
                                                 .output = dir / "b.bin"});
  ASSERT_TRUE(stats.ok()) << stats.status();
}

// A model with a dummy prefix that keeps whitespace (Llama's normalizer, made here by merging
// add_dummy_prefix into a trained model) prepares a document longer than the 1 MiB block into the
// ids of the whole document: each block after the first is encoded as its continuation, with no
// "▁" of its own.
TEST(PrepareTest, ADocumentOfManyBlocksIsEncodedAsAWholeByADummyPrefixModel) {
  TestDir dir;
  WriteAll(dir / "corpus.txt", testing_corpus::Corpus());
  ASSERT_TRUE(TrainSentencePiece({.inputs = {dir / "corpus.txt"},
                                  .vocab = 320,
                                  .model_type = "bpe",
                                  .output = dir / "tok.model"})
                  .ok());
  // NormalizerSpec (ModelProto field 3) { add_dummy_prefix (field 3): true }.
  WriteAll(dir / "prefix.model", ReadAll(dir / "tok.model") + std::string("\x1a\x02\x18\x01", 4));
  auto tokenizer = OpenTokenizer(dir / "prefix.model");
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  std::string book;
  while (book.size() < (5u << 20) / 2) book += testing_corpus::Corpus();  // 2.5 MiB, 3 blocks
  WriteAll(dir / "book.txt", book);
  auto stats =
      PrepareTokenFile(**tokenizer, {.inputs = {dir / "book.txt"}, .output = dir / "book.bin"});
  ASSERT_TRUE(stats.ok()) << stats.status();
  std::vector<int32_t> whole = (*tokenizer)->Encode(book, TextPart::kWhole).value();
  whole.push_back((*tokenizer)->eod_id());
  const std::vector<int32_t> prepared = ReadTokens(dir / "book.bin");
  ASSERT_EQ(prepared.size(), whole.size());
  EXPECT_TRUE(prepared == whole);
}

// A document of one line longer than the 1 MiB block (minified text, a JSON dump without
// newlines) is cut between words, not inside one, so a subword model gives the ids of the whole
// line: a model that removes extra whitespace (the trained one's nmt_nfkc) and one that keeps it
// with a dummy prefix (Llama's). The line repeats a 7-byte "kernel ", so a block's end (2^20 =
// 4 mod 7) falls inside the word, which the vocabulary holds as one piece.
TEST(PrepareTest, ALineLongerThanABlockIsEncodedAsAWhole) {
  TestDir dir;
  std::string corpus = testing_corpus::Corpus();
  for (int i = 0; i < 1000; ++i) corpus += "a kernel, the kernel\n";
  WriteAll(dir / "corpus.txt", corpus);
  ASSERT_TRUE(TrainSentencePiece({.inputs = {dir / "corpus.txt"},
                                  .vocab = 512,
                                  .model_type = "bpe",
                                  .output = dir / "tok.model"})
                  .ok());
  WriteAll(dir / "prefix.model", ReadAll(dir / "tok.model") + std::string("\x1a\x02\x18\x01", 4));
  std::string line;
  while (line.size() < (5u << 20) / 2) line += "kernel ";  // 2.5 MiB, 3 blocks
  line += " trailing   runs  of whitespace";
  WriteAll(dir / "line.txt", line);
  for (const char* model : {"tok.model", "prefix.model"}) {
    SCOPED_TRACE(model);
    auto tokenizer = OpenTokenizer(dir / model);
    ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
    const std::vector<int32_t> word = (*tokenizer)->Encode(" kernel", TextPart::kMiddle).value();
    ASSERT_EQ(word.size(), 1u) << "the word is one piece";
    auto stats =
        PrepareTokenFile(**tokenizer, {.inputs = {dir / "line.txt"}, .output = dir / "line.bin"});
    ASSERT_TRUE(stats.ok()) << stats.status();
    std::vector<int32_t> whole = (*tokenizer)->Encode(line, TextPart::kWhole).value();
    whole.push_back((*tokenizer)->eod_id());
    const std::vector<int32_t> prepared = ReadTokens(dir / "line.bin");
    ASSERT_EQ(prepared.size(), whole.size());
    EXPECT_TRUE(prepared == whole);
  }
}

}  // namespace
}  // namespace furnace::data
