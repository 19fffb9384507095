#include "runtime/tensor/host_pool.h"

#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/tensor/tensor.h"

namespace furnace::tensor {
namespace {

using ::testing::HasSubstr;

TEST(HostPoolTest, AccountsApartAndReleases) {
  std::unique_ptr<device::Device> device = device::CreateCpuDevice();
  HostPool pool(*device, 256);
  {
    absl::StatusOr<Buffer> a = pool.Allocate(200, "offload.a");
    ASSERT_TRUE(a.ok());
    std::memset(a->data(), 7, 200);
    absl::StatusOr<Buffer> b = pool.Allocate(57, "offload.b");
    ASSERT_FALSE(b.ok());
    EXPECT_EQ(b.status().code(), absl::StatusCode::kResourceExhausted);
    EXPECT_THAT(b.status().message(), HasSubstr("57 bytes"));
    EXPECT_THAT(b.status().message(), HasSubstr("offload.b"));
    EXPECT_EQ(pool.current_bytes(), 200u);
  }
  EXPECT_EQ(pool.current_bytes(), 0u);
  EXPECT_EQ(pool.peak_bytes(), 200u);
}

TEST(HostPoolTest, ThreadSafeAccounting) {
  std::unique_ptr<device::Device> device = device::CreateCpuDevice();
  HostPool pool(*device, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&pool] {
      for (int i = 0; i < 200; ++i) {
        absl::StatusOr<Buffer> b = pool.Allocate(16 + i, "x");
        ASSERT_TRUE(b.ok());
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(pool.current_bytes(), 0u);
}

TEST(TensorViewTest, BytesFollowDtype) {
  TensorView v{nullptr, {2, 3, 4}, DType::kBF16, device::Kind::kCpu};
  EXPECT_EQ(v.numel(), 24);
  EXPECT_EQ(v.bytes(), 48);
  EXPECT_EQ(ElementSize(DType::kFP8E4M3), 1);
  EXPECT_EQ(ElementSize(DType::kF32), 4);
  EXPECT_EQ(ShapeString(v.shape), "(2, 3, 4)");
}

}  // namespace
}  // namespace furnace::tensor
