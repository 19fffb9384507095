#include "controller/cli/sample_tokenizer.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace furnace::cli {
namespace {

using data::TextPart;

class DecimalIds final : public Tokenizer {
 public:
  explicit DecimalIds(int64_t vocab) : vocab_(vocab) {}
  absl::StatusOr<std::vector<int32_t>> Encode(absl::string_view text,
                                              TextPart /*part*/) const override {
    std::vector<int32_t> ids;
    for (absl::string_view word :
         absl::StrSplit(text, absl::ByAnyChar(" ,\t\n"), absl::SkipEmpty())) {
      int32_t id = 0;
      if (!absl::SimpleAtoi(word, &id)) {
        return absl::InvalidArgumentError(
            absl::StrCat("\"", word,
                         "\" is not a token id (this model was trained on token ids, not text: "
                         "give ids in decimal, separated by spaces)"));
      }
      ids.push_back(id);
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

std::unique_ptr<Tokenizer> IdTokenizer(int64_t vocab) {
  return std::make_unique<DecimalIds>(vocab);
}

}  // namespace furnace::cli
