// The tokenizers behind runtime/data/tokenizer.h: byte-level and SentencePiece (BPE and unigram),
// trained here on a small corpus. Round trips on text with non-ASCII characters, identities, and
// the trainer's errors.
#include "runtime/data/tokenizer.h"

#include <cmath>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/data/byte_tokenizer.h"
#include "runtime/data/sentencepiece_tokenizer.h"
#include "runtime/data/training_sentences.h"
#include "tests/runtime/data/text_corpus.h"
#include "tests/testing/file_bytes.h"
#include "tests/testing/test_dir.h"

namespace furnace::data {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using testing_util::ReadAll;
using testing_util::TestDir;
using testing_util::WriteAll;

// Not in the corpus: characters the vocabulary lacks come back through byte fallback.
const std::string kSample =
    "  Héllo wörld, naïve café\n\tÆsir — “quotes” 日本語 and emoji 🙂\n\nend with "
    "spaces "
    " "
    "\n";

TEST(ByteTokenizerTest, TokenizesBytesAndAppendsEndOfDocument) {
  EXPECT_EQ(ByteTokenize("ab\xff", false), (std::vector<int32_t>{'a', 'b', 255}));
  EXPECT_EQ(ByteTokenize("ab", true), (std::vector<int32_t>{'a', 'b', 256}));
}

TEST(ByteTokenizerTest, RoundTripsNonAscii) {
  auto tokenizer = OpenTokenizer("byte");
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  const Tokenizer& t = **tokenizer;
  EXPECT_EQ(t.vocab(), 257);
  EXPECT_EQ(t.eod_id(), 256);
  EXPECT_EQ(t.identity(), "byte");
  const std::vector<int32_t> ids = t.Encode(kSample, TextPart::kWhole).value();
  EXPECT_EQ(ids.size(), kSample.size());
  EXPECT_EQ(t.Decode(ids), kSample);
  std::vector<int32_t> with_eod = ids;
  with_eod.push_back(t.eod_id());
  with_eod.push_back(9999);  // outside the vocab: dropped
  EXPECT_EQ(t.Decode(with_eod), kSample);
  EXPECT_EQ(ByteTokenizer(false).vocab(), 256);
  EXPECT_EQ(ByteTokenizer(false).eod_id(), -1);
}

class SentencePieceTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override { WriteAll(dir_ / "corpus.txt", testing_corpus::Corpus()); }
  SentencePieceTrainOptions Options(int64_t vocab) {
    return {.inputs = {dir_ / "corpus.txt"},
            .vocab = vocab,
            .model_type = GetParam(),
            .output = dir_ / "tok.model"};
  }
  TestDir dir_;
};

TEST_P(SentencePieceTest, TrainsAndRoundTripsNonAscii) {
  auto trained = TrainSentencePiece(Options(330));
  ASSERT_TRUE(trained.ok()) << trained.status();
  EXPECT_EQ(trained->vocab, 330);
  const std::string model_bytes = ReadAll(dir_ / "tok.model");
  EXPECT_EQ(trained->identity, "sentencepiece:" + Sha256Hex(model_bytes));

  auto tokenizer = OpenTokenizer(dir_ / "tok.model");
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  const Tokenizer& t = **tokenizer;
  EXPECT_EQ(t.vocab(), 330);
  EXPECT_EQ(t.eod_id(), kSentencePieceEodId);
  EXPECT_EQ(t.identity(), trained->identity);
  EXPECT_EQ(*TokenizerIdentity(dir_ / "tok.model"), trained->identity);

  for (const std::string& text : {kSample, testing_corpus::Corpus(50), std::string("x"),
                                  std::string("\n\n"), std::string(" ")}) {
    const std::vector<int32_t> ids = t.Encode(text, TextPart::kWhole).value();
    for (int32_t id : ids) {
      ASSERT_GE(id, 0);
      ASSERT_LT(id, t.vocab());
      ASSERT_NE(id, 0) << "<unk> in the encoding of " << text;  // byte fallback instead
      ASSERT_NE(id, t.eod_id());
    }
    EXPECT_EQ(t.Decode(ids), text);
  }
  // Subwords, not bytes: the corpus's own text takes far fewer ids than bytes.
  const std::string corpus = testing_corpus::Corpus(50);
  EXPECT_LT(t.Encode(corpus, TextPart::kWhole)->size() * 4, corpus.size() * 3);
  // The end-of-document id and ids outside the vocab decode to nothing.
  std::vector<int32_t> ids = t.Encode("naïve café", TextPart::kWhole).value();
  ids.insert(ids.begin() + 1, t.eod_id());
  ids.push_back(-1);
  ids.push_back(330);
  EXPECT_EQ(t.Decode(ids), "naïve café");
}

