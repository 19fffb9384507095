// furnace sample JOB [--step S] | --weights FILE: text from a trained model. The weights come from
// the job's committed checkpoint (read here, reassembled from any layout as `export` does:
// whole_checkpoint.h) or from a safetensors file with Furnace's model metadata (an export); the
// model runs on this machine's CPU with a key-value cache (runtime/model/kv_decoder.h), one token
// per step after the prompt (runtime/model/generate.h), and the text streams out as it is drawn.
#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "controller/cli/commands.h"
#include "controller/cli/exit_codes.h"
#include "controller/cli/format.h"
#include "controller/cli/job_model.h"
#include "controller/cli/sample_tokenizer.h"
#include "controller/cli/whole_checkpoint.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "runtime/base/status.h"
#include "runtime/checkpoint/safetensors.h"
#include "runtime/model/generate.h"
#include "runtime/model/kv_decoder.h"

namespace furnace::cli {
namespace {

struct LoadedModel {
  model::ModelConfig config;
  model::Weights weights;
  std::string source;          // what the weights came from, for the summary line
  int64_t step = -1;           // the checkpoint's step (-1: a weights file)
  std::string data_source;     // the job's data.source ("" for a weights file)
  std::string data_tokenizer;  // the job's data.tokenizer ("" when it does not say)
};

absl::StatusOr<LoadedModel> FromJob(const CommandContext& ctx, const std::string& job_id,
                                    int64_t step) {
  ASSIGN_OR_RETURN(const v1::JobDetail job, ctx.client->GetJob(job_id));
  if (job.spec().kind() != "train") {
    return absl::InvalidArgumentError(
        absl::StrCat("sample: job ", job_id, " is a ", job.spec().kind(), " job, not a train job"));
  }
  ASSIGN_OR_RETURN(WholeCheckpoint ckpt, LoadJobCheckpoint(job, step, "sample"));
  for (const std::string& reason : ckpt.skipped) {
    *ctx.err << "furnace: skipped a newer checkpoint: " << reason << "\n";
  }
  for (const std::string& warning : ckpt.warnings) {
    *ctx.err << "furnace: warning: " << warning << "\n";
  }
  LoadedModel m;
  m.config = ModelConfigOf(job.spec().model(), job.spec().moe());
  for (WholeTensor& t : ckpt.tensors) {
    m.weights[t.name] = {std::move(t.shape), std::move(t.data)};
  }
  m.source =
      absl::StrCat("job ", job_id, " step ", ckpt.step, " (", ckpt.path,
                   ckpt.num_shards > 1 ? absl::StrCat(", ", ckpt.num_shards, " shards") : "", ")");
  m.step = ckpt.step;
  m.data_source = job.spec().data().source();
  m.data_tokenizer = job.spec().data().tokenizer();
  return m;
}

template <typename Message>
absl::Status ParseMetadata(const std::map<std::string, std::string>& metadata,
                           const std::string& key, const std::string& path, Message* out) {
  auto it = metadata.find(key);
  if (it == metadata.end()) {
    return absl::InvalidArgumentError(absl::StrCat("--weights ", path, ": no \"", key,
                                                   "\" metadata saying what model the tensors are "
                                                   "(a file written by `furnace export` has it)"));
  }
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = true;
  if (!google::protobuf::util::JsonStringToMessage(it->second, out, options).ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--weights ", path, ": metadata \"", key,
                                                   "\" is not the JSON of a model description"));
  }
  return absl::OkStatus();
}

absl::StatusOr<LoadedModel> FromWeights(const std::string& path) {
  absl::StatusOr<train::SafetensorsFile> file = train::ReadSafetensors(path);
  if (!file.ok()) return LocalError(file.status());
  v1::ModelSpec spec;
  v1::MoeSpec moe;
  // A file without a model description (not an export of furnace) is a local error, as an
  // unreadable one is.
  if (absl::Status parsed = ParseMetadata(file->metadata, "furnace.model", path, &spec);
      !parsed.ok()) {
    return LocalError(parsed);
  }
  if (absl::Status parsed = ParseMetadata(file->metadata, "furnace.moe", path, &moe);
      !parsed.ok()) {
    return LocalError(parsed);
  }
  LoadedModel m;
  m.config = ModelConfigOf(spec, moe);
  // The model's parameters; other tensors a file may carry (a test file's inputs) stay behind.
  for (const auto& [name, shape] : model::ParameterShapes(m.config)) {
    auto it = file->tensors.find(name);
    if (it == file->tensors.end()) continue;  // KvDecoder::Create names what is missing
    m.weights[name] = {std::move(it->second.shape), std::move(it->second.data)};
  }
  m.source = path;
  return m;
}

}  // namespace

