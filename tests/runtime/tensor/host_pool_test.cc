#include "runtime/tensor/host_pool.h"

#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/tensor/tensor.h"
#include "tests/runtime/device/fake_device.h"

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

// Page-locked blocks are slow to make and free: a freed one is kept in its size class and reused,
// up to max(budget, peak) bytes, and given back with the pool.
TEST(HostPoolTest, KeepsFreedBlocksForReuse) {
  device::testing_util::FakeDevice device(device::Kind::kCuda, "cuda:0", /*host_memory=*/true);
  {
    HostPool pool(device, 0);
    void* first = nullptr;
    {
      absl::StatusOr<Buffer> a = pool.Allocate(3 << 20, "a");
      ASSERT_TRUE(a.ok());
      first = a->data();
    }
    EXPECT_EQ(device.host_frees, 0);
    EXPECT_EQ(pool.cached_bytes(), uint64_t{3} << 20);
    EXPECT_EQ(pool.current_bytes(), 0u);
    for (uint64_t bytes : {uint64_t{3} << 20, (uint64_t{3} << 20) - 1000}) {  // one size class
      absl::StatusOr<Buffer> b = pool.Allocate(bytes, "b");
      ASSERT_TRUE(b.ok());
      EXPECT_EQ(b->data(), first);
      EXPECT_EQ(pool.cached_bytes(), 0u);
      EXPECT_EQ(pool.current_bytes(), bytes);  // accounted in requested bytes
    }
    EXPECT_EQ(device.host_allocations, 1);
    {
      // Another class: a new block; both kept (within the peak of 7 MiB in use).
      absl::StatusOr<Buffer> c = pool.Allocate(3 << 20, "c");
      absl::StatusOr<Buffer> d = pool.Allocate(4 << 20, "d");
      ASSERT_TRUE(c.ok() && d.ok());
      EXPECT_EQ(device.host_allocations, 2);
    }
    EXPECT_EQ(pool.cached_bytes(), uint64_t{7} << 20);
    EXPECT_EQ(device.host_frees, 0);
  }
  EXPECT_EQ(device.host_frees, 2);  // with the pool
}

// The cap counts blocks, not requests: a first request below its class's size is kept too.
TEST(HostPoolTest, KeepsABlockLargerThanItsRequest) {
  device::testing_util::FakeDevice device(device::Kind::kCuda, "cuda:0", /*host_memory=*/true);
  HostPool pool(device, 0);
  const uint64_t bytes = (uint64_t{3} << 20) - 1000;  // class: 3 MiB
  void* first = nullptr;
  {
    absl::StatusOr<Buffer> a = pool.Allocate(bytes, "a");
    ASSERT_TRUE(a.ok());
    first = a->data();
  }
  EXPECT_EQ(pool.cached_bytes(), uint64_t{3} << 20);
  absl::StatusOr<Buffer> b = pool.Allocate(bytes, "b");
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->data(), first);
  EXPECT_EQ(device.host_allocations, 1);
  EXPECT_EQ(device.host_frees, 0);
}

TEST(HostPoolTest, KeepsNoMoreThanTheBudget) {
  device::testing_util::FakeDevice device(device::Kind::kCuda, "cuda:0", /*host_memory=*/true);
  HostPool pool(device, uint64_t{5} << 20);
  {
    absl::StatusOr<Buffer> a = pool.Allocate(3 << 20, "a");
    absl::StatusOr<Buffer> b = pool.Allocate(2 << 20, "b");
    ASSERT_TRUE(a.ok() && b.ok());
  }
  EXPECT_EQ(pool.cached_bytes(), uint64_t{5} << 20);
  EXPECT_EQ(device.host_frees, 0);
  {
    // A class none of the kept blocks serves: with a new 4 MiB block the pinned total would be
    // 9 MiB, so kept blocks go first, largest first, until it fits the 5 MiB (here both).
    absl::StatusOr<Buffer> c = pool.Allocate(4 << 20, "c");
    ASSERT_TRUE(c.ok());
    EXPECT_EQ(pool.cached_bytes(), 0u);
    EXPECT_EQ(device.host_frees, 2);
  }
  EXPECT_EQ(pool.cached_bytes(), uint64_t{4} << 20);  // kept: within the 5 MiB
  EXPECT_EQ(device.host_allocations, 3);
  EXPECT_EQ(device.host_frees, 2);
}

// A request the host cannot serve leaves the peaks, and so the cap on kept blocks, as they were:
// the pool does not go on keeping the memory the host just lacked.
TEST(HostPoolTest, AFailedAllocationDoesNotRaiseThePeaks) {
  device::testing_util::FakeDevice device(device::Kind::kCuda, "cuda:0", /*host_memory=*/true);
  device.host_limit = size_t{4} << 20;
  HostPool pool(device, 0);
  absl::StatusOr<Buffer> huge = pool.Allocate(uint64_t{8} << 20, "huge");
  EXPECT_EQ(huge.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(pool.peak_bytes(), 0u);
  EXPECT_EQ(pool.current_bytes(), 0u);
  {
    absl::StatusOr<Buffer> a = pool.Allocate(1 << 20, "a");
    absl::StatusOr<Buffer> b = pool.Allocate(2 << 20, "b");
    ASSERT_TRUE(a.ok() && b.ok());
  }
  EXPECT_EQ(pool.cached_bytes(), uint64_t{3} << 20);  // within the peak of 3 MiB in use
  {
    // A new class: with it 4 MiB are in use, over the 3 MiB peak, so the kept blocks go (with the
    // failed 8 MiB counted in the peak they would have stayed).
    absl::StatusOr<Buffer> c = pool.Allocate(4 << 20, "c");
    ASSERT_TRUE(c.ok());
    EXPECT_EQ(pool.cached_bytes(), 0u);
    EXPECT_EQ(device.host_frees, 2);
  }
  EXPECT_EQ(pool.peak_bytes(), uint64_t{4} << 20);
  // Far past any memory: refused at once (the size classes' arithmetic would overflow).
  EXPECT_EQ(pool.Allocate(uint64_t{1} << 63, "absurd").status().code(),
            absl::StatusCode::kResourceExhausted);
}

TEST(HostPoolTest, SizeClassesWasteAtMostAnEighth) {
  EXPECT_EQ(BudgetedPool::SizeClass(1), 4096u);
  EXPECT_EQ(BudgetedPool::SizeClass(4096), 4096u);
  EXPECT_EQ(BudgetedPool::SizeClass(4097), 4096u + 512);
  EXPECT_EQ(BudgetedPool::SizeClass(8192), 8192u);
  EXPECT_EQ(BudgetedPool::SizeClass((uint64_t{3} << 20) - 1000), uint64_t{3} << 20);
  for (uint64_t bytes = 4097; bytes < (uint64_t{1} << 40); bytes = bytes * 3 + 17) {
    const uint64_t block = BudgetedPool::SizeClass(bytes);
    EXPECT_GE(block, bytes);
    EXPECT_LE(block - bytes, bytes / 8) << bytes;
  }
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
