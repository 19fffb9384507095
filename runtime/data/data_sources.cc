#include "runtime/data/data_sources.h"

#include <filesystem>
#include <system_error>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "runtime/base/status.h"
#include "runtime/data/epoch_sampler.h"
#include "runtime/data/indexed_dataset.h"
#include "runtime/data/markov.h"
#include "runtime/data/token_file.h"

namespace furnace::data {
namespace {

absl::StatusOr<std::shared_ptr<const TokenStream>> OpenStream(const DataSourceConfig& data,
                                                              const std::string& path,
                                                              std::string* description) {
  if (data.source == "tokens") {
    ASSIGN_OR_RETURN(std::unique_ptr<TokenFile> file, TokenFile::Open(path, data.model_vocab));
    if (!data.tokenizer.empty()) {
      RETURN_IF_ERROR(CheckTokenizerIdentity(*file, data.tokenizer));
      if (file->identity().empty()) {
        absl::StrAppend(description, "[", path,
                        " is a version 1 token file: it does not record its tokenizer, so "
                        "data.tokenizer ",
                        data.tokenizer, " is not checked] ");
      }
    }
    return std::shared_ptr<const TokenStream>(std::move(file));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<IndexedDataset> ds,
                   IndexedDataset::Open(path, data.model_vocab));
  return std::shared_ptr<const TokenStream>(std::move(ds));
}

absl::StatusOr<std::vector<EpochSource>> OpenAll(const DataSourceConfig& data,
                                                 const std::vector<DataPath>& paths,
                                                 std::string* description) {
  std::vector<EpochSource> sources;
  for (const DataPath& p : paths) {
    ASSIGN_OR_RETURN(std::shared_ptr<const TokenStream> stream,
                     OpenStream(data, p.path, description));
    absl::StrAppendFormat(description, "%s%s (%d tokens, weight %g)", sources.empty() ? "" : ", ",
                          p.path, stream->size(), p.weight);
    sources.push_back({std::move(stream), p.weight});
  }
  return sources;
}

absl::StatusOr<Samplers> MakeMarkovSamplers(const DataSourceConfig& data,
                                            const SamplerConfig& sampler) {
  MarkovConfig mc;
  mc.vocab = static_cast<int>(data.model_vocab);
  mc.seed = data.markov_seed;
  ASSIGN_OR_RETURN(MarkovChain created, MarkovChain::Create(mc));
  const auto chain = std::make_shared<const MarkovChain>(std::move(created));
  Samplers out;
  out.entropy_floor = chain->entropy_rate();
  out.description =
      absl::StrFormat("synthetic Markov chain over %d symbols, entropy floor H = %.4f nats/token",
                      chain->vocab(), out.entropy_floor);
  ASSIGN_OR_RETURN(out.train, MakeMarkovSampler(chain, sampler));
  ASSIGN_OR_RETURN(out.validation, MakeMarkovSampler(chain, sampler, true));
  return out;
}

}  // namespace

DataReadsAtOpen DataReadAtOpen(const DataSourceConfig& data) {
  DataReadsAtOpen reads;
  if (data.source != "indexed" && data.source != "tokens") return reads;
  for (const std::vector<DataPath>* paths : {&data.paths, &data.validation_paths}) {
    for (const DataPath& p : *paths) {
      reads.scattered_reads += TokenStream::kFingerprintTokens;
      if (data.source != "indexed") continue;
      std::error_code ec;
      const uintmax_t n = std::filesystem::file_size(IndexedDataset::IndexPath(p.path), ec);
      if (!ec) reads.sequential_bytes += n;
    }
  }
  return reads;
}

absl::StatusOr<Samplers> MakeSamplers(const DataSourceConfig& data, const SamplerConfig& sampler) {
  if (data.source == "markov") return MakeMarkovSamplers(data, sampler);
  if (data.source != "tokens" && data.source != "indexed") {
    return absl::InvalidArgumentError(
        absl::StrCat("data.source: ", data.source, " (allowed: markov, tokens, indexed)"));
  }
  if (data.paths.empty() || (data.source == "tokens" && data.paths.size() != 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("data.path: ", data.source, " data needs ",
                     data.source == "tokens" ? "exactly one token file" : "a prefix or a blend",
                     ", got ", data.paths.size(), " paths"));
  }
  if (data.validation_fraction > 0 && !data.validation_paths.empty()) {
    return absl::InvalidArgumentError(
        "data.validation: give either a fraction or a path, not both");
  }
  Samplers out;
  out.description = absl::StrCat(data.source == "tokens" ? "token file " : "indexed data ");
  ASSIGN_OR_RETURN(std::vector<EpochSource> sources, OpenAll(data, data.paths, &out.description));

  EpochSamplerOptions train;
  if (data.validation_fraction > 0) {
    train.part = SplitPart::kTrain;
    train.validation_fraction = data.validation_fraction;
    EpochSamplerOptions held_out = train;
    held_out.part = SplitPart::kValidation;
    held_out.shuffle = false;
    ASSIGN_OR_RETURN(out.validation, MakeEpochSampler(sources, sampler, held_out));
    absl::StrAppendFormat(&out.description, "; %g of each held out for validation",
                          data.validation_fraction);
  } else if (!data.validation_paths.empty()) {
    absl::StrAppend(&out.description, "; validation ");
    ASSIGN_OR_RETURN(std::vector<EpochSource> held_out,
                     OpenAll(data, data.validation_paths, &out.description));
    // Held-out data that is the training data (the same file, a copy, a link) would measure the
    // loss on what is trained on, and look like a model that generalises perfectly.
    for (const EpochSource& v : held_out) {
      ASSIGN_OR_RETURN(const std::string fingerprint, v.stream->Fingerprint());
      for (const EpochSource& t : sources) {
        ASSIGN_OR_RETURN(const std::string training, t.stream->Fingerprint());
        if (training != fingerprint) continue;
        return absl::InvalidArgumentError(absl::StrCat(
            "data.validation.path: ", v.stream->path(),
            " has the same content as the training "
            "data ",
            t.stream->path(), " (", fingerprint,
            "): its loss would be measured on what "
            "is trained on; give held-out data, or data.validation.fraction to hold part of the "
            "training data out"));
      }
    }
    ASSIGN_OR_RETURN(out.validation,
                     MakeEpochSampler(std::move(held_out), sampler, {.shuffle = false}));
  }
  ASSIGN_OR_RETURN(out.train, MakeEpochSampler(std::move(sources), sampler, train));
  const DataPosition start = out.train->PositionAt(0);
  if (start.datasets.size() > 1) {
    absl::StrAppendFormat(
        &out.description, "; training sequences of %d tokens per epoch: %s", sampler.seq_len + 1,
        absl::StrJoin(start.datasets, ", ", [](std::string* text, const DatasetPosition& d) {
          absl::StrAppend(text, d.path, " ", d.epoch_sequences);
        }));
  } else {
    absl::StrAppendFormat(&out.description, "; %d training sequences of %d tokens per epoch",
                          start.epoch_sequences, sampler.seq_len + 1);
  }
  return out;
}

}  // namespace furnace::data
