// What feeds training and held-out evaluation (MODEL.md "Data"): one call turns the job's data
// section into a training sampler and a validation sampler over the same kind of source.
//
//   markov   the synthetic chain; validation = independent draws of the same chain on a separate
//            stream key (never a sequence the training stream draws).
//   tokens   a Furnace token file (token_file.h).
//   indexed  Megatron-LM mmap indexed datasets (indexed_dataset.h), one prefix or a blend.
//
// Tokens and indexed data are finite: their sequences are visited in epochs (epoch_sampler.h
// says how documents become sequences and how each epoch is shuffled). The held-out split is a
// fraction of each dataset's sequences (the tail of its token stream, never trained on) or
// files of their own. Validation sequences are read in file order, not shuffled, so every
// evaluation sees the same ones.
//
// Both samplers use the training sampler's contract (sampler.h): Sample(index, 0, g) returns the
// B sequences of global micro-batch g of batch `index`, a pure function of those numbers, so
// every layout sees the same global batch when data-parallel rank r asks for g = r * m + j. For
// the validation sampler `index` is the eval batch: eval batch i holds the same sequences on
// every layout and every rank.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/data/sampler.h"

namespace furnace::data {

// One dataset of a blend: a token file path or an indexed-dataset prefix (PREFIX.bin, PREFIX.idx).
struct DataPath {
  std::string path;
  double weight = 1;  // > 0; weights are normalised over the blend
};

struct DataSourceConfig {
  std::string source = "markov";  // markov | tokens | indexed
  std::vector<DataPath> paths;    // tokens: exactly one; indexed: one, or several (a blend)
  uint64_t markov_seed = 0;       // markov: the chain's seed (data.seed)
  int64_t model_vocab = 0;        // every token must be below it; markov: the chain's size
  // data.tokenizer ("byte" or a SentencePiece model path; empty: not checked): every token file
  // must have been made by it (CheckTokenizerIdentity); a version 1 file does not say, and the
  // description says it was not checked.
  std::string tokenizer;
  // The held-out split: at most one of the two. Neither: no validation sampler (except markov,
  // whose validation stream always exists).
  double validation_fraction = 0;            // in (0, 0.5]: held out of every dataset
  std::vector<DataPath> validation_paths{};  // own files (same source kind and blend weights)
};

struct Samplers {
  std::unique_ptr<Sampler> train;
  std::unique_ptr<Sampler> validation;  // nullptr when the source has no held-out data
  double entropy_floor = 0;             // markov: the chain's entropy rate (nats/token); else 0
  std::string description;              // one line for the log: what was opened, how big
};

// Opens and validates the data (errors name the file and the allowed values; tokens are checked
// as the samplers read them) and builds both samplers. `sampler.global_batch` must be the job's
// global batch (micro_batch * micro_batches * dp), the same for both; the validation sampler uses
// the same B and T.
absl::StatusOr<Samplers> MakeSamplers(const DataSourceConfig& data, const SamplerConfig& sampler);

// What MakeSamplers reads before training, training and held-out data alike: each indexed
// prefix's .idx whole (12 bytes a sequence, 8 a document), and the fingerprint's tokens scattered
// over every dataset (TokenStream::kFingerprintTokens each, asked for together). Token files are
// opened by their header and every .bin is read only as it is trained on (token_stream.h).
// Nothing for markov data; an index that cannot be stat'ed counts 0 bytes (opening it says why).
struct DataReadsAtOpen {
  uint64_t sequential_bytes = 0;
  int64_t scattered_reads = 0;
};
DataReadsAtOpen DataReadAtOpen(const DataSourceConfig& data);

}  // namespace furnace::data
