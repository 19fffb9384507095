// furnace data prepare and data tokenizer train: text files in, a SentencePiece model and token
// files out, read back with data::TokenFile.
#include <fstream>
#include <sstream>

#include "controller/cli/commands.h"
#include "controller/cli/exit_codes.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/data/token_file.h"
#include "runtime/data/tokenizer.h"
#include "tests/testing/test_dir.h"

namespace furnace::cli {
namespace {

using testing_util::TestDir;

class DataPrepareTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ctx_.out = &out_;
    ctx_.err = &err_;  // no client: data prepare must not need the controller
    std::ofstream(dir_ / "a.txt", std::ios::binary) << "hi\n";
    std::ofstream(dir_ / "b.txt", std::ios::binary) << std::string("\xc3\xa9z", 3);
  }

  std::vector<int32_t> ReadTokens(const std::string& path, int64_t* vocab) {
    auto file = data::TokenFile::Open(path);
    EXPECT_TRUE(file.ok()) << file.status();
    if (!file.ok()) return {};
    *vocab = (*file)->vocab();
    std::vector<int32_t> tokens((*file)->size());
    const absl::Status read = (*file)->Read(0, (*file)->size(), tokens.data());
    EXPECT_TRUE(read.ok()) << read;
    return tokens;
  }

  TestDir dir_;
  std::ostringstream out_, err_;
  CommandContext ctx_;
};

TEST_F(DataPrepareTest, RoundTripWithEndOfDocument) {
  const std::string output = dir_ / "train.tok";
  auto code = RunDataPrepare(
      ctx_, {.inputs = {dir_ / "a.txt", dir_ / "b.txt"}, .output = output, .eod = true});
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, kExitOk);
  EXPECT_EQ(out_.str(), "wrote " + output +
                            ": 2 documents, 8 tokens, vocab 257 (byte tokenizer, end-of-document "
                            "id 256)\n");
  int64_t vocab = 0;
  EXPECT_EQ(ReadTokens(output, &vocab),
            (std::vector<int32_t>{'h', 'i', '\n', 256, 0xc3, 0xa9, 'z', 256}));
  EXPECT_EQ(vocab, 257);
}

TEST_F(DataPrepareTest, RoundTripBytesOnly) {
  const std::string output = dir_ / "train.tok";
  auto code = RunDataPrepare(ctx_, {.inputs = {dir_ / "a.txt"}, .output = output});
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(out_.str(), "wrote " + output + ": 1 document, 3 tokens, vocab 256 (byte tokenizer)\n");
  int64_t vocab = 0;
  EXPECT_EQ(ReadTokens(output, &vocab), (std::vector<int32_t>{'h', 'i', '\n'}));
  EXPECT_EQ(vocab, 256);
  EXPECT_EQ(err_.str().find("end-of-document"), std::string::npos)  // one document: no note
      << err_.str();
}

// Without --eod the byte tokenizer separates nothing: with several documents it says so.
TEST_F(DataPrepareTest, DocumentsWithoutASeparatorAreNoted) {
  auto code = RunDataPrepare(
      ctx_, {.inputs = {dir_ / "a.txt", dir_ / "b.txt"}, .output = dir_ / "train.tok"});
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_NE(err_.str().find("no end-of-document id between the 2 documents"), std::string::npos)
      << err_.str();
  EXPECT_NE(err_.str().find("--eod separates them"), std::string::npos) << err_.str();
}

TEST_F(DataPrepareTest, Errors) {
  auto code = RunDataPrepare(ctx_, {.inputs = {}, .output = dir_ / "x.tok"});
  EXPECT_EQ(ExitCodeForStatus(code.status()), kExitUsage);
  code = RunDataPrepare(ctx_, {.inputs = {dir_ / "a.txt"}, .output = ""});
  EXPECT_EQ(ExitCodeForStatus(code.status()), kExitUsage);
  // A missing input is the loader's NOT_FOUND, but it is a local file, not a job: exit 5, not 4.
  code = RunDataPrepare(ctx_, {.inputs = {dir_ / "missing.txt"}, .output = dir_ / "x.tok"});
  EXPECT_EQ(ExitCodeForStatus(code.status()), kExitLocalError);
  EXPECT_NE(code.status().message().find("missing.txt"), std::string::npos) << code.status();
  code = RunDataPrepare(ctx_, {.inputs = {dir_ / "a.txt"}, .output = dir_ / "no/such/dir/x.tok"});
  EXPECT_EQ(ExitCodeForStatus(code.status()), kExitLocalError) << code.status();
  EXPECT_TRUE(out_.str().empty());
}

TEST_F(DataPrepareTest, Json) {
  ctx_.json = true;
  auto code = RunDataPrepare(ctx_, {.inputs = {dir_ / "a.txt"}, .output = dir_ / "t.tok"});
  ASSERT_TRUE(code.ok()) << code.status();
  for (const char* want : {"\"documents\": 1", "\"tokens\": 3", "\"vocab\": 256"}) {
    EXPECT_NE(out_.str().find(want), std::string::npos) << out_.str();
  }
}

// A small corpus with non-ASCII text, enough for a 300-piece vocabulary.
std::string Corpus() {
  std::string text;
  for (int i = 0; i < 300; ++i) {
    text += "line " + std::to_string(i % 17) + ": the experts route tokens, naïve café über ";
    text += (i % 3 == 0 ? "日本語" : "données") + std::string("\n");
  }
  return text;
}

