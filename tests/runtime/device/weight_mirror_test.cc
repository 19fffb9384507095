// Weight mirrors (runtime/device/weight_mirror.h) through a bf16 table: a GEMM whose weight operand
// lies inside a registered array reads the mirror instead of rounding the weight, bit for bit the
// same result when the mirror is current, and a visibly different one when it is stale (so the
// table does read it, and the model's upkeep of it matters). For matmul and grouped matmul,
// forward and backward (the input gradient reads the weight; the weight gradient does not).
// Built twice: on the emulated device (unit) and, in CUDA builds, on the GPU (gpu label: skips
// without one), FURNACE_WEIGHT_MIRROR_CUDA selecting the device and table.
#include "runtime/device/weight_mirror.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <vector>

#include "runtime/device/backend.h"
#include "runtime/device/current_stream.h"
#include "runtime/device/emulated_device.h"
#ifdef FURNACE_WEIGHT_MIRROR_CUDA
#include "runtime/device/cuda_backend.h"
#endif

namespace furnace::device {
namespace {

constexpr int N = 48, C = 40, OC = 24, E = 3;

std::vector<float> Random(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

class WeightMirrorTest : public ::testing::Test {
 protected:
  void SetUp() override {
#ifdef FURNACE_WEIGHT_MIRROR_CUDA
    auto dev = CreateCudaDevice(0);
    if (!dev.ok()) GTEST_SKIP() << "no GPU: " << dev.status();
    dev_ = std::move(*dev);
    table_ = &CudaBf16Backend();
#else
    auto dev = CreateEmulatedDevice({.memory_bytes = 64 << 20});
    ASSERT_TRUE(dev.ok()) << dev.status();
    dev_ = std::move(*dev);
    table_ = &EmulatedBf16Backend();
#endif
    auto s = dev_->CreateStream();
    ASSERT_TRUE(s.ok());
    stream_ = std::move(*s);
    scope_ = std::make_unique<StreamScope>(*stream_);
  }
  void TearDown() override {
    for (void* p : allocations_) dev_->Free(p);
    if (stream_ != nullptr) {
      EXPECT_TRUE(dev_->SynchronizeStream(*stream_).ok());
    }
    scope_.reset();
  }

  template <typename T>
  T* Upload(const std::vector<T>& host) {
    auto d = dev_->Allocate(host.size() * sizeof(T));
    EXPECT_TRUE(d.ok());
    allocations_.push_back(*d);
    EXPECT_TRUE(
        dev_->Copy(*d, host.data(), host.size() * sizeof(T), CopyKind::kHostToDevice, *stream_)
            .ok());
    EXPECT_TRUE(dev_->SynchronizeStream(*stream_).ok());
    return static_cast<T*>(*d);
  }
  std::vector<float> Download(const float* d, size_t n) {
    std::vector<float> host(n);
    EXPECT_TRUE(dev_->Copy(host.data(), d, n * 4, CopyKind::kDeviceToHost, *stream_).ok());
    EXPECT_TRUE(dev_->SynchronizeStream(*stream_).ok());
    return host;
  }
  // The bf16 mirror of `weights` (n elements) made by the table's own cast.
  uint16_t* MirrorOf(const float* weights, int64_t n) {
    uint16_t* m = Upload(std::vector<uint16_t>(static_cast<size_t>(n), 0));
    table_->cast_f32_to_bf16(m, weights, n);
    return m;
  }

  // out = `gemm` run once without a mirror, once with a current one, once with a stale one
  // (the mirror of other values); the first two must be equal bit for bit, the third not.
  void Expect(const char* what, float* weights, int64_t n, float* out, size_t out_n,
              const std::vector<float>& out_init, const std::function<void()>& gemm) {
    auto run = [&] {
      EXPECT_TRUE(
          dev_->Copy(out, out_init.data(), out_n * 4, CopyKind::kHostToDevice, *stream_).ok());
      gemm();
      return Download(out, out_n);
    };
    const std::vector<float> plain = run();
    uint16_t* current = MirrorOf(weights, n);
    std::vector<float> mirrored, stale;
    {
      const WeightMirror reg(weights, current, n);
      EXPECT_EQ(FindWeightMirror(weights, n), current);
      mirrored = run();
    }
    EXPECT_EQ(FindWeightMirror(weights, n), nullptr) << "unregistered with the WeightMirror";
    float* other = Upload(Random(static_cast<size_t>(n), 99));
    uint16_t* old = MirrorOf(other, n);
    {
      const WeightMirror reg(weights, old, n);
      stale = run();
    }
    EXPECT_EQ(0, std::memcmp(plain.data(), mirrored.data(), out_n * 4))
        << what << ": the current mirror changed the result";
    EXPECT_NE(0, std::memcmp(plain.data(), stale.data(), out_n * 4))
        << what << ": a stale mirror did not change the result: the table does not read it";
  }

  std::unique_ptr<Device> dev_;
  std::unique_ptr<Stream> stream_;
  std::unique_ptr<StreamScope> scope_;
  const Backend* table_ = nullptr;
  std::vector<void*> allocations_;
};

TEST_F(WeightMirrorTest, OnlyAWholeOperandInsideARegisteredArrayIsFound) {
  float* w = Upload(Random(100, 1));
  uint16_t* m = MirrorOf(w, 100);
  const WeightMirror reg(w, m, 100);
  EXPECT_EQ(FindWeightMirror(w + 10, 90), m + 10);
  EXPECT_EQ(FindWeightMirror(w + 10, 91), nullptr);  // runs past the end
  EXPECT_EQ(FindWeightMirror(w - 1, 2), nullptr);
}

TEST_F(WeightMirrorTest, MatmulReadsTheMirrorOfItsWeight) {
  float* inp = Upload(Random(N * C, 2));
  float* w = Upload(Random(C * OC, 3));
  float* bias = Upload(Random(OC, 4));
  float* out = Upload(std::vector<float>(N * OC, 0.0f));
  Expect("matmul_forward", w, C * OC, out, N * OC, std::vector<float>(N * OC, 0.0f),
         [&] { table_->matmul_forward(out, inp, w, bias, N, C, OC); });
  float* dout = Upload(Random(N * OC, 5));
  float* dinp = Upload(std::vector<float>(N * C, 0.0f));
  float* dw = Upload(std::vector<float>(C * OC, 0.0f));
  Expect("matmul_backward (dinp)", w, C * OC, dinp, N * C, Random(N * C, 6),
         [&] { table_->matmul_backward(dinp, dw, nullptr, dout, inp, w, N, C, OC); });
}

TEST_F(WeightMirrorTest, GroupedMatmulReadsTheMirrorOfItsWeight) {
  const std::vector<int64_t> offsets = {0, 20, 20, N};
  float* inp = Upload(Random(N * C, 7));
  float* w = Upload(Random(E * C * OC, 8));
  float* out = Upload(std::vector<float>(N * OC, 0.0f));
  Expect("grouped_matmul_forward", w, E * C * OC, out, N * OC, std::vector<float>(N * OC, 0.0f),
         [&] { table_->grouped_matmul_forward(out, inp, w, nullptr, offsets.data(), E, C, OC); });
  float* dout = Upload(Random(N * OC, 9));
  float* dinp = Upload(std::vector<float>(N * C, 0.0f));
  float* dw = Upload(std::vector<float>(E * C * OC, 0.0f));
  Expect("grouped_matmul_backward (dinp)", w, E * C * OC, dinp, N * C, Random(N * C, 10), [&] {
    table_->grouped_matmul_backward(dinp, dw, nullptr, dout, inp, w, offsets.data(), E, C, OC);
  });
}

}  // namespace
}  // namespace furnace::device
