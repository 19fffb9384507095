#include "runtime/data/sentencepiece_tokenizer.h"

#include <dlfcn.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "runtime/base/file_error.h"
#include "runtime/base/file_sync.h"
#include "runtime/base/status.h"
#include "runtime/data/byte_tokenizer.h"
#include "runtime/data/training_sentences.h"

namespace furnace::data {
namespace {

// Where the module may be: beside the executable, in its ../lib (an installed tree:
// /usr/local/bin and /usr/local/lib), and in the build's library directory.
std::vector<std::string> ModuleCandidates() {
  std::vector<std::string> candidates;
  std::error_code ec;
  const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    candidates.push_back((exe.parent_path() / kFurnaceSentencePieceModule).string());
    candidates.push_back((exe.parent_path() / ".." / "lib" / kFurnaceSentencePieceModule).string());
  }
#ifdef FURNACE_SENTENCEPIECE_MODULE_DIR
  candidates.push_back(
      (std::filesystem::path(FURNACE_SENTENCEPIECE_MODULE_DIR) / kFurnaceSentencePieceModule)
          .string());
#endif
  return candidates;
}

absl::StatusOr<const spm::Library*> LoadModule() {
  std::vector<std::string> tried;
  for (const std::string& path : ModuleCandidates()) {
    if (!std::filesystem::exists(path)) {
      tried.push_back(absl::StrCat(path, " (absent)"));
      continue;
    }
    // RTLD_DEEPBIND: SentencePiece's protobuf-lite binds to itself, not to the process's protobuf.
    void* handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
    if (handle == nullptr) {
      tried.push_back(absl::StrCat(path, " (", ::dlerror(), ")"));
      continue;
    }
    auto entry =
        reinterpret_cast<const spm::Library* (*)()>(::dlsym(handle, kFurnaceSentencePieceEntry));
    if (entry == nullptr) {
      tried.push_back(absl::StrCat(path, " (no ", kFurnaceSentencePieceEntry, ")"));
      ::dlclose(handle);
      continue;
    }
    const spm::Library* library = entry();  // the module stays loaded for the process's life
    // SentencePiece must never write its log: it writes to std::cerr, which under RTLD_DEEPBIND
    // binds to libstdc++'s own, never-constructed std::cerr (the executable's copy-relocated one
    // is the constructed one), and the process crashes. Its errors come back as statuses.
    library->SetLogLevel(spm::kLogNothing);
    return library;
  }
  return absl::FailedPreconditionError(
      absl::StrCat("cannot load the SentencePiece module ", kFurnaceSentencePieceModule,
                   " (install libsentencepiece0 and keep the module beside furnace or in its "
                   "../lib); tried: ",
                   absl::StrJoin(tried, "; ")));
}

absl::StatusOr<const spm::Library*> Module() {
  static const absl::StatusOr<const spm::Library*> module = LoadModule();
  return module;
}

absl::StatusOr<std::string> ReadWholeFile(const std::string& path, absl::string_view what) {
  ASSIGN_OR_RETURN(const int fd, OpenRegularFile(std::string(what), path));
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> f(::fdopen(fd, "rb"), &std::fclose);
  if (f == nullptr) {
    const int error = errno;
    ::close(fd);
    return CannotOpenError(std::string(what), path, error);
  }
  std::string bytes;
  char block[1 << 16];
  size_t got;
  while ((got = std::fread(block, 1, sizeof block, f.get())) > 0) bytes.append(block, got);
  if (std::ferror(f.get()) != 0) {
    return UnreadableFileError(
        absl::StrCat(what, " ", path, ": read error: ", std::strerror(errno)));
  }
  return bytes;
}

// SentencePiece's "Vocabulary size too high (N). Please set it to a value <= M." -> M, else -1.
int64_t LargestVocabFromError(const std::string& error) {
  const size_t at = error.find("value <= ");
  if (at == std::string::npos) return -1;
  return std::strtoll(error.c_str() + at + 9, nullptr, 10);
}

// SentencePiece's "Vocabulary size is smaller than required_chars. V vs N. ..." -> N (the pieces
// the characters that make up the coverage need, with the meta and byte pieces), else -1.
int64_t SmallestVocabFromError(const std::string& error) {
  const std::string marker = "required_chars. ";
  const size_t at = error.find(marker);
  if (at == std::string::npos) return -1;
  const size_t vs = error.find(" vs ", at);
  if (vs == std::string::npos) return -1;
  return std::strtoll(error.c_str() + vs + 4, nullptr, 10);
}

// SentencePiece errors start with the source line and the failed condition; keep the sentence,
// or the whole message where the condition is all it says.
std::string TrainerMessage(const std::string& error) {
  const size_t bracket = error.rfind("] ");
  if (bracket == std::string::npos) return error;
  const std::string sentence = error.substr(bracket + 2);
  return sentence.find_first_not_of(" \t\n") == std::string::npos ? error : sentence;
}

absl::Status WriteModelFile(const std::string& path, const std::string& bytes) {
  if (absl::Status written = WriteFileAtomically(path, bytes); !written.ok()) {
    return absl::Status(written.code(), absl::StrCat("tokenizer model ", written.message()));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<SentencePieceTokenizer>> SentencePieceTokenizer::Open(
    const std::string& path) {
  ASSIGN_OR_RETURN(std::string bytes, ReadWholeFile(path, "tokenizer"));
  ASSIGN_OR_RETURN(const spm::Library* library, Module());
  std::string error;
  std::unique_ptr<spm::Processor> processor = library->Load(bytes, &error);
  if (processor == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tokenizer ", path,
        ": not a SentencePiece model (make one with furnace data tokenizer train, or use the "
        "byte tokenizer, byte): ",
        error));
  }
  std::unique_ptr<SentencePieceTokenizer> tokenizer(new SentencePieceTokenizer());
  tokenizer->vocab_ = processor->piece_size();
  tokenizer->eod_id_ = processor->eos_id();
  tokenizer->identity_ = absl::StrCat("sentencepiece:", Sha256Hex(bytes));
  tokenizer->processor_ = std::move(processor);
  return tokenizer;
}

absl::StatusOr<std::vector<int32_t>> SentencePieceTokenizer::Encode(absl::string_view text,
                                                                    TextPart part) const {
  std::vector<int> ids;
  std::string error;
  const bool start = part == TextPart::kWhole || part == TextPart::kFirst;
  const bool end = part == TextPart::kWhole || part == TextPart::kLast;
  if (!processor_->Encode(std::string_view(text.data(), text.size()), start, end, &ids, &error)) {
    return absl::InvalidArgumentError(absl::StrCat("SentencePiece: ", error));
  }
  return std::vector<int32_t>(ids.begin(), ids.end());
}

std::string SentencePieceTokenizer::Decode(absl::Span<const int32_t> ids) const {
  std::vector<int> kept;
  kept.reserve(ids.size());
  for (int32_t id : ids) {
    if (id >= 0 && id < vocab_ && id != eod_id_) kept.push_back(id);
  }
  std::string text, error;
  processor_->Decode(kept, &text, &error);
  return text;
}

absl::Status CheckSentencePieceTrainOptions(const SentencePieceTrainOptions& options) {
  if (options.inputs.empty()) {
    return absl::InvalidArgumentError("tokenizer train: at least one --input FILE is required");
  }
  if (options.output.empty()) {
    return absl::InvalidArgumentError("tokenizer train: -o FILE is required");
  }
  if (options.model_type != "unigram" && options.model_type != "bpe") {
    return absl::InvalidArgumentError(absl::StrCat(
        "tokenizer train: --model-type '", options.model_type, "' (allowed: unigram, bpe)"));
  }
  if (options.vocab < kMinSentencePieceVocab) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tokenizer train: --vocab ", options.vocab,
        " is too small (allowed: ", kMinSentencePieceVocab,
        " or more; 256 byte pieces, <unk>, the end-of-document id and the newline come first, "
        "then the text's characters)"));
  }
  if (!(options.character_coverage >= kMinCharacterCoverage && options.character_coverage <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("tokenizer train: --character-coverage ", options.character_coverage,
                     " (allowed: ", kMinCharacterCoverage,
                     " to 1, the share of the text's characters that get a piece of "
                     "their own; ",
                     kDefaultCharacterCoverage, " unless given)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<SentencePieceTrainResult> TrainSentencePiece(
    const SentencePieceTrainOptions& options) {
  RETURN_IF_ERROR(CheckSentencePieceTrainOptions(options));
  SentencePieceTrainResult result;
  for (const std::string& input : options.inputs) {
    std::error_code ec;
    const uintmax_t bytes = std::filesystem::file_size(input, ec);
    if (ec || std::ifstream(input).fail()) {
      return absl::NotFoundError(absl::StrCat("tokenizer train: input ", input, ": cannot read: ",
                                              ec ? ec.message() : std::strerror(errno)));
    }
    if (bytes == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("tokenizer train: input ", input, " is empty: nothing to learn from"));
    }
    result.input_bytes += static_cast<int64_t>(bytes);
  }
  ASSIGN_OR_RETURN(const spm::Library* library, Module());
  const std::map<std::string, std::string> flags = {
      {"model_type", options.model_type},
      {"vocab_size", absl::StrCat(options.vocab)},
      // Lossless: no normalization, whitespace as it is, bytes for what the vocabulary lacks.
      {"normalization_rule_name", "identity"},
      {"add_dummy_prefix", "false"},
      {"remove_extra_whitespaces", "false"},
      {"byte_fallback", "true"},
      {"character_coverage", absl::StrFormat("%.17g", options.character_coverage)},
      {"user_defined_symbols", "\n"},
      {"unk_id", "0"},
      {"eos_id", absl::StrCat(kSentencePieceEodId)},
      {"bos_id", "-1"},
      {"pad_id", "-1"},
      // Bounded memory: at most a million lines, sampled uniformly from larger inputs.
      {"input_sentence_size", "1000000"},
      {"shuffle_input_sentence", "true"},
      // Longer lines come cut into pieces of at most this (training_sentences.h).
      {"max_sentence_length", absl::StrCat(kMaxTrainingSentenceBytes)},
      {"num_threads", "2"},
  };
  TrainingSentences sentences(options.inputs);
  std::string model, error;
  const bool trained = library->Train(flags, &sentences, &model, &error);
  result.long_lines = sentences.long_lines();
  result.long_line_pieces = sentences.long_line_pieces();
  if (!sentences.error().empty()) {
    const std::string message = absl::StrCat("tokenizer train: ", sentences.error());
    return sentences.invalid_input() ? absl::InvalidArgumentError(message)
                                     : absl::NotFoundError(message);
  }
  if (!trained) {
    const int64_t largest = LargestVocabFromError(error);
    if (largest > 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("tokenizer train: --vocab ", options.vocab, " is too large for this text (",
                       result.input_bytes, " bytes in ", options.inputs.size(),
                       options.inputs.size() == 1 ? " file" : " files", "): it gives at most ",
                       largest, " pieces; use --vocab ", largest, " or less, or more text"));
    }
    const int64_t smallest = SmallestVocabFromError(error);
    if (smallest > 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("tokenizer train: --vocab ", options.vocab,
                       " is too small for the characters that make up --character-coverage ",
                       options.character_coverage, " of this text: with the ",
                       smallest - options.vocab, " more pieces they need, use --vocab ", smallest,
                       " or more (subwords take more still), or a lower --character-coverage (the "
                       "characters left out are spelled as their UTF-8 bytes)"));
    }
    return absl::InvalidArgumentError(
        absl::StrCat("tokenizer train: SentencePiece refused: ", TrainerMessage(error)));
  }
  std::unique_ptr<spm::Processor> processor = library->Load(model, &error);
  if (processor == nullptr) {
    return absl::InternalError(
        absl::StrCat("tokenizer train: the trained model does not load: ", error));
  }
  RETURN_IF_ERROR(WriteModelFile(options.output, model));
  result.vocab = processor->piece_size();
  result.identity = absl::StrCat("sentencepiece:", Sha256Hex(model));
  return result;
}

absl::StatusOr<std::unique_ptr<Tokenizer>> OpenTokenizer(const std::string& path_or_byte) {
  if (path_or_byte == kByteTokenizerName) return std::make_unique<ByteTokenizer>(true);
  absl::StatusOr<std::unique_ptr<SentencePieceTokenizer>> tokenizer =
      SentencePieceTokenizer::Open(path_or_byte);
  if (absl::IsNotFound(tokenizer.status())) {
    // A misspelt "byte" reads as a file that is not there: say what is allowed.
    return absl::NotFoundError(absl::StrCat(tokenizer.status().message(),
                                            " (allowed: ", kByteTokenizerName,
                                            ", or the path of a SentencePiece .model file)"));
  }
  if (!tokenizer.ok()) return tokenizer.status();
  return std::unique_ptr<Tokenizer>(*std::move(tokenizer));
}

}  // namespace furnace::data
