// The MoE router runs in fp32 whatever the model's precision (MODEL.md: p = softmax(u @ Wg) in
// fp32): under the bf16 table its probabilities are those of the fp32 table, bit for bit, and not
// those a bf16 GEMM gives (the inputs carry mantissa bits bf16 drops, so the two differ).
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <vector>

#include "runtime/device/backend.h"
#include "runtime/device/emulated_device.h"
#include "runtime/model/module.h"
#include "runtime/model/moe_block.h"
#include "runtime/model/stash.h"
#include "runtime/tensor/arena.h"
#include "runtime/tensor/transfer.h"

namespace furnace::model {
namespace {

constexpr int kN = 16, kC = 24, kE = 8;

// (N, E) probabilities of u @ w on `ops`, computed on the device.
std::vector<float> ProbsOn(const device::Backend& ops, device::EmulatedDevice& dev,
                           tensor::DeviceArena& arena, const float* u, const float* w) {
  auto logits = arena.Allocate(4 * kN * kE, "logits");
  auto probs = arena.Allocate(4 * kN * kE, "probs");
  EXPECT_TRUE(logits.ok() && probs.ok());
  ops.matmul_forward(logits->as<float>(), u, w, nullptr, kN, kC, kE);
  ops.softmax_forward(probs->as<float>(), logits->as<float>(), kN, kE);
  std::vector<float> out(kN * kE);
  EXPECT_TRUE(tensor::CopyToHost(dev, out.data(), probs->data(), out.size() * 4).ok());
  return out;
}

TEST(RouterPrecisionTest, TheRouterRunsInFp32UnderTheBf16Table) {
  auto dev = device::CreateEmulatedDevice({.memory_bytes = 1 << 22});
  ASSERT_TRUE(dev.ok()) << dev.status();
  tensor::DeviceArena arena(**dev, 0);
  Stash stash(device::Kind::kEmulated);
  std::vector<float> u(kN * kC), w(kC * kE);
  for (size_t i = 0; i < u.size(); ++i) u[i] = std::sin(0.37f * i + 0.11f) * (1.0f + 1e-3f * i);
  for (size_t i = 0; i < w.size(); ++i) w[i] = std::cos(0.23f * i) * 0.5f + 1e-4f * i;
  auto du = arena.Allocate(4 * u.size(), "u");
  auto dw = arena.Allocate(4 * w.size(), "w");
  ASSERT_TRUE(du.ok() && dw.ok());
  ASSERT_TRUE(tensor::CopyToDevice(**dev, du->data(), u.data(), 4 * u.size()).ok());
  ASSERT_TRUE(tensor::CopyToDevice(**dev, dw->data(), w.data(), 4 * w.size()).ok());

  const device::Backend& bf16 = device::EmulatedBf16Backend();
  ASSERT_EQ(bf16.precision, device::Precision::kBf16);
  ModuleContext ctx{bf16, arena, stash};
  const RouterInputs router{dw->as<float>(), kN, kC, kE, "layers.0.", std::nullopt};
  auto probs = RouterForward(ctx, router, du->as<float>());
  ASSERT_TRUE(probs.ok()) << probs.status();
  std::vector<float> got(kN * kE);
  ASSERT_TRUE(tensor::CopyToHost(**dev, got.data(), probs->data(), got.size() * 4).ok());

  const std::vector<float> fp32 =
      ProbsOn(device::EmulatedBackend(), **dev, arena, du->as<float>(), dw->as<float>());
  const std::vector<float> rounded = ProbsOn(bf16, **dev, arena, du->as<float>(), dw->as<float>());
  EXPECT_EQ(got, fp32);
  EXPECT_NE(got, rounded) << "the inputs do not tell a bf16 GEMM from an fp32 one";
}

}  // namespace
}  // namespace furnace::model
