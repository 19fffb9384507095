#include "runtime/data/byte_tokenizer.h"

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "runtime/base/status.h"
#include "runtime/data/token_file.h"

namespace furnace::data {

std::vector<int32_t> ByteTokenize(absl::string_view text, bool eod) {
  std::vector<int32_t> tokens;
  tokens.reserve(text.size() + (eod ? 1 : 0));
  for (char c : text) tokens.push_back(static_cast<unsigned char>(c));
  if (eod) tokens.push_back(kEndOfDocument);
  return tokens;
}

absl::StatusOr<PrepareStats> PrepareTokenFile(const std::vector<std::string>& inputs,
                                              const std::string& output, bool eod) {
  if (inputs.empty()) return absl::InvalidArgumentError("data prepare: no input files");
  PrepareStats stats;
  stats.vocab = ByteTokenizerVocab(eod);
  ASSIGN_OR_RETURN(auto writer, TokenFileWriter::Create(output, stats.vocab, 2));
  std::vector<char> chunk(1 << 20);
  std::vector<int32_t> tokens;
  for (const std::string& input : inputs) {
    std::FILE* f = std::fopen(input.c_str(), "rb");
    if (f == nullptr) {
      return absl::NotFoundError(
          absl::StrCat("data prepare: cannot open ", input, ": ", std::strerror(errno)));
    }
    size_t got;
    while ((got = std::fread(chunk.data(), 1, chunk.size(), f)) > 0) {
      tokens.assign(chunk.begin(), chunk.begin() + static_cast<std::ptrdiff_t>(got));
      for (size_t i = 0; i < got; ++i) tokens[i] = static_cast<unsigned char>(chunk[i]);
      absl::Status s = writer->Append(tokens.data(), static_cast<int64_t>(got));
      if (!s.ok()) {
        std::fclose(f);
        return s;
      }
    }
    const bool failed = std::ferror(f) != 0;
    std::fclose(f);
    if (failed) return absl::DataLossError(absl::StrCat("data prepare: error reading ", input));
    if (eod) RETURN_IF_ERROR(writer->Append(&kEndOfDocument, 1));
    ++stats.documents;
  }
  stats.tokens = writer->count();
  RETURN_IF_ERROR(writer->Finish());
  return stats;
}

}  // namespace furnace::data