TEST_F(DataPrepareTest, TrainTokenizerThenPrepare) {
  std::ofstream(dir_ / "corpus.txt", std::ios::binary) << Corpus();
  const std::string model = dir_ / "tok.model";
  auto code = RunTokenizerTrain(
      ctx_, {.inputs = {dir_ / "corpus.txt"}, .vocab = 300, .model_type = "bpe", .output = model});
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, kExitOk);
  const std::string identity = *data::TokenizerIdentity(model);
  EXPECT_THAT(out_.str(), ::testing::StartsWith("wrote " + model +
                                                ": SentencePiece bpe model, vocab 300 "
                                                "(end-of-document id 1), trained on "));
  EXPECT_THAT(out_.str(), ::testing::EndsWith(" KiB in 1 file\nidentity " + identity + "\n"));

  out_.str("");
  const std::string output = dir_ / "train.tok";
  code = RunDataPrepare(
      ctx_,
      {.inputs = {dir_ / "corpus.txt", dir_ / "b.txt"}, .output = output, .tokenizer = model});
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_THAT(out_.str(), ::testing::StartsWith("wrote " + output + ": 2 documents, "));
  EXPECT_THAT(out_.str(),
              ::testing::HasSubstr("vocab 300 (" + identity + ", end-of-document id 1)\n"));
  EXPECT_THAT(err_.str(), ::testing::HasSubstr("] 100%"));  // the progress bar
  auto file = data::TokenFile::Open(output);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ((*file)->identity(), identity);
  EXPECT_EQ((*file)->vocab(), 300);
  auto tokenizer = data::OpenTokenizer(model);
  ASSERT_TRUE(tokenizer.ok());
  std::vector<int32_t> tokens((*file)->size());
  ASSERT_TRUE((*file)->Read(0, (*file)->size(), tokens.data()).ok());
  EXPECT_EQ((*tokenizer)->Decode(tokens), Corpus() + std::string("\xc3\xa9z", 3));
}

// SentencePiece skips lines longer than it takes: they are cut and trained on, and the output
// says so.
TEST_F(DataPrepareTest, TrainTokenizerSaysWhatItDidWithLongLines) {
  std::string long_line;
  while (long_line.size() < 10000) long_line += "the experts route tokens ";
  std::ofstream(dir_ / "corpus.txt", std::ios::binary) << Corpus() << long_line << "\n";
  auto code = RunTokenizerTrain(
      ctx_, {.inputs = {dir_ / "corpus.txt"}, .vocab = 300, .output = dir_ / "tok.model"});
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_THAT(out_.str(), ::testing::HasSubstr("\n1 line longer than 4192 bytes (SentencePiece's "
                                               "longest sentence) trained on as 3 pieces"));
}

TEST_F(DataPrepareTest, TokenizerErrors) {
  std::ofstream(dir_ / "corpus.txt", std::ios::binary) << Corpus();
  std::ofstream(dir_ / "empty.txt", std::ios::binary) << "";
  TokenizerTrainOptions train{
      .inputs = {dir_ / "empty.txt"}, .vocab = 300, .output = dir_ / "tok.model"};
  auto code = RunTokenizerTrain(ctx_, train);
  EXPECT_EQ(ExitCodeForStatus(code.status()), kExitLocalError);
  EXPECT_THAT(code.status().message(), ::testing::HasSubstr(dir_ / "empty.txt" + " is empty"));
  train.inputs = {dir_ / "corpus.txt"};
  train.vocab = 50000;
  code = RunTokenizerTrain(ctx_, train);
  EXPECT_EQ(ExitCodeForStatus(code.status()), kExitLocalError);
  EXPECT_THAT(code.status().message(), ::testing::HasSubstr("--vocab 50000 is too large"));
  train.vocab = 300;
  train.model_type = "char";
  code = RunTokenizerTrain(ctx_, train);
  EXPECT_EQ(ExitCodeForStatus(code.status()), kExitUsage);
  EXPECT_THAT(code.status().message(), ::testing::HasSubstr("(allowed: unigram, bpe)"));
  train.model_type = "bpe";
  train.character_coverage = 0.5;
  code = RunTokenizerTrain(ctx_, train);
  EXPECT_EQ(ExitCodeForStatus(code.status()), kExitUsage);
  EXPECT_THAT(code.status().message(),
              ::testing::HasSubstr("--character-coverage 0.5 (allowed: 0.98 to 1"));
  train.character_coverage = 1;

  code = RunDataPrepare(
      ctx_,
      {.inputs = {dir_ / "a.txt"}, .output = dir_ / "x.tok", .tokenizer = dir_ / "missing.model"});
  EXPECT_EQ(ExitCodeForStatus(code.status()), kExitLocalError);
  EXPECT_THAT(code.status().message(), ::testing::HasSubstr(dir_ / "missing.model"));
  code = RunDataPrepare(ctx_,
                        {.inputs = {dir_ / "a.txt", dir_ / "empty.txt"}, .output = dir_ / "x.tok"});
  EXPECT_EQ(ExitCodeForStatus(code.status()), kExitLocalError);
  EXPECT_THAT(code.status().message(), ::testing::HasSubstr(dir_ / "empty.txt" + " is empty"));
  code = RunDataPrepare(ctx_, {.inputs = {dir_ / "a.txt"},
                               .output = dir_ / "x.tok",
                               .tokenizer = dir_ / "tok.model",
                               .eod = true});
  EXPECT_EQ(ExitCodeForStatus(code.status()), kExitUsage);
  EXPECT_FALSE(std::ifstream(dir_ / "x.tok").good());
  EXPECT_TRUE(out_.str().empty());
}

}  // namespace
}  // namespace furnace::cli
