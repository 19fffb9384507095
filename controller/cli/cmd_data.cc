// furnace data tokenizer train / data prepare: text into a SentencePiece model and token files, on
// this machine; the controller is not involved.
#include <cmath>
#include <filesystem>
#include <system_error>
#include <vector>

#include "absl/strings/str_cat.h"
#include "controller/cli/commands.h"
#include "controller/cli/exit_codes.h"
#include "controller/cli/format.h"
#include "google/protobuf/struct.pb.h"
#include "runtime/base/status.h"
#include "runtime/data/byte_tokenizer.h"
#include "runtime/data/prepare.h"
#include "runtime/data/sentencepiece_tokenizer.h"
#include "runtime/data/training_sentences.h"

namespace furnace::cli {
namespace {

constexpr int kBarWidth = 30;

// "[#####-----]  45%  12.0 MiB / 27.0 MiB"
std::string BytesProgress(int64_t done, int64_t total) {
  return absl::StrCat(
      ProgressBar(static_cast<uint64_t>(done), static_cast<uint64_t>(total), kBarWidth), "  ",
      FormatBytes(static_cast<uint64_t>(done)), " / ", FormatBytes(static_cast<uint64_t>(total)));
}

// Draws the progress bar on ctx.err: redrawn in place on a terminal at each percent, else a line
// at each tenth (a log stays short). Nothing with --json.
class ProgressPrinter {
 public:
  explicit ProgressPrinter(const CommandContext& ctx) : ctx_(ctx) {}
  void Update(int64_t done, int64_t total) {
    if (ctx_.json || ctx_.err == nullptr || total <= 0) return;
    const int step = ctx_.err_tty ? 100 : 10;
    const int64_t at = done * step / total;
    if (at == last_) return;
    last_ = at;
    *ctx_.err << (ctx_.err_tty ? "\r" : "") << BytesProgress(done, total)
              << (ctx_.err_tty ? "" : "\n");
    ctx_.err->flush();
    drawn_ = true;
  }
  ~ProgressPrinter() {
    if (drawn_ && ctx_.err_tty) *ctx_.err << "\n";
  }

