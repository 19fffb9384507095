// model.precision bf16 on the emulated device against the fp32 CPU oracle, for a whole short
// training run (issue 13, item 2): the same model, data and loop, the emulated device's bf16 table
// (its GEMMs with bf16 operands, fp32 accumulation and fp32 results; everything else fp32) against
// the CPU's fp32 table.
//
// Tolerance (stated, MODEL.md precision note): every step's loss within 2% of the fp32 run's
// (relative), every step's aux loss within 10% (it is a product of routing fractions, and a token
// whose top-2 choice flips between near-equal gates moves it by 1/(kN) at once), and the run
// learns (the last loss below the first by at least 0.1 nats). bf16 keeps 8 significant bits, so
// each GEMM operand is off by at most 2^-9 relative and, accumulated in fp32, a product by about
// 2^-8; routing flips (capacity drops, near top-k ties) are what widen the gap over a run.
// Measured with the emulated bf16 table (`ctest -R Bf16TrainingTest -V` prints it): loss within
// 7.8e-4 relative, aux within 5.3e-3, over these 12 steps (the fp32 run's loss 4.1536 -> 3.7233).
// The run must also differ from the fp32 one: a bf16 table that did not round would pass the
// tolerances, not this.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "runtime/device/emulated_device.h"
#include "tests/runtime/train/short_run.h"

namespace furnace::train {
namespace {

constexpr int kSteps = 12;
constexpr double kLossTol = 2e-2;  // relative, per step
constexpr double kAuxTol = 1e-1;   // relative, per step

TEST(Bf16TrainingTest, Bf16OnTheEmulatedDeviceFollowsTheFp32Cpu) {
  std::unique_ptr<device::Device> cpu = device::CreateCpuDevice();
  const absl::StatusOr<testing::ShortRun> want =
      testing::RunShort(*cpu, device::Precision::kFp32, kSteps);
  ASSERT_TRUE(want.ok()) << want.status();
  auto emulated = device::CreateEmulatedDevice({.memory_bytes = size_t{256} << 20});
  ASSERT_TRUE(emulated.ok()) << emulated.status();
  const absl::StatusOr<testing::ShortRun> got =
      testing::RunShort(**emulated, device::Precision::kBf16, kSteps);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->backend, "emulated/bf16");
  ASSERT_EQ(got->loss.size(), want->loss.size());
  double worst = 0, worst_aux = 0;
  for (size_t s = 0; s < want->loss.size(); ++s) {
    const double rel = std::fabs(got->loss[s] - want->loss[s]) / std::fabs(want->loss[s]);
    const double rel_aux = std::fabs(got->aux[s] - want->aux[s]) / std::fabs(want->aux[s]);
    worst = std::max(worst, rel);
    worst_aux = std::max(worst_aux, rel_aux);
    EXPECT_LE(rel, kLossTol) << "step " << s << ": " << got->loss[s] << " vs " << want->loss[s];
    EXPECT_LE(rel_aux, kAuxTol) << "step " << s << ": " << got->aux[s] << " vs " << want->aux[s];
  }
  EXPECT_LT(got->loss.back(), got->loss.front() - 0.1);
  EXPECT_GT(worst, 0.0) << "the bf16 run is bit-identical to the fp32 one: no bf16 arithmetic ran";
  std::printf(
      "REPORT bf16 vs fp32 over %d steps: loss within %.2e relative (tolerance %.0e), aux "
      "within %.2e (tolerance %.0e); loss %.4f -> %.4f (fp32 %.4f -> %.4f)\n",
      kSteps, worst, kLossTol, worst_aux, kAuxTol, got->loss.front(), got->loss.back(),
      want->loss.front(), want->loss.back());
}

// The bf16 weight mirror (runtime/device/weight_mirror.h) spares the GEMMs rounding their weights
// per call; it must change nothing: the same run with the mirror switched off gives the same losses
// and parameters bit for bit. A mirror not re-rounded after an optimizer update would differ from
// the second step on.
TEST(Bf16TrainingTest, TheWeightMirrorChangesNothing) {
  auto emulated = device::CreateEmulatedDevice({.memory_bytes = size_t{256} << 20});
  ASSERT_TRUE(emulated.ok()) << emulated.status();
  const absl::StatusOr<testing::ShortRun> mirrored =
      testing::RunShort(**emulated, device::Precision::kBf16, 6, /*weight_mirror=*/true);
  ASSERT_TRUE(mirrored.ok()) << mirrored.status();
  const absl::StatusOr<testing::ShortRun> per_call =
      testing::RunShort(**emulated, device::Precision::kBf16, 6, /*weight_mirror=*/false);
  ASSERT_TRUE(per_call.ok()) << per_call.status();
  EXPECT_EQ(mirrored->loss, per_call->loss);
  EXPECT_EQ(mirrored->aux, per_call->aux);
  ASSERT_EQ(mirrored->params.size(), per_call->params.size());
  EXPECT_EQ(0, std::memcmp(mirrored->params.data(), per_call->params.data(),
                           4 * mirrored->params.size()));
}

// model.attention_probs recomputed at bf16: the bf16 RowStats pair rebuilds the forward's fp32
// probabilities and rounds them as the stored pair does, so a whole bf16 run is the stored one's
// bit for bit (the CUDA kernels then differ from it only in the order of their sums).
TEST(Bf16TrainingTest, RecomputedAttentionProbsChangeNothing) {
  auto emulated = device::CreateEmulatedDevice({.memory_bytes = size_t{256} << 20});
  ASSERT_TRUE(emulated.ok()) << emulated.status();
  const absl::StatusOr<testing::ShortRun> stored =
      testing::RunShort(**emulated, device::Precision::kBf16, 6);
  ASSERT_TRUE(stored.ok()) << stored.status();
  const absl::StatusOr<testing::ShortRun> recomputed = testing::RunShort(
      **emulated, device::Precision::kBf16, 6, /*weight_mirror=*/true, /*recompute_probs=*/true);
  ASSERT_TRUE(recomputed.ok()) << recomputed.status();
  EXPECT_EQ(recomputed->loss, stored->loss);
  EXPECT_EQ(recomputed->aux, stored->aux);
  ASSERT_EQ(recomputed->params.size(), stored->params.size());
  EXPECT_EQ(
      0, std::memcmp(recomputed->params.data(), stored->params.data(), 4 * stored->params.size()));
}

}  // namespace
}  // namespace furnace::train
