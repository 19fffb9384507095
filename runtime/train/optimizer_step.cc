#include "runtime/train/optimizer_step.h"

#include <cmath>

#include "runtime/device/backend.h"

namespace furnace::train {
namespace {

// Parameters, gradients and the Adam moments are host arrays (Trainable::param_data, grad_data and
// the moments' vectors), so the optimizer runs the CPU backend whatever device the model computes
// on.
const device::Backend& HostOps() { return device::CpuBackend(); }

}  // namespace

double GlobalNorm(const float* grad, int64_t n) {
  return std::sqrt(HostOps().sum_of_squares(grad, n));
}

double ClipGradNorm(float* grad, int64_t n, double max_norm) {
  const double norm = GlobalNorm(grad, n);
  if (max_norm > 0) {
    const double coef = max_norm / (norm + 1e-6);
    if (coef < 1.0) HostOps().scale(grad, static_cast<float>(coef), n);
  }
  return norm;
}

void AdamW::Update(const std::vector<ParamInfo>& params, float* param, const float* grad, double lr,
                   int64_t step) {
  for (const ParamInfo& p : params) {
    const float wd = p.weight_decay ? static_cast<float>(config_.weight_decay) : 0.0f;
    HostOps().adamw_update(param + p.offset, grad + p.offset, m_.data() + p.offset,
                           v_.data() + p.offset, p.numel(), static_cast<float>(lr),
                           static_cast<float>(config_.beta1), static_cast<float>(config_.beta2),
                           static_cast<float>(config_.eps), wd, step);
  }
}

}  // namespace furnace::train