absl::StatusOr<int> RunSample(const CommandContext& ctx, const std::string& job_id,
                              const SampleOptions& options) {
  if (job_id.empty() == options.weights.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("sample: give either a JOB (its committed checkpoint) or --weights FILE",
                     job_id.empty() ? " (neither was given)" : ", not both"));
  }
  if (options.step < -1) {
    return absl::InvalidArgumentError(
        absl::StrCat("sample: --step ", options.step, " is negative (a step is >= 0)"));
  }
  model::SamplingOptions sampling;
  sampling.max_new_tokens = options.tokens;
  sampling.temperature = options.temperature;
  sampling.top_k = options.top_k;
  sampling.seed = options.seed;
  RETURN_IF_ERROR(model::ValidateSampling(sampling));

  LoadedModel loaded;
  if (!job_id.empty()) {
    ASSIGN_OR_RETURN(loaded, FromJob(ctx, job_id, options.step));
  } else {
    if (options.step != -1) {
      return absl::InvalidArgumentError(
          "sample: --step names a checkpoint of a JOB, not --weights");
    }
    ASSIGN_OR_RETURN(loaded, FromWeights(options.weights));
  }
  // The tokenizer: as asked, else the job's (a Markov job has symbols: ids; token data names
  // its data.tokenizer). An indexed dataset does not record the tokenizer that made it, nor does
  // a token job without data.tokenizer: guessing (the byte tokenizer's ids are valid ids of a
  // 50k vocabulary) would print garbage without an error, so it must be given.
  std::string tokenizer_name = options.tokenizer;
  if (tokenizer_name.empty()) {
    constexpr char kGive[] =
        "give --tokenizer (byte, ids, or the SentencePiece .model the data was prepared with)";
    if (!options.weights.empty())
      return absl::InvalidArgumentError(
          absl::StrCat("sample: --weights does not say which tokenizer made its data: ", kGive));
    if (loaded.data_source == "markov") {
      tokenizer_name = "ids";
    } else if (!loaded.data_tokenizer.empty()) {
      tokenizer_name = loaded.data_tokenizer;
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          "sample: job ", job_id, " does not record the tokenizer of its data (data.source ",
          loaded.data_source,
          loaded.data_source == "indexed" ? ": an indexed dataset" : " without data.tokenizer",
          "): ", kGive));
    }
  }
  std::unique_ptr<Tokenizer> tokenizer;
  if (tokenizer_name == "ids") {
    tokenizer = IdTokenizer(loaded.config.vocab);
  } else {
    // A tokenizer file that cannot be opened here is a local error (exit 5), not "no such job".
    absl::StatusOr<std::unique_ptr<Tokenizer>> opened = OpenTokenizer(tokenizer_name);
    if (!opened.ok()) return LocalError(opened.status());
    tokenizer = std::move(*opened);
  }
  // A job that records its tokenizer decodes with it: another one would turn its ids into
  // another tokenizer's text without an error (--tokenizer is for data that records none).
  if (!options.tokenizer.empty() && options.weights.empty()) {
    std::string recorded;
    if (loaded.data_source == "markov") {
      recorded = "ids";
    } else if (!loaded.data_tokenizer.empty()) {
      recorded = loaded.data_tokenizer;
      if (recorded != "byte" && recorded != options.tokenizer) {
        // The same model file under another path is the same tokenizer; where the job's file is
        // not readable here (it may live on the workers only), the given one is taken as is.
        absl::StatusOr<std::unique_ptr<Tokenizer>> job_tokenizer = OpenTokenizer(recorded);
        if (!job_tokenizer.ok() || (*job_tokenizer)->identity() == tokenizer->identity()) {
          recorded.clear();
        }
      }
    }
    if (!recorded.empty() && recorded != options.tokenizer) {
      return absl::InvalidArgumentError(absl::StrCat(
          "sample: --tokenizer ", options.tokenizer, " is not the tokenizer job ", job_id,
          " trained on (", loaded.data_source == "markov" ? "Markov symbols: ids" : recorded,
          "): its ids would be decoded as another tokenizer's text; leave --tokenizer out"));
    }
  }
  // Ids the tokenizer has no text for (a model vocabulary larger than the tokenizer's) are never
  // sampled, rather than generated and dropped from the text without a word.
  if (tokenizer->vocab() > 0 && tokenizer->vocab() < loaded.config.vocab) {
    *ctx.err << "sample: the " << tokenizer->identity() << " tokenizer has " << tokenizer->vocab()
             << " ids, the model " << loaded.config.vocab << ": ids from " << tokenizer->vocab()
             << " up are not sampled\n";
    sampling.sample_vocab = static_cast<int>(tokenizer->vocab());
  }
  const int32_t eod = tokenizer->eod_id();
  sampling.stop_id = eod >= 0 && eod < loaded.config.vocab ? eod : -1;

  absl::StatusOr<std::vector<int32_t>> encoded =
      tokenizer->Encode(options.prompt, data::TextPart::kWhole);
  if (!encoded.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("sample: --prompt: ", encoded.status().message()));
  }
  std::vector<int32_t> prompt = std::move(*encoded);
  if (prompt.empty()) {
    // An empty prompt starts a new document where the vocabulary has a marker for it.
    if (sampling.stop_id < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("sample: --prompt \"", options.prompt, "\" has no tokens for the ",
                       tokenizer->identity(), " tokenizer (give at least one)"));
    }
    prompt.push_back(sampling.stop_id);
  }
  for (int32_t id : prompt) {
    if (id < 0 || id >= loaded.config.vocab) {
      return absl::InvalidArgumentError(absl::StrCat(
          "sample: --prompt has token ", id, " (", tokenizer->identity(),
          " tokenizer), outside the model's vocabulary [0, ", loaded.config.vocab, ")"));
    }
  }
  absl::StatusOr<std::unique_ptr<model::KvDecoder>> decoder =
      model::KvDecoder::Create(loaded.config, std::move(loaded.weights));
  if (!decoder.ok()) {
    return LocalError(
        absl::InvalidArgumentError(absl::StrCat(loaded.source, ": ", decoder.status().message())));
  }
  if (static_cast<int>(prompt.size()) > loaded.config.seq_len) {
    *ctx.err << "furnace: the prompt is " << prompt.size()
             << " tokens; the model's context is seq_len " << loaded.config.seq_len
             << " tokens: its first " << prompt.size() - loaded.config.seq_len << " are left out\n";
  }

  // The text streams out as it is drawn (unless --json: one document at the end).
  std::vector<int32_t> generated;
  std::string shown;
  const auto t0 = std::chrono::steady_clock::now();
  ASSIGN_OR_RETURN(const model::Generation g,
                   model::Generate(**decoder, prompt, sampling, [&](int32_t token) {
                     generated.push_back(token);
                     if (ctx.json) return;
                     *ctx.out << StreamedText(*tokenizer, generated, false, &shown);
                     ctx.out->flush();
                   }));
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const std::string text = tokenizer->Decode(g.tokens);
  if (ctx.json) {
    google::protobuf::Struct result;
    auto& f = *result.mutable_fields();
    f["source"].set_string_value(loaded.source);
    if (loaded.step >= 0) f["step"].set_number_value(static_cast<double>(loaded.step));
    f["tokenizer"].set_string_value(tokenizer->identity());
    f["prompt"].set_string_value(options.prompt);
    f["text"].set_string_value(text);
    auto* ids = f["tokens"].mutable_list_value();
    for (int32_t id : g.tokens) ids->add_values()->set_number_value(id);
    f["prompt_tokens"].set_number_value(static_cast<double>(prompt.size()));
    f["prompt_dropped"].set_number_value(static_cast<double>(g.prompt_dropped));
    f["context_resets"].set_number_value(g.context_resets);
    f["stopped_at_end_of_document"].set_bool_value(g.stopped);
    f["seconds"].set_number_value(seconds);
    RETURN_IF_ERROR(PrintJson(result, *ctx.out));
    return kExitOk;
  }
  *ctx.out << StreamedText(*tokenizer, generated, true, &shown) << "\n";
  *ctx.err << "furnace: " << g.tokens.size() << " tokens from " << loaded.source << " in "
           << FormatSeconds(seconds) << " ("
           << absl::StrFormat("%.1f", seconds > 0 ? g.tokens.size() / seconds : 0.0)
           << " tokens/s), " << (sampling.temperature == 0 ? "greedy" : "sampled")
           << (g.stopped ? ", ended at the end-of-document token" : "")
           << (g.context_resets > 0
                   ? absl::StrCat(", context re-encoded ", g.context_resets, " time(s)")
                   : "")
           << "\n";
  return kExitOk;
}

}  // namespace furnace::cli
