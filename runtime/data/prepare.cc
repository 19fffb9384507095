#include "runtime/data/prepare.h"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "runtime/base/status.h"
#include "runtime/base/utf8.h"
#include "runtime/data/byte_tokenizer.h"
#include "runtime/data/token_file.h"

namespace furnace::data {
namespace {

constexpr size_t kBlockBytes = 1 << 20;

// Encodes documents and appends them, each followed by the end-of-document id, to the writer. A
// document may come in parts (AppendText more than once): each part is held until the next one
// or the document's end says whether it is the first, a middle or the last part (tokenizer.h:
// TextPart), so the ids are those of the whole. Holds at most one part.
class DocumentSink {
 public:
  DocumentSink(const Tokenizer& tokenizer, TokenFileWriter* writer, PrepareStats* stats)
      : tokenizer_(tokenizer), writer_(writer), stats_(stats) {}

  // `where` names the text in an error ("input F", "input F line N").
  absl::Status AppendText(absl::string_view text, const std::string& where) {
    if (text.empty()) return absl::OkStatus();
    if (held_) RETURN_IF_ERROR(EncodeHeld(/*last=*/false));
    held_text_.assign(text.data(), text.size());
    held_where_ = where;
    held_ = true;
    return absl::OkStatus();
  }
  absl::Status EndDocument() {
    if (held_) RETURN_IF_ERROR(EncodeHeld(/*last=*/true));
    ++stats_->documents;
    parts_ = 0;
    const int32_t eod = tokenizer_.eod_id();
    return eod >= 0 ? writer_->Append(&eod, 1) : absl::OkStatus();
  }

 private:
  absl::Status EncodeHeld(bool last) {
    const TextPart part = parts_ == 0 ? (last ? TextPart::kWhole : TextPart::kFirst)
                                      : (last ? TextPart::kLast : TextPart::kMiddle);
    absl::StatusOr<std::vector<int32_t>> ids = tokenizer_.Encode(held_text_, part);
    if (!ids.ok()) {
      return absl::Status(ids.status().code(), absl::StrCat("data prepare: ", held_where_,
                                                            ": the tokenizer refused the text: ",
                                                            ids.status().message()));
    }
    held_ = false;
    ++parts_;
    return writer_->Append(ids->data(), static_cast<int64_t>(ids->size()));
  }

