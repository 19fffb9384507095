// KvDecoder: the GPT-MoE of MODEL.md run forward for text generation, one process, fp32, with a
// key-value cache: each token's attention keys and values are kept per layer, so a new token costs
// one row through every layer (attention over the cached rows) instead of the whole sequence
// again. Its logits equal those of the training model's full forward on the same tokens to fp32
// round-off (tests/runtime/model/kv_decoder_test.cc compares them with GptMoe's).
//
// Why a separate implementation: GptMoe is built for training (stash, arena, backward, shards over
// a parallel layout, the kernels' backend); generation needs none of that, and the CLI, which runs
// `furnace sample` on whatever machine holds the checkpoint, links no kernels and no
// communicators (tests/layering). So this file is plain loops over whole tensors, double
// accumulation in every dot product.
//
// MoE layers run dropless whatever moe.capacity_factor: capacity is a rule over the tokens of a
// training micro-batch, and a generated token belongs to none (the inference of Megatron-style
// systems does the same). Routing ties go to the lower expert index, as in training; the router's
// probabilities are taken in double here, in fp32 there, so two experts within fp32 round-off of
// each other may be ordered differently.
//
// The cache holds at most config.seq_len positions (the learned position table wpe has that many
// rows); Append refuses tokens beyond it (OutOfRange), and Generate (generate.h) re-encodes a
// shorter window then.
//
// Thread-safety: one thread at a time. Errors: Create: InvalidArgument for a bad config, a missing
// or extra tensor or one of the wrong shape (naming it and both shapes); Append: InvalidArgument
// for a token outside [0, V), OutOfRange past seq_len.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "runtime/model/config.h"

namespace furnace::model {

struct WeightTensor {
  std::vector<int64_t> shape;
  std::vector<float> data;
};
// Whole tensors by MODEL.md name ("wte", "layers.0.attn.wqkv", ...), [in, out] layout.
using Weights = std::map<std::string, WeightTensor>;

// Every parameter of `config`'s model, MODEL.md names and whole shapes, in the single-process
// order (wte, wpe, layer by layer, lnf).
std::vector<std::pair<std::string, std::vector<int64_t>>> ParameterShapes(
    const ModelConfig& config);

class KvDecoder {
 public:
  // Takes the weights over (no copy).
  static absl::StatusOr<std::unique_ptr<KvDecoder>> Create(const ModelConfig& config,
                                                           Weights weights);

  // Runs `tokens` at positions length() .. length() + n - 1, appends their keys and values to
  // the cache, and returns their logits (n, V), row-major.
  absl::StatusOr<std::vector<float>> Append(absl::Span<const int32_t> tokens);
  // Positions in the cache.
  int length() const { return length_; }
  int max_length() const { return config_.seq_len; }
  // Empties the cache (the next Append starts at position 0).
  void Reset() { length_ = 0; }
  const ModelConfig& config() const { return config_; }

 private:
  KvDecoder(const ModelConfig& config, Weights weights);
  const float* W(const std::string& name) const { return weights_.at(name).data.data(); }
  // x (n, C) += FFN of layer `l` applied to u (n, C).
  void AddFfn(int l, const std::vector<float>& u, int n, std::vector<float>& x) const;

  ModelConfig config_;
  Weights weights_;
  std::vector<std::vector<float>> keys_, values_;  // [layer]: (seq_len, C) each
  int length_ = 0;
};

}  // namespace furnace::model
