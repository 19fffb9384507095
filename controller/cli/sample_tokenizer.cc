#include "controller/cli/sample_tokenizer.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"

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

std::string StreamedText(const Tokenizer& tok, const std::vector<int32_t>& ids, bool last,
                         std::string* shown) {
  const std::string text = tok.Decode(ids);
  if (text.compare(0, shown->size(), *shown) != 0) {
    if (!last) return "";
    size_t common = 0;
    while (common < shown->size() && common < text.size() && text[common] == (*shown)[common]) {
      ++common;
    }
    // Back to a character's start: what follows is printed whole, never from its middle.
    while (common > 0 && common < text.size() &&
           (static_cast<unsigned char>(text[common]) & 0xC0) == 0x80) {
      --common;
    }
    std::string out = text.substr(common);
    *shown = text;
    return out;
  }
  size_t end = text.size();
  if (!last) {
    size_t lead = end;  // the start of the last character
    while (lead > shown->size() && (static_cast<unsigned char>(text[lead - 1]) & 0xC0) == 0x80) {
      --lead;
    }
    if (lead > shown->size()) {
      const unsigned char c = static_cast<unsigned char>(text[lead - 1]);
      const size_t need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
      if (end - (lead - 1) < need) end = lead - 1;
    }
    constexpr absl::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD
    while (end >= shown->size() + kReplacement.size() &&
           absl::string_view(text).substr(end - kReplacement.size(), kReplacement.size()) ==
               kReplacement) {
      end -= kReplacement.size();
    }
  }
  std::string out = text.substr(shown->size(), end - shown->size());
  *shown += out;
  return out;
}

}  // namespace furnace::cli
