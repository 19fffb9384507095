// ModelConfig: the shape of a GPT with Mixture-of-Experts layers (MODEL.md "Shapes and names").
// Layer l is an MoE layer iff l % moe_every == moe_every - 1, else a dense MLP of width dense_ffn.
#pragma once

#include <map>
#include <string>

#include "absl/status/status.h"
#include "runtime/model/spikes.h"

namespace furnace::model {

struct ModelConfig {
  int vocab = 0;               // V
  int seq_len = 0;             // T
  int d_model = 0;             // d
  int heads = 0;               // h, d % h == 0
  int layers = 0;              // L
  int dense_ffn = 0;           // width of dense MLPs; 0 = 4 * d_model (MODEL.md default)
  int moe_every = 1;           // 1 = every layer is MoE
  int experts = 0;             // E
  int top_k = 1;               // k
  int expert_ffn = 0;          // f
  double capacity_factor = 0;  // 0 = dropless
  // Gates renormalised to sum 1 over the k chosen. MODEL.md's default is true for k > 1 only (with
  // k = 1 a renormalised gate is always 1, and the router learns from the aux loss alone): the job
  // spec resolves it so (controller/spec); code that builds a config sets it itself.
  bool normalize_topk = true;
  double aux_alpha = 0.01;
  SpikeConfig spikes;  // routing-spike injection (spikes.h); off by default
  // model.attention_probs recomputed: attention saves two numbers per query row instead of its
  // (T, T) probabilities and rebuilds them in backward (kernels/attention.h, RowStats). The same
  // results bit for bit on the CPU and the emulated device (on CUDA, within the order of its sums);
  // fewer activation bytes, one more Q K^T product per layer in backward.
  bool recompute_attention_probs = false;

  // InvalidArgument naming the field, its value and what is allowed.
  absl::Status Validate() const;
  // What defines the model beyond its parameters' names and shapes (which a checkpoint holds
  // already), by job-spec field name, as text (ShortestDecimal): model.heads, moe.top_k,
  // moe.capacity_factor, moe.normalize_topk, moe.aux_alpha. A checkpoint records them beside the
  // optimizer's settings (runtime/train/run_settings.h) and a resume compares them the same way:
  // the weights of a 4-head top-2 model would otherwise go on training as an 8-head top-1 one with
  // nothing said. The routing spikes are left out: they are a test's injection, not the model.
  std::map<std::string, std::string> RecordedSettings() const;

  bool IsMoeLayer(int layer) const { return layer % moe_every == moe_every - 1; }
  int num_moe_layers() const { return layers / moe_every; }
  int dense_width() const { return dense_ffn > 0 ? dense_ffn : 4 * d_model; }
};

}  // namespace furnace::model
