// Helpers for the CUDA-vs-CPU kernel tests: the GPU-presence skip, device buffers that copy to
// and from std::vector, seeded random inputs and an element-wise closeness check.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "kernels/cuda/common.h"

namespace furnace::kernels::cuda::testing {

// "" when a usable GPU is present, otherwise why not.
std::string NoGpuReason();

#define SKIP_WITHOUT_GPU()                                                          \
  do {                                                                              \
    std::string furnace_no_gpu_ = ::furnace::kernels::cuda::testing::NoGpuReason(); \
    if (!furnace_no_gpu_.empty()) GTEST_SKIP() << "no GPU: " << furnace_no_gpu_;    \
  } while (0)

// Synchronises the device and asserts that neither the launchers nor the kernels failed.
#define ASSERT_KERNELS_OK()                                               \
  do {                                                                    \
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);                      \
    std::string furnace_err_ = ::furnace::kernels::cuda::TakeLastError(); \
    ASSERT_TRUE(furnace_err_.empty()) << furnace_err_;                    \
  } while (0)

template <typename T>
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t n) : n_(n) {
    EXPECT_EQ(cudaMalloc(reinterpret_cast<void**>(&ptr_), (n == 0 ? 1 : n) * sizeof(T)),
              cudaSuccess);
  }
  explicit DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(host.size()) { Upload(host); }
  ~DeviceBuffer() { cudaFree(ptr_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void Upload(const std::vector<T>& host) {
    EXPECT_EQ(host.size(), n_);
    EXPECT_EQ(cudaMemcpy(ptr_, host.data(), n_ * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  }
  std::vector<T> Download() const {
    std::vector<T> host(n_);
    EXPECT_EQ(cudaMemcpy(host.data(), ptr_, n_ * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return host;
  }
  T* get() const { return ptr_; }
  size_t size() const { return n_; }

 private:
  size_t n_;
  T* ptr_ = nullptr;
};

std::vector<float> RandomVector(size_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f);
std::vector<int32_t> RandomInts(size_t n, uint32_t seed, int32_t lo, int32_t hi);  // [lo, hi)

// |got - want| <= atol + rtol * |want| everywhere; reports the first few offenders.
void ExpectClose(const std::vector<float>& got, const std::vector<float>& want, float rtol,
                 float atol, const std::string& what);

}  // namespace furnace::kernels::cuda::testing
