// The model computes with its device's backend: on the CPU device it is created, on a CUDA device
// Create refuses with a status naming the device: BackendFor's where the build has no CUDA table,
// the model's own (it runs on the CPU device only, for now) where it has one.
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "model_test_util.h"
#include "runtime/device/backend.h"
#include "runtime/device/device.h"
#include "runtime/device/emulated_device.h"
#include "runtime/model/gpt_moe.h"
#include "runtime/tensor/arena.h"
#include "tests/runtime/device/fake_device.h"

namespace furnace::model {
namespace {

TEST(BackendChoiceTest, CpuDeviceIsAccepted) {
  std::unique_ptr<device::Device> cpu = device::CreateCpuDevice();
  tensor::DeviceArena arena(*cpu, 0);
  auto model = GptMoe::Create(testing::TinyConfig(), 1, *cpu, arena);
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ(&(*model)->backend(), &device::CpuBackend());
}

TEST(BackendChoiceTest, DeviceWithoutBackendIsRefused) {
  device::testing_util::FakeDevice gpu(device::Kind::kCuda, "cuda:0");
  tensor::DeviceArena arena(gpu, 0);
  auto model = GptMoe::Create(testing::TinyConfig(), 1, gpu, arena);
  ASSERT_FALSE(model.ok());
  // Either way the device cannot be used as it is: no table in this build, or (a CUDA build) the
  // fake device has no memory.
  EXPECT_EQ(model.status().code(), absl::StatusCode::kFailedPrecondition);
  const std::string message(model.status().message());
  EXPECT_NE(message.find("device 'cuda:0'"), std::string::npos) << message;
  if (device::BackendFor(device::Kind::kCuda).ok()) {
    // A CUDA build has the CUDA table: the fake device (which has no memory) is refused where the
    // parameters are allocated, and the message says so.
    EXPECT_NE(message.find("allocating"), std::string::npos) << message;
    EXPECT_NE(message.find("for the parameters"), std::string::npos) << message;
  } else {
    EXPECT_NE(message.find("no backend for device kind 'cuda'"), std::string::npos) << message;
  }
}

// The emulated device has a backend and the model runs on it (its parameters, gradients and
// activations in the device's memory): Create takes it with the emulated table.
TEST(BackendChoiceTest, EmulatedDeviceRunsTheEmulatedBackend) {
  auto emulated = device::CreateEmulatedDevice({.memory_bytes = 1 << 24});
  ASSERT_TRUE(emulated.ok()) << emulated.status();
  tensor::DeviceArena arena(**emulated, 0);
  auto model = GptMoe::Create(testing::TinyConfig(), 1, **emulated, arena);
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ(&(*model)->backend(), &device::EmulatedBackend());
  EXPECT_EQ(&(*model)->device(), emulated->get());
  EXPECT_TRUE((*emulated)->Owns((*model)->param_data(), 4 * (*model)->num_params()));
  EXPECT_TRUE((*emulated)->Owns((*model)->grad_data(), 4 * (*model)->num_params()));
}

// model.precision bf16 on the CPU device: refused with BackendFor's message (the CPU trains in
// fp32), which names the device.
TEST(BackendChoiceTest, Bf16OnTheCpuIsRefused) {
  std::unique_ptr<device::Device> cpu = device::CreateCpuDevice();
  tensor::DeviceArena arena(*cpu, 0);
  auto model =
      GptMoe::Create(testing::TinyConfig(), 1, *cpu, arena, {}, {}, device::Precision::kBf16);
  ASSERT_FALSE(model.ok());
  EXPECT_EQ(model.status().code(), absl::StatusCode::kInvalidArgument);
  const std::string message(model.status().message());
  EXPECT_NE(message.find("device 'cpu'"), std::string::npos) << message;
  EXPECT_NE(message.find("the CPU trains in fp32"), std::string::npos) << message;
}

}  // namespace
}  // namespace furnace::model