TEST_P(SentencePieceTest, RefusesVocabTooLargeForTheText) {
  auto trained = TrainSentencePiece(Options(100000));
  ASSERT_FALSE(trained.ok());
  EXPECT_EQ(trained.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(trained.status().message(), HasSubstr("--vocab 100000 is too large for this text"));
  EXPECT_THAT(trained.status().message(), HasSubstr("use --vocab "));
  EXPECT_FALSE(std::ifstream(dir_ / "tok.model").good()) << "nothing written";
}

// The ids of `text` encoded in parts cut at `cuts` (increasing), each as what it is (first,
// middle, last), or each as a whole document when `as_whole`.
std::vector<int32_t> InParts(const Tokenizer& t, const std::string& text,
                             const std::vector<size_t>& cuts, bool as_whole = false) {
  std::vector<int32_t> ids;
  for (size_t i = 0; i <= cuts.size(); ++i) {
    const size_t begin = i == 0 ? 0 : cuts[i - 1];
    const size_t end = i == cuts.size() ? text.size() : cuts[i];
    const TextPart part = as_whole           ? TextPart::kWhole
                          : i == 0           ? TextPart::kFirst
                          : i == cuts.size() ? TextPart::kLast
                                             : TextPart::kMiddle;
    const std::vector<int32_t> got = t.Encode(text.substr(begin, end - begin), part).value();
    ids.insert(ids.end(), got.begin(), got.end());
  }
  return ids;
}

// A document cut after newlines and encoded part by part gives the ids of the whole, with the
// models trained here (no dummy whitespace), with a model that adds a dummy prefix and keeps
// whitespace, as Llama's and Mistral's do, and with one whose dummy whitespace is a suffix: made
// here by merging add_dummy_prefix (and treat_whitespace_as_suffix) into a trained model's specs,
// as protobuf merges a repeated message field. Encoded each as a whole document, the parts of
// the last two would gain a "▁" at every cut.
TEST_P(SentencePieceTest, ADocumentEncodedInPartsGivesTheIdsOfTheWhole) {
  ASSERT_TRUE(TrainSentencePiece(Options(330)).ok());
  const std::string trained = ReadAll(dir_ / "tok.model");
  // NormalizerSpec (ModelProto field 3) { add_dummy_prefix (field 3): true }.
  const std::string dummy("\x1a\x02\x18\x01", 4);
  // TrainerSpec (ModelProto field 2) { treat_whitespace_as_suffix (field 24): true }.
  const std::string suffix("\x12\x03\xc0\x01\x01", 5);
  WriteAll(dir_ / "prefix.model", trained + dummy);
  WriteAll(dir_ / "suffix.model", trained + suffix + dummy);
  const std::string text = testing_corpus::Corpus(40) + kSample;
  std::vector<size_t> newlines;
  for (size_t i = 0; i + 1 < text.size(); ++i) {
    if (text[i] == '\n') newlines.push_back(i + 1);
  }
  ASSERT_GT(newlines.size(), 40u);
  for (const std::string model : {"tok.model", "prefix.model", "suffix.model"}) {
    auto tokenizer = OpenTokenizer(dir_ / model);
    ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
    const Tokenizer& t = **tokenizer;
    const std::vector<int32_t> whole = t.Encode(text, TextPart::kWhole).value();
    if (model != "suffix.model") {
      EXPECT_EQ(t.Decode(whole), text) << model;  // decoding drops a dummy prefix
    }
    int differ_as_whole = 0;
    for (size_t i = 0; i + 1 < newlines.size(); ++i) {
      const std::vector<size_t> one{newlines[i]}, two{newlines[i], newlines[i + 1]};
      ASSERT_EQ(InParts(t, text, one), whole) << model << ", cut at byte " << newlines[i];
      ASSERT_EQ(InParts(t, text, two), whole)
          << model << ", cut at bytes " << newlines[i] << " and " << newlines[i + 1];
      differ_as_whole += InParts(t, text, one, /*as_whole=*/true) != whole ? 1 : 0;
    }
    // Only the models with a dummy whitespace tell a part from a whole document.
    EXPECT_EQ(differ_as_whole, model == "tok.model" ? 0 : static_cast<int>(newlines.size()) - 1)
        << model;
  }
}

INSTANTIATE_TEST_SUITE_P(ModelTypes, SentencePieceTest, ::testing::Values("unigram", "bpe"));

TEST(SentencePieceTrainTest, ErrorsNameTheFileOrOption) {
  TestDir dir;
  WriteAll(dir / "corpus.txt", testing_corpus::Corpus());
  WriteAll(dir / "empty.txt", "");
  SentencePieceTrainOptions options{
      .inputs = {dir / "corpus.txt", dir / "empty.txt"}, .vocab = 400, .output = dir / "t.model"};
  auto trained = TrainSentencePiece(options);
  ASSERT_FALSE(trained.ok());
  EXPECT_EQ(trained.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(trained.status().message(), HasSubstr("input " + dir / "empty.txt" + " is empty"));

  options.inputs = {dir / "missing.txt"};
  trained = TrainSentencePiece(options);
  EXPECT_EQ(trained.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(trained.status().message(), HasSubstr(dir / "missing.txt"));

  options.inputs = {dir / "corpus.txt"};
  options.model_type = "wordpiece";
  trained = TrainSentencePiece(options);
  EXPECT_THAT(trained.status().message(), HasSubstr("(allowed: unigram, bpe)"));

  options.model_type = "bpe";
  options.vocab = 100;
  trained = TrainSentencePiece(options);
  EXPECT_THAT(trained.status().message(), HasSubstr("--vocab 100 is too small (allowed: 260"));

  options.vocab = 400;
  options.output = dir / "no/such/dir/t.model";
  trained = TrainSentencePiece(options);
  EXPECT_EQ(trained.status().code(), absl::StatusCode::kInternal);
  EXPECT_THAT(trained.status().message(), HasSubstr("no/such/dir/t.model"));
}

// SentencePiece skips a sentence longer than kMaxTrainingSentenceBytes without a word (its log is
// off): a long line is cut into pieces under the limit instead, before a space where it has one,
// else between two characters, and the result says how many lines were long.
TEST(SentencePieceTrainTest, LearnsFromLinesLongerThanSentencePieceTakes) {
  TestDir dir;
  std::string long_lines;
  for (int i = 0; i < 6; ++i) {
    std::string line;
    while (line.size() < 3 * kMaxTrainingSentenceBytes) line += "zyxwvutsrq ";
    long_lines += line + "\n";
  }
  WriteAll(dir / "long.txt", long_lines);
  WriteAll(dir / "corpus.txt", testing_corpus::Corpus());
  SentencePieceTrainOptions options{
      .inputs = {dir / "long.txt", dir / "corpus.txt"}, .vocab = 330, .output = dir / "t.model"};
  auto trained = TrainSentencePiece(options);
  ASSERT_TRUE(trained.ok()) << trained.status();
  EXPECT_EQ(trained->long_lines, 6);
  EXPECT_GE(trained->long_line_pieces, 6 * 3);
  auto tokenizer = OpenTokenizer(dir / "t.model");
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  // Learned from the long lines: a piece or two, not ten byte pieces.
  EXPECT_LE((*tokenizer)->Encode(" zyxwvutsrq", TextPart::kWhole)->size(), 2u);

  // Every line long: trains all the same (it was "SentencePiece refused: " and nothing more).
  options.inputs = {dir / "long.txt"};
  options.vocab = 270;
  trained = TrainSentencePiece(options);
  ASSERT_TRUE(trained.ok()) << trained.status();
  EXPECT_EQ(trained->long_lines, 6);
}

// 3,259 distinct CJK characters, 1,000 of them common (words of two) and 2,259 seen once each
// (1.9% of the text): at character coverage 1.0 every one needs a piece of its own.
std::string CjkCorpus() {
  auto character = [](int i) {
    const int c = 0x4E00 + i;  // three bytes of UTF-8
    return std::string{static_cast<char>(0xE0 | (c >> 12)),
                       static_cast<char>(0x80 | ((c >> 6) & 0x3F)),
                       static_cast<char>(0x80 | (c & 0x3F))};
  };
  std::string text;
  for (int line = 0; line < 4000; ++line) {
    for (int w = 0; w < 15; ++w) {
      const int word = (line * 31 + w * 7) % 500;
      text += character(2 * word) + character(2 * word + 1);
    }
    text += "\n";
  }
  for (int i = 1000; i < 3259; ++i) text += character(i) + (i % 40 == 0 ? "\n" : "");
  return text + "\n";
}

// The vocabulary need not hold every character (byte fallback spells the rest): the coverage is
// an option, and SentencePiece's advice to lower it names furnace's flags.
TEST(SentencePieceTrainTest, CharacterCoverageLeavesRareCharactersToBytes) {
  TestDir dir;
  WriteAll(dir / "cjk.txt", CjkCorpus());
  SentencePieceTrainOptions options{
      .inputs = {dir / "cjk.txt"}, .vocab = 2000, .output = dir / "t.model"};
  options.character_coverage = 1.0;
  auto trained = TrainSentencePiece(options);
  ASSERT_FALSE(trained.ok());
  EXPECT_EQ(trained.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(trained.status().message(),
              HasSubstr("--vocab 2000 is too small for the characters that make up "
                        "--character-coverage 1 of this text"));
  EXPECT_THAT(trained.status().message(), HasSubstr("use --vocab 3518 or more"));
  EXPECT_THAT(trained.status().message(), HasSubstr("or a lower --character-coverage"));
  EXPECT_THAT(trained.status().message(), Not(HasSubstr("--character_coverage")));

  options.character_coverage = 0.98;
  trained = TrainSentencePiece(options);
  ASSERT_TRUE(trained.ok()) << trained.status();
  auto tokenizer = OpenTokenizer(dir / "t.model");
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  const std::string text = CjkCorpus();
  EXPECT_EQ((*tokenizer)->Decode((*tokenizer)->Encode(text, TextPart::kWhole).value()), text);

  for (double coverage : {0.0, 0.97, 1.5, std::nan("")}) {
    options.character_coverage = coverage;
    trained = TrainSentencePiece(options);
    ASSERT_FALSE(trained.ok()) << coverage;
    EXPECT_EQ(trained.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(trained.status().message(), HasSubstr("--character-coverage"));
    EXPECT_THAT(trained.status().message(), HasSubstr("(allowed: 0.98 to 1"));
  }
}

// SentencePiece's message whose text after the condition is empty is passed whole.
TEST(SentencePieceTrainTest, ATrainerRefusalSaysWhy) {
  TestDir dir;
  WriteAll(dir / "blank.txt", "\n\n\n");
  auto trained =
      TrainSentencePiece({.inputs = {dir / "blank.txt"}, .vocab = 300, .output = dir / "t.model"});
  ASSERT_FALSE(trained.ok());
  const std::string message(trained.status().message());
  const std::string refused = "SentencePiece refused: ";
  ASSERT_THAT(message, HasSubstr(refused));
  EXPECT_GT(message.size(), message.find(refused) + refused.size() + 5) << message;
  EXPECT_THAT(message, HasSubstr("sentences_.empty()"));
}

// Pieces of at most the limit that together are the line: cut before a space, else between two
// UTF-8 characters, else (no character boundary: not UTF-8) at the limit.
TEST(TrainingSentencesTest, CutsALongLineUnderTheLimit) {
  EXPECT_EQ(CutLongLine("abc def ghi", 20), (std::vector<absl::string_view>{"abc def ghi"}));
  EXPECT_EQ(CutLongLine("abc def ghi", 8), (std::vector<absl::string_view>{"abc def", " ghi"}));
  EXPECT_EQ(CutLongLine("abcdefghij", 4), (std::vector<absl::string_view>{"abcd", "efgh", "ij"}));
  // Three bytes a character: cut between characters.
  EXPECT_EQ(CutLongLine("日本語日本", 7), (std::vector<absl::string_view>{"日本", "語日", "本"}));
  EXPECT_EQ(CutLongLine("\x80\x80\x80\x80\x80", 2),
            (std::vector<absl::string_view>{"\x80\x80", "\x80\x80", "\x80"}));
  std::string text;
  for (int i = 0; i < 500; ++i) text += i % 3 == 0 ? "語 " : "wörd ";
  for (size_t limit : {5u, 7u, 16u, 100u}) {
    std::string joined;
    for (absl::string_view piece : CutLongLine(text, limit)) {
      EXPECT_LE(piece.size(), limit);
      EXPECT_FALSE(piece.empty());
      if (limit >= 7 && piece.data() != text.data()) {
        EXPECT_EQ(piece[0], ' ') << piece;
      }
      joined.append(piece.data(), piece.size());
    }
    EXPECT_EQ(joined, text);
  }
}

// Lines of the inputs in order, files' last lines without a newline too, empty lines skipped, long
// lines cut and counted; a file that cannot be read is an error naming it.
TEST(TrainingSentencesTest, ReadsTheInputsLineByLine) {
  TestDir dir;
  WriteAll(dir / "a.txt", "one\n\ntwo\nthree four five six");
  WriteAll(dir / "b.txt", "seven\r\n");
  TrainingSentences sentences({dir / "a.txt", dir / "b.txt"}, 10);
  std::vector<std::string> got;
  std::string sentence;
  while (sentences.Next(&sentence)) got.push_back(sentence);
  EXPECT_EQ(sentences.error(), "");
  EXPECT_EQ(got, (std::vector<std::string>{"one", "two", "three four", " five six", "seven\r"}));
  EXPECT_EQ(sentences.long_lines(), 1);
  EXPECT_EQ(sentences.long_line_pieces(), 2);

  TrainingSentences missing({dir / "a.txt", dir / "missing.txt"}, 10);
  while (missing.Next(&sentence)) {
  }
  EXPECT_THAT(missing.error(), HasSubstr(dir / "missing.txt"));
  EXPECT_FALSE(missing.invalid_input());
}

// Text that is not UTF-8 (a Latin-1 file) is refused, naming the file and the byte, as `furnace
// data prepare` refuses it: a model trained on it would not encode it the same way later.
TEST(TrainingSentencesTest, TextThatIsNotUtf8IsAnErrorNamingTheByte) {
  TestDir dir;
  WriteAll(dir / "a.txt", "fine\n");
  // Past a block boundary (64 KiB), so the offset counts what was read before.
  WriteAll(dir / "b.txt", std::string(70000, 'x') + "\n\ncaf\xe9 au lait\n");
  TrainingSentences sentences({dir / "a.txt", dir / "b.txt"}, 100000);
  std::string sentence;
  std::vector<std::string> got;
  while (sentences.Next(&sentence)) got.push_back(sentence);
  EXPECT_EQ(got.size(), 2u);
  EXPECT_TRUE(sentences.invalid_input());
  EXPECT_THAT(sentences.error(), HasSubstr(absl::StrCat("input ", dir / "b.txt",
                                                        ": not UTF-8 at byte ", 70000 + 2 + 3)));
  EXPECT_FALSE(sentences.Next(&sentence));  // and stays so

  auto trained = TrainSentencePiece({.inputs = {dir / "b.txt"},
                                     .vocab = 300,
                                     .model_type = "unigram",
                                     .output = dir / "t.model"});
  EXPECT_EQ(trained.status().code(), absl::StatusCode::kInvalidArgument) << trained.status();
  EXPECT_THAT(trained.status().message(), HasSubstr("not UTF-8 at byte 70005"));
}

TEST(SentencePieceTokenizerTest, RefusesWhatIsNotAModel) {
  TestDir dir;
  WriteAll(dir / "corpus.txt", "just text\n");
  auto tokenizer = OpenTokenizer(dir / "corpus.txt");
  ASSERT_FALSE(tokenizer.ok());
  EXPECT_EQ(tokenizer.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(tokenizer.status().message(), HasSubstr(dir / "corpus.txt"));
  EXPECT_THAT(tokenizer.status().message(), HasSubstr("not a SentencePiece model"));
  tokenizer = OpenTokenizer(dir / "missing.model");
  EXPECT_EQ(tokenizer.status().code(), absl::StatusCode::kNotFound);
  // A misspelt "byte" is a file that is not there: what is allowed is said.
  EXPECT_THAT(OpenTokenizer("bytes").status().message(),
              HasSubstr("(allowed: byte, or the path of a SentencePiece .model file)"));
  EXPECT_THAT(tokenizer.status().message(), HasSubstr(dir / "missing.model"));
}

}  // namespace
}  // namespace furnace::data
