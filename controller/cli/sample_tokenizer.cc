#include "controller/cli/sample_tokenizer.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "runtime/data/byte_tokenizer.h"

namespace furnace::cli {
namespace {

class ByteTokenizer final : public Tokenizer {
 public:
  std::vector<int32_t> Encode(absl::string_view text) const override {
    return data::ByteTokenize(text, /*eod=*/false);
  }
  std::string Decode(absl::Span<const int32_t> ids) const override {
    std::string out;
    for (int32_t id : ids) {
      if (id >= 0 && id < data::kByteVocab) out.push_back(static_cast<char>(id));
    }
    return out;
  }
  int64_t vocab() const override { return data::ByteTokenizerVocab(true); }
  int32_t eod_id() const override { return data::kEndOfDocument; }
  std::string identity() const override { return "byte"; }
};

class DecimalIds final : public Tokenizer {
 public:
  explicit DecimalIds(int64_t vocab) : vocab_(vocab) {}
  std::vector<int32_t> Encode(absl::string_view text) const override {
    std::vector<int32_t> ids;
    for (absl::string_view word :
         absl::StrSplit(text, absl::ByAnyChar(" ,\t\n"), absl::SkipEmpty())) {
      int32_t id = 0;
      if (absl::SimpleAtoi(word, &id)) ids.push_back(id);
    }
    return ids;
  }
  std::string Decode(absl::Span<const int32_t> ids) const override {
    std::string out;
    for (int32_t id : ids) absl::StrAppend(&out, id, " ");
    return out;
  }
  int64_t vocab() const override { return vocab_; }
  int32_t eod_id() const override { return -1; }
  std::string identity() const override { return "ids"; }

 private:
  int64_t vocab_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Tokenizer>> OpenTokenizer(const std::string& path_or_byte) {
  if (path_or_byte == "byte") return std::make_unique<ByteTokenizer>();
  return absl::InvalidArgumentError(absl::StrCat(
      "tokenizer \"", path_or_byte,
      "\": this build reads only \"byte\" (SentencePiece models come with the tokenizer of "
      "runtime/data/tokenizer.h)"));
}

std::unique_ptr<Tokenizer> IdTokenizer(int64_t vocab) {
  return std::make_unique<DecimalIds>(vocab);
}

}  // namespace furnace::cli
