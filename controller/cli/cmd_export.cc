// furnace export JOB [--step S] [--format safetensors] -o FILE: the controller only says where the
// job's checkpoints are (spec.checkpoint.dir); the CLI reads them itself with the runtime's
// checkpoint reader, which verifies sizes and checksums before a byte is trusted, and writes the
// parameters with the runtime's safetensors writer. So an export needs the directory visible from
// this machine (the same host or a shared filesystem), and never loads the controller. A parallel
// job's checkpoint has one shard per rank, each with its part of the model; export reassembles
// whole tensors from all of them (whole_checkpoint.h), so the file is the same whatever the layout.
#include <algorithm>
#include <filesystem>
#include <map>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "controller/cli/commands.h"
#include "controller/cli/exit_codes.h"
#include "controller/cli/format.h"
#include "controller/cli/whole_checkpoint.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "runtime/base/status.h"
#include "runtime/checkpoint/checkpoint.h"
#include "runtime/checkpoint/safetensors.h"

namespace furnace::cli {
namespace {

namespace fs = std::filesystem;

constexpr char kAllowedFormats[] = "safetensors";

std::string CompactJson(const google::protobuf::Message& message) {
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  std::string json;
  if (!google::protobuf::util::MessageToJsonString(message, &json, options).ok()) return "";
  return json;
}

// What the file records about where it came from; safetensors metadata values are strings.
std::map<std::string, std::string> Metadata(const v1::JobDetail& job, const WholeCheckpoint& ckpt) {
  std::map<std::string, std::string> m = {
      {"format", "pt"},  // what transformers' loaders expect of a torch-layout file
      {"furnace.job_id", job.summary().job_id()},
      {"furnace.step", absl::StrCat(ckpt.step)},
      {"furnace.seed", absl::StrCat(ckpt.seed)},
  };
  if (!job.summary().name().empty()) m["furnace.job_name"] = job.summary().name();
  if (job.spec().has_model()) m["furnace.model"] = CompactJson(job.spec().model());
  if (job.spec().has_moe()) m["furnace.moe"] = CompactJson(job.spec().moe());
  return m;
}

}  // namespace

absl::StatusOr<int> RunExport(const CommandContext& ctx, const std::string& job_id,
                              const ExportOptions& options) {
  if (options.format != "safetensors") {
    return absl::InvalidArgumentError(absl::StrCat("export: unknown --format \"", options.format,
                                                   "\" (allowed: ", kAllowedFormats, ")"));
  }
  if (options.output.empty()) {
    return absl::InvalidArgumentError("export: -o FILE is required");
  }
  if (options.step < -1) {
    return absl::InvalidArgumentError(
        absl::StrCat("export: --step ", options.step, " is negative (a step is >= 0)"));
  }
  ASSIGN_OR_RETURN(const v1::JobDetail job, ctx.client->GetJob(job_id));
  ASSIGN_OR_RETURN(const WholeCheckpoint ckpt, LoadJobCheckpoint(job, options.step, "export"));
  for (const std::string& reason : ckpt.skipped) {
    *ctx.err << "furnace: skipped a newer checkpoint: " << reason << "\n";
  }
  for (const std::string& warning : ckpt.warnings) {
    *ctx.err << "furnace: warning: " << warning << "\n";
  }
  std::vector<train::TensorView> views;
  for (const WholeTensor& t : ckpt.tensors) views.push_back({t.name, t.shape, t.data.data()});
  RETURN_IF_ERROR(LocalError(train::WriteSafetensors(options.output, views, Metadata(job, ckpt))));
  std::error_code ec;
  const uintmax_t bytes = fs::file_size(options.output, ec);
  const int64_t parameters = ckpt.num_params();
  const size_t tensors = ckpt.tensors.size();

  if (ctx.json) {
    google::protobuf::Struct result;
    auto& f = *result.mutable_fields();
    f["job_id"].set_string_value(job_id);
    f["step"].set_number_value(static_cast<double>(ckpt.step));
    f["format"].set_string_value(options.format);
    f["output"].set_string_value(options.output);
    f["checkpoint"].set_string_value(ckpt.path);
    f["shards"].set_number_value(ckpt.num_shards);
    f["tensors"].set_number_value(static_cast<double>(tensors));
    f["parameters"].set_number_value(static_cast<double>(parameters));
    f["bytes"].set_number_value(ec ? 0.0 : static_cast<double>(bytes));
    RETURN_IF_ERROR(PrintJson(result, *ctx.out));
  } else {
    *ctx.out << "exported job " << job_id << " step " << ckpt.step << " to " << options.output
             << ": " << tensors << (tensors == 1 ? " tensor, " : " tensors, ")
             << FormatCount(parameters) << " fp32 parameters, "
             << (ec ? std::string("size unknown")
                    : absl::StrCat(FormatBytes(bytes), " (",
                                   FormatCount(static_cast<int64_t>(bytes)), " bytes)"))
             << "\n  from " << ckpt.path
             << (ckpt.num_shards > 1
                     ? absl::StrCat(" (reassembled from ", ckpt.num_shards, " shards)")
                     : "")
             << "\n";
  }
  return kExitOk;
}

}  // namespace furnace::cli
