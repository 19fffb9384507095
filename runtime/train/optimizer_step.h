// The optimizer half of a training step: global-norm gradient clipping and AdamW over the flat
// parameter array of a Trainable, with weight decay only where ParamInfo::weight_decay is set
// (MODEL.md: every 2-D parameter, nothing else). The arithmetic is the CPU backend's (adamw_update,
// sum_of_squares, scale: the parameters are host arrays); this file decides what gets decayed and
// by how much.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "runtime/trainable/param_info.h"

namespace furnace::train {

struct AdamWConfig {
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;
};

// L2 norm of grad[0..n), accumulated in double.
double GlobalNorm(const float* grad, int64_t n);

// Clips grad[0..n) to global norm `max_norm` (0 = off) and returns the norm before clipping.
// As torch.nn.utils.clip_grad_norm_ and Megatron: coefficient max_norm / (norm + 1e-6), applied
// only when below 1.
double ClipGradNorm(float* grad, int64_t n, double max_norm);

// Adam moments for one flat parameter array. Owns m and v (same length as the parameters).
class AdamW {
 public:
  AdamW(const AdamWConfig& config, int64_t num_params)
      : config_(config), m_(num_params, 0.0f), v_(num_params, 0.0f) {}

  // One update with learning rate lr; step is 1-based (bias correction). Parameters not listed in
  // `params` are not touched.
  void Update(const std::vector<ParamInfo>& params, float* param, const float* grad, double lr,
              int64_t step);

  std::vector<float>& m() { return m_; }
  std::vector<float>& v() { return v_; }
  const std::vector<float>& m() const { return m_; }
  const std::vector<float>& v() const { return v_; }
  const AdamWConfig& config() const { return config_; }

 private:
  AdamWConfig config_;
  std::vector<float> m_, v_;
};

}  // namespace furnace::train