 private:
  const CommandContext& ctx_;
  int64_t last_ = -1;
  bool drawn_ = false;
};

// Refuses an output that is one of the command's inputs (the same file by any path or link):
// the output is written beside it and renamed over it, so the text would be gone.
absl::Status OutputIsNoInput(const std::string& command, const std::string& output,
                             const std::vector<std::pair<std::string, std::string>>& inputs) {
  for (const auto& [flag, path] : inputs) {
    std::error_code ec;
    if (std::filesystem::equivalent(output, path, ec)) {
      return absl::InvalidArgumentError(
          absl::StrCat(command, ": -o ", output, " is the same file as ", flag, " ", path,
                       " (writing it would replace that input; choose another output path)"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<int> RunDataPrepare(const CommandContext& ctx, const DataPrepareOptions& options) {
  if (options.inputs.empty()) {
    return absl::InvalidArgumentError("data prepare: at least one --input FILE is required");
  }
  if (options.output.empty()) {
    return absl::InvalidArgumentError("data prepare: -o FILE is required");
  }
  const bool byte = options.tokenizer == data::kByteTokenizerName;
  std::vector<std::pair<std::string, std::string>> inputs;
  for (const std::string& input : options.inputs) inputs.emplace_back("--input", input);
  if (!byte) inputs.emplace_back("--tokenizer", options.tokenizer);
  RETURN_IF_ERROR(OutputIsNoInput("data prepare", options.output, inputs));
  if (options.eod && !byte) {
    return absl::InvalidArgumentError(
        "data prepare: --eod is for --tokenizer byte (a SentencePiece model appends its own "
        "end-of-document id; one without it is refused)");
  }
  std::unique_ptr<data::Tokenizer> tokenizer;
  if (byte) {
    tokenizer = std::make_unique<data::ByteTokenizer>(options.eod);
  } else {
    absl::StatusOr<std::unique_ptr<data::Tokenizer>> opened =
        data::OpenTokenizer(options.tokenizer);
    if (!opened.ok()) return LocalError(opened.status());
    tokenizer = std::move(*opened);
    // Documents are separated by the model's end-of-document piece; one trained without it
    // (eos_id=-1) would run them together with nothing to say where one ends.
    if (tokenizer->eod_id() < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "data prepare: --tokenizer ", options.tokenizer,
          " has no end-of-document piece (trained with eos_id=-1), so documents would run "
          "together; allowed: a model with one (furnace data tokenizer train makes </s> id ",
          data::kSentencePieceEodId, "), or --tokenizer byte --eod"));
    }
  }
  absl::StatusOr<data::PrepareStats> stats;
  {
    ProgressPrinter progress(ctx);
    stats = data::PrepareTokenFile(
        *tokenizer,
        {.inputs = options.inputs, .jsonl_field = options.jsonl_field, .output = options.output},
        [&progress](int64_t done, int64_t total) { progress.Update(done, total); });
  }
  if (!stats.ok()) return LocalError(stats.status());

  if (ctx.json) {
    google::protobuf::Struct result;
    auto& f = *result.mutable_fields();
    f["output"].set_string_value(options.output);
    f["tokenizer"].set_string_value(stats->identity);
    f["documents"].set_number_value(static_cast<double>(stats->documents));
    f["tokens"].set_number_value(static_cast<double>(stats->tokens));
    f["vocab"].set_number_value(static_cast<double>(stats->vocab));
    f["input_bytes"].set_number_value(static_cast<double>(stats->input_bytes));
    RETURN_IF_ERROR(PrintJson(result, *ctx.out));
  } else {
    const int32_t eod = tokenizer->eod_id();
    *ctx.out << "wrote " << options.output << ": " << FormatCount(stats->documents)
             << (stats->documents == 1 ? " document, " : " documents, ")
             << FormatCount(stats->tokens) << " tokens, vocab " << stats->vocab << " ("
             << (byte ? "byte tokenizer" : stats->identity)
             << (eod >= 0 ? absl::StrCat(", end-of-document id ", eod) : "") << ")\n";
    if (eod < 0 && stats->documents > 1 && ctx.err != nullptr) {
      *ctx.err << "note: no end-of-document id between the " << FormatCount(stats->documents)
               << " documents (they run together in training); --eod separates them\n";
    }
  }
  return kExitOk;
}

absl::StatusOr<int> RunTokenizerTrain(const CommandContext& ctx,
                                      const TokenizerTrainOptions& options) {
  const data::SentencePieceTrainOptions train{.inputs = options.inputs,
                                              .vocab = options.vocab,
                                              .model_type = options.model_type,
                                              .output = options.output,
                                              .character_coverage = options.character_coverage};
  RETURN_IF_ERROR(data::CheckSentencePieceTrainOptions(train));
  std::vector<std::pair<std::string, std::string>> inputs;
  for (const std::string& input : options.inputs) inputs.emplace_back("--input", input);
  RETURN_IF_ERROR(OutputIsNoInput("data tokenizer train", options.output, inputs));
  // SentencePiece's trainer reports no progress of its own: say what runs (it takes seconds for
  // megabytes of text, minutes for a million long lines).
  if (!ctx.json && ctx.err != nullptr) {
    *ctx.err << "training a SentencePiece " << options.model_type << " vocabulary of "
             << options.vocab << " pieces on " << options.inputs.size()
             << (options.inputs.size() == 1 ? " file" : " files") << " ...\n";
  }
  absl::StatusOr<data::SentencePieceTrainResult> trained = data::TrainSentencePiece(train);
  if (!trained.ok()) return LocalError(trained.status());

  if (ctx.json) {
    google::protobuf::Struct result;
    auto& f = *result.mutable_fields();
    f["output"].set_string_value(options.output);
    f["identity"].set_string_value(trained->identity);
    f["model_type"].set_string_value(options.model_type);
    f["character_coverage"].set_number_value(options.character_coverage);
    f["vocab"].set_number_value(static_cast<double>(trained->vocab));
    f["input_bytes"].set_number_value(static_cast<double>(trained->input_bytes));
    f["long_lines"].set_number_value(static_cast<double>(trained->long_lines));
    f["long_line_pieces"].set_number_value(static_cast<double>(trained->long_line_pieces));
    RETURN_IF_ERROR(PrintJson(result, *ctx.out));
  } else {
    *ctx.out << "wrote " << options.output << ": SentencePiece " << options.model_type
             << " model, vocab " << trained->vocab << " (end-of-document id "
             << data::kSentencePieceEodId << "), trained on "
             << FormatBytes(static_cast<uint64_t>(trained->input_bytes)) << " in "
             << options.inputs.size() << (options.inputs.size() == 1 ? " file" : " files")
             << "\nidentity " << trained->identity << "\n";
    if (trained->long_lines > 0) {
      *ctx.out << trained->long_lines << (trained->long_lines == 1 ? " line" : " lines")
               << " longer than " << data::kMaxTrainingSentenceBytes
               << " bytes (SentencePiece's longest sentence) trained on as "
               << trained->long_line_pieces << " pieces, cut before a space (or between two "
               << "characters where there was none)\n";
    }
  }
  return kExitOk;
}

}  // namespace furnace::cli
