// The optimizer half of a training step: global-norm gradient clipping and AdamW over the flat
// parameter array of a Trainable, with weight decay only where ParamInfo::weight_decay is set
// (MODEL.md: every 2-D parameter, nothing else). The arithmetic is the backend's (adamw_update,
// sum_of_squares, scale) on the device that holds the parameters: the CPU table for host arrays,
// the model's device's table (fp32: master weights, gradients and moments stay fp32 whatever
// model.precision is) otherwise; this file decides what gets decayed and by how much.
//
// Streams: the ops run on the calling thread's current stream (backend.h), after the model's
// kernels on the same stream; GlobalNorm returns a host scalar, so it synchronises that stream.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/device/backend.h"
#include "runtime/device/device.h"
#include "runtime/tensor/device_memory.h"
#include "runtime/trainable/param_info.h"

namespace furnace::train {

struct AdamWConfig {
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;
};

// L2 norm of grad[0..n) (memory of `ops`' device), accumulated in double.
double GlobalNorm(const device::Backend& ops, const float* grad, int64_t n);
// Host arrays (the CPU backend).
double GlobalNorm(const float* grad, int64_t n);

// Clips grad[0..n) to global norm `max_norm` (0 = off) and returns the norm before clipping.
// As torch.nn.utils.clip_grad_norm_ and Megatron: coefficient max_norm / (norm + 1e-6), applied
// only when below 1.
double ClipGradNorm(const device::Backend& ops, float* grad, int64_t n, double max_norm);
double ClipGradNorm(float* grad, int64_t n, double max_norm);  // host arrays

// Adam moments for one flat parameter array, m and v (same length as the parameters), in the
// memory of a device and updated with its table. Owns them (and, for host moments, the CPU device
// they live on). Not thread-safe.
class AdamW {
 public:
  // Zero moments in `device`'s memory, updated with `ops` (a table of that device); both must
  // outlive the optimizer. ResourceExhausted when the device cannot hold them.
  static absl::StatusOr<std::unique_ptr<AdamW>> Create(const AdamWConfig& config,
                                                       int64_t num_params, device::Device& device,
                                                       const device::Backend& ops);
  // Zero moments in host memory (the CPU device and backend), for host parameter arrays.
  AdamW(const AdamWConfig& config, int64_t num_params);

  // One update with learning rate lr; step is 1-based (bias correction). Parameters not listed in
  // `params` are not touched. param and grad: memory of device().
  void Update(const std::vector<ParamInfo>& params, float* param, const float* grad, double lr,
              int64_t step);

  // num_params floats each, memory of device().
  float* m() { return m_.as<float>(); }
  float* v() { return v_.as<float>(); }
  const float* m() const { return m_.as<float>(); }
  const float* v() const { return v_.as<float>(); }
  int64_t size() const { return n_; }
  // The moments copied to the host (the stream synchronised).
  absl::StatusOr<std::vector<float>> HostM() const;
  absl::StatusOr<std::vector<float>> HostV() const;
  const AdamWConfig& config() const { return config_; }
  device::Device& device() const { return *device_; }

 private:
  AdamW(const AdamWConfig& config, int64_t num_params, device::Device& device,
        const device::Backend& ops);
  absl::Status Allocate();

  AdamWConfig config_;
  int64_t n_;
  std::unique_ptr<device::Device> owned_device_;  // host moments only
  device::Device* device_;
  const device::Backend* ops_;
  tensor::DeviceMemory m_, v_;
};

}  // namespace furnace::train
