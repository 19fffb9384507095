// furnace data prepare --input TEXT... -o FILE [--eod]: text files into a token file with the
// byte-level tokenizer, on this machine; the controller is not involved.
#include "absl/strings/str_cat.h"
#include "controller/cli/commands.h"
#include "controller/cli/exit_codes.h"
#include "controller/cli/format.h"
#include "google/protobuf/struct.pb.h"
#include "runtime/base/status.h"
#include "runtime/data/byte_tokenizer.h"

namespace furnace::cli {

absl::StatusOr<int> RunDataPrepare(const CommandContext& ctx, const DataPrepareOptions& options) {
  if (options.inputs.empty()) {
    return absl::InvalidArgumentError("data prepare: at least one --input TEXT is required");
  }
  if (options.output.empty()) {
    return absl::InvalidArgumentError("data prepare: -o FILE is required");
  }
  absl::StatusOr<data::PrepareStats> stats =
      data::PrepareTokenFile(options.inputs, options.output, options.eod);
  if (!stats.ok()) return LocalError(stats.status());

  if (ctx.json) {
    google::protobuf::Struct result;
    auto& f = *result.mutable_fields();
    f["output"].set_string_value(options.output);
    f["tokenizer"].set_string_value("byte");
    f["documents"].set_number_value(static_cast<double>(stats->documents));
    f["tokens"].set_number_value(static_cast<double>(stats->tokens));
    f["vocab"].set_number_value(static_cast<double>(stats->vocab));
    RETURN_IF_ERROR(PrintJson(result, *ctx.out));
  } else {
    *ctx.out << "wrote " << options.output << ": " << FormatCount(stats->documents)
             << (stats->documents == 1 ? " document, " : " documents, ")
             << FormatCount(stats->tokens) << " tokens, vocab " << stats->vocab
             << " (byte tokenizer"
             << (options.eod ? absl::StrCat(", end-of-document id ", data::kEndOfDocument) : "")
             << ")\n";
  }
  return kExitOk;
}

}  // namespace furnace::cli