  const Tokenizer& tokenizer_;
  TokenFileWriter* writer_;
  PrepareStats* stats_;
  bool held_ = false;  // a part of the current document waits in held_text_
  std::string held_text_, held_where_;
  int64_t parts_ = 0;  // parts of the current document encoded
};

// Where to cut `text` so the head can be encoded alone: after its last newline; in a line longer
// than a block, before its last space, where a subword model's pieces end too (they never span a
// whitespace), so the parts' ids are the whole line's; in a block without either, before the last
// UTF-8 lead byte (never inside a character). A run of more continuation bytes than a character
// has is not UTF-8 (a Latin-1 file, binary): cut at the end, so what waits stays bounded. 0 when
// nothing can be cut yet.
size_t CutPoint(absl::string_view text) {
  const size_t newline = text.rfind('\n');
  if (newline != absl::string_view::npos) return newline + 1;
  const size_t space = text.rfind(' ');
  if (space != absl::string_view::npos && space > 0) return space;
  size_t cut = text.size();
  int continuation = 0;
  while (cut > 0 && (static_cast<unsigned char>(text[cut - 1]) & 0xC0) == 0x80) {
    --cut;
    if (++continuation > 3) return text.size();
  }
  return cut > 0 ? cut - 1 : 0;
}

// `text`, which starts `offset` bytes into `input`, when it is UTF-8.
absl::Status CheckUtf8(absl::string_view text, const std::string& input, int64_t offset) {
  const std::optional<size_t> bad = FirstInvalidUtf8(std::string_view(text.data(), text.size()));
  if (!bad.has_value()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "data prepare: input ", input, ": not UTF-8 at byte ", offset + static_cast<int64_t>(*bad),
      " (a SentencePiece model reads UTF-8 text; --tokenizer byte takes any bytes)"));
}

// Each part handed to the sink ends at a cut (CutPoint): in UTF-8 text, between two characters,
// so each part is checked alone; the last character of a block waits in `pending` for the rest.
absl::Status PrepareText(const std::string& input, bool utf8, DocumentSink& sink,
                         const std::function<void(int64_t)>& advance) {
  std::ifstream in(input, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(
        absl::StrCat("data prepare: input ", input, ": cannot open: ", std::strerror(errno)));
  }
  const std::string where = absl::StrCat("input ", input);
  std::string pending;  // read, not cut yet: at most a block plus an unfinished character
  int64_t offset = 0;   // pending's first byte in the file
  std::vector<char> block(kBlockBytes);
  while (in) {
    in.read(block.data(), static_cast<std::streamsize>(block.size()));
    const size_t got = static_cast<size_t>(in.gcount());
    if (got == 0) break;
    pending.append(block.data(), got);
    const size_t cut = CutPoint(pending);
    const absl::string_view head = absl::string_view(pending).substr(0, cut);
    if (utf8) RETURN_IF_ERROR(CheckUtf8(head, input, offset));
    RETURN_IF_ERROR(sink.AppendText(head, where));
    pending.erase(0, cut);
    offset += static_cast<int64_t>(cut);
    advance(static_cast<int64_t>(got));
  }
  if (in.bad())
    return absl::DataLossError(absl::StrCat("data prepare: input ", input, ": read error"));
  if (utf8) RETURN_IF_ERROR(CheckUtf8(pending, input, offset));
  RETURN_IF_ERROR(sink.AppendText(pending, where));
  return sink.EndDocument();
}

absl::Status PrepareJsonLines(const std::string& input, const std::string& field,
                              DocumentSink& sink, const std::function<void(int64_t)>& advance) {
  std::ifstream in(input, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(
        absl::StrCat("data prepare: input ", input, ": cannot open: ", std::strerror(errno)));
  }
  std::string line;
  int64_t line_number = 0, documents = 0;
  while (std::getline(in, line)) {
    ++line_number;
    advance(static_cast<int64_t>(line.size()) + 1);
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    nlohmann::json record;
    try {
      record = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {  // its reason: a syntax error, invalid UTF-8
      return absl::InvalidArgumentError(absl::StrCat("data prepare: input ", input, " line ",
                                                     line_number, ": not JSON: ", e.what()));
    }
    if (!record.is_object()) {
      return absl::InvalidArgumentError(absl::StrCat("data prepare: input ", input, " line ",
                                                     line_number, ": not a JSON object"));
    }
    const auto text = record.find(field);
    if (text == record.end() || !text->is_string()) {
      return absl::InvalidArgumentError(absl::StrCat("data prepare: input ", input, " line ",
                                                     line_number, ": no string field \"", field,
                                                     "\" (--jsonl-field)"));
    }
    RETURN_IF_ERROR(sink.AppendText(text->get_ref<const std::string&>(),
                                    absl::StrCat("input ", input, " line ", line_number)));
    RETURN_IF_ERROR(sink.EndDocument());
    ++documents;
  }
  if (in.bad())
    return absl::DataLossError(absl::StrCat("data prepare: input ", input, ": read error"));
  if (documents == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("data prepare: input ", input, " has no JSON Lines document"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<PrepareStats> PrepareTokenFile(const Tokenizer& tokenizer,
                                              const PrepareOptions& options,
                                              const PrepareProgress& progress) {
  if (options.inputs.empty()) {
    return absl::InvalidArgumentError("data prepare: at least one --input is required");
  }
  if (options.output.empty())
    return absl::InvalidArgumentError("data prepare: -o FILE is required");
  PrepareStats stats;
  for (const std::string& input : options.inputs) {
    std::error_code ec;
    const uintmax_t bytes = std::filesystem::file_size(input, ec);
    if (ec) {
      return absl::NotFoundError(
          absl::StrCat("data prepare: input ", input, ": cannot read: ", ec.message()));
    }
    if (bytes == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("data prepare: input ", input, " is empty: no document in it"));
    }
    stats.input_bytes += static_cast<int64_t>(bytes);
  }
  stats.vocab = tokenizer.vocab();
  stats.identity = tokenizer.identity();
  ASSIGN_OR_RETURN(auto writer,
                   TokenFileWriter::Create(options.output, stats.vocab,
                                           stats.vocab <= 65536 ? 2 : 4, stats.identity));
  DocumentSink sink(tokenizer, writer.get(), &stats);
  int64_t done = 0;
  const auto advance = [&](int64_t bytes) {
    done += bytes;
    if (progress) progress(std::min(done, stats.input_bytes), stats.input_bytes);
  };
  // A subword model reads UTF-8 (SentencePiece would make U+FFFD of other bytes); the byte
  // tokenizer reads bytes. JSON Lines are UTF-8 by definition (the parser refuses other bytes).
  const bool utf8 = tokenizer.identity() != kByteTokenizerName;
  for (const std::string& input : options.inputs) {
    RETURN_IF_ERROR(options.jsonl_field.empty()
                        ? PrepareText(input, utf8, sink, advance)
                        : PrepareJsonLines(input, options.jsonl_field, sink, advance));
  }
  stats.tokens = writer->count();
  RETURN_IF_ERROR(writer->Finish());
  return stats;
}

}  // namespace furnace::data
