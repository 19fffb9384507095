#include "worker/device_probe.h"

#include "gtest/gtest.h"

namespace furnace::worker {
namespace {

TEST(DeviceProbeTest, CpuOffersHostMemory) {
  auto info = ProbeDevice("cpu", 0);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->kind, "cpu");
  EXPECT_GT(info->memory, 64ull << 20);
}

TEST(DeviceProbeTest, AutoPicksWhatIsThere) {
  auto info = ProbeDevice("auto", 0);
  ASSERT_TRUE(info.ok()) << info.status();
  const bool gpu = ProbeCudaDevice(0).ok();
  EXPECT_EQ(info->kind, gpu ? "cuda" : "cpu");
  EXPECT_GT(info->memory, 0u);
}

TEST(DeviceProbeTest, CudaWithoutGpuIsAClearError) {
  auto info = ProbeDevice("cuda", 4096);  // no machine has a GPU number 4096
  ASSERT_FALSE(info.ok());
  EXPECT_EQ(info.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_FALSE(info.status().message().empty());
}

TEST(DeviceProbeTest, UnknownKindNamesTheAllowedOnes) {
  auto info = ProbeDevice("tpu", 0);
  ASSERT_FALSE(info.ok());
  EXPECT_NE(info.status().message().find("allowed: cpu, cuda, emulated, auto"),
            absl::string_view::npos);
}

// An emulated slot offers the emulated discrete device, sized by default (--device-memory
// overrides it in the agent).
TEST(DeviceProbeTest, EmulatedOffersAnEmulatedDevice) {
  auto info = ProbeDevice("emulated", 3);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->kind, "emulated");
  EXPECT_EQ(info->name, "emulated:3");
  EXPECT_EQ(info->memory, kEmulatedDeviceMemory);
}

}  // namespace
}  // namespace furnace::worker
