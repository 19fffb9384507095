#include "runtime/train/optimizer_step.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "runtime/base/status.h"
#include "runtime/tensor/transfer.h"

namespace furnace::train {

double GlobalNorm(const device::Backend& ops, const float* grad, int64_t n) {
  return std::sqrt(ops.sum_of_squares(grad, n));
}

double GlobalNorm(const float* grad, int64_t n) {
  return GlobalNorm(device::CpuBackend(), grad, n);
}

double ClipGradNorm(const device::Backend& ops, float* grad, int64_t n, double max_norm) {
  const double norm = GlobalNorm(ops, grad, n);
  if (max_norm > 0) {
    const double coef = max_norm / (norm + 1e-6);
    if (coef < 1.0) ops.scale(grad, static_cast<float>(coef), n);
  }
  return norm;
}

double ClipGradNorm(float* grad, int64_t n, double max_norm) {
  return ClipGradNorm(device::CpuBackend(), grad, n, max_norm);
}

AdamW::AdamW(const AdamWConfig& config, int64_t num_params, device::Device& device,
             const device::Backend& ops)
    : config_(config), n_(num_params), device_(&device), ops_(&ops) {}

AdamW::AdamW(const AdamWConfig& config, int64_t num_params)
    : config_(config),
      n_(num_params),
      owned_device_(device::CreateCpuDevice()),
      device_(owned_device_.get()),
      ops_(&device::CpuBackend()) {
  if (const absl::Status s = Allocate(); !s.ok()) {
    // As a failed std::vector allocation of the moments would.
    std::fprintf(stderr, "AdamW: %s\n", s.ToString().c_str());
    std::abort();
  }
}

absl::Status AdamW::Allocate() {
  const uint64_t bytes = static_cast<uint64_t>(n_) * sizeof(float);
  ASSIGN_OR_RETURN(m_, tensor::DeviceMemory::Allocate(*device_, bytes, "Adam first moments"));
  ASSIGN_OR_RETURN(v_, tensor::DeviceMemory::Allocate(*device_, bytes, "Adam second moments"));
  RETURN_IF_ERROR(tensor::Fill(*device_, m_.data(), 0, bytes));
  return tensor::Fill(*device_, v_.data(), 0, bytes);
}

absl::StatusOr<std::unique_ptr<AdamW>> AdamW::Create(const AdamWConfig& config, int64_t num_params,
                                                     device::Device& device,
                                                     const device::Backend& ops) {
  std::unique_ptr<AdamW> adamw(new AdamW(config, num_params, device, ops));
  RETURN_IF_ERROR(adamw->Allocate());
  return adamw;
}

void AdamW::Update(const std::vector<ParamInfo>& params, float* param, const float* grad, double lr,
                   int64_t step) {
  for (const ParamInfo& p : params) {
    const float wd = p.weight_decay ? static_cast<float>(config_.weight_decay) : 0.0f;
    ops_->adamw_update(param + p.offset, grad + p.offset, m() + p.offset, v() + p.offset, p.numel(),
                       static_cast<float>(lr), static_cast<float>(config_.beta1),
                       static_cast<float>(config_.beta2), static_cast<float>(config_.eps), wd,
                       step);
  }
}

namespace {

absl::StatusOr<std::vector<float>> ToHost(device::Device& device, const float* data, int64_t n) {
  std::vector<float> out(static_cast<size_t>(n));
  RETURN_IF_ERROR(tensor::CopyToHost(device, out.data(), data, out.size() * sizeof(float)));
  return out;
}

}  // namespace

absl::StatusOr<std::vector<float>> AdamW::HostM() const { return ToHost(*device_, m(), n_); }
absl::StatusOr<std::vector<float>> AdamW::HostV() const { return ToHost(*device_, v(), n_); }

}  // namespace furnace::train
