// GptMoe: the GPT with Mixture-of-Experts layers of MODEL.md, single process, fp32, on the CPU
// kernels (the oracle every parallel layout and memory policy is compared with).
//
// Parameters and gradients are one flat fp32 array each (ParamLayout). Activations come from the
// DeviceArena given at creation and everything saved for backward goes through the Stash, so a
// memory planner sees every saved tensor. ForwardBackward frees everything it allocated before it
// returns, on success and on error.
//
// Declared activation bytes: each module states its saved bytes and its forward / backward peaks
// by replaying its own allocation order (module.h). ActivationBytesForRouting(B, rows) composes
// them into the arena peak of one ForwardBackward on an otherwise empty arena; it is exact (tests
// compare it with DeviceArena::peak_bytes() byte for byte). Only the MoE expert buffers depend on
// routing, through S = rows kept per MoE layer; dropless S is always N * k, so ActivationBytes(B)
// is exact dropless and an upper bound with a capacity.
//
// Thread-safety: one thread at a time. Errors: InvalidArgument for bad inputs (token ids outside
// [0, V), B < 1); ResourceExhausted from the arena when the budget is too small (the gradients may
// then hold a partial accumulation: the step must be given up or retried after ZeroGrad).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/device/device.h"
#include "runtime/model/config.h"
#include "runtime/model/param_layout.h"
#include "runtime/model/stash.h"
#include "runtime/tensor/arena.h"
#include "runtime/train/trainable.h"

namespace furnace::model {

struct ForwardState;

class GptMoe final : public train::Trainable {
 public:
  // `device` and `activations` must outlive the model. The device must be the CPU device (the
  // model runs the CPU kernels); others: Unimplemented.
  static absl::StatusOr<std::unique_ptr<GptMoe>> Create(const ModelConfig& config, uint64_t seed,
                                                        device::Device& device,
                                                        tensor::DeviceArena& activations);
  ~GptMoe() override;

  // train::Trainable.
  const std::vector<train::ParamInfo>& params() const override { return layout_.params; }
  int64_t num_params() const override { return layout_.total; }
  float* param_data() override { return params_.data(); }
  float* grad_data() override { return grads_.data(); }
  void ZeroGrad() override;
  absl::StatusOr<train::MicroBatchResult> ForwardBackward(const int32_t* inputs,
                                                          const int32_t* targets, int B,
                                                          double ce_scale,
                                                          double aux_scale) override;
  absl::StatusOr<train::MicroBatchResult> Evaluate(const int32_t* inputs, const int32_t* targets,
                                                   int B) override;
  int seq_len() const override { return config_.seq_len; }
  int vocab() const override { return config_.vocab; }
  double FlopsPerToken() const override;

  const ModelConfig& config() const { return config_; }
  const ParamLayout& layout() const { return layout_; }
  // nullptr when there is no parameter of that name.
  const train::ParamInfo* FindParam(const std::string& name) const;

  // Declared activation bytes (see the file comment). rows_per_moe_layer: S of each MoE layer in
  // layer order.
  int64_t ActivationBytesForRouting(int B, const std::vector<int64_t>& rows_per_moe_layer) const;
  int64_t ActivationBytes(int B) const;
  // S of each MoE layer in the last forward.
  const std::vector<int64_t>& last_rows_per_moe_layer() const { return last_rows_; }
  // Bytes held by the stash at the end of the last forward (everything saved for backward).
  uint64_t last_stashed_bytes() const { return last_stashed_bytes_; }

  // When on, each forward copies its logits (B, T, V) to the host for last_logits().
  void set_capture_logits(bool on) { capture_logits_ = on; }
  const std::vector<float>& last_logits() const { return last_logits_; }

  Stash& stash() { return stash_; }

 private:
  GptMoe(const ModelConfig& config, device::Device& device, tensor::DeviceArena& activations);

  absl::Status CheckInputs(const int32_t* inputs, const int32_t* targets, int B) const;
  absl::StatusOr<ForwardState> Forward(const int32_t* inputs, const int32_t* targets, int B);
  absl::Status Backward(const ForwardState& state, int B, double ce_scale, double aux_scale);
  train::MicroBatchResult Summarize(const ForwardState& state, int B) const;

  const ModelConfig config_;
  const ParamLayout layout_;
  device::Device& device_;
  tensor::DeviceArena& arena_;
  Stash stash_;
  std::vector<float> params_;
  std::vector<float> grads_;
  std::vector<int64_t> last_rows_;
  uint64_t last_stashed_bytes_ = 0;
  bool capture_logits_ = false;
  std::vector<float> last_logits_;
};

}  // namespace furnace::model
