// A short training run on a real GPU against the fp32 CPU oracle (label gpu, for tests/gpu/run.sh;
// every case skips itself, saying why, where there is no GPU): the model, the loop, the optimizer
// and the checkpointless step on CUDA device memory through the CUDA backend table, at fp32 and at
// bf16. Tolerance: fp32, every step's loss within 1e-3 relative (the CUDA kernels sum in another
// order than the CPU's, and routing may flip on a near tie); bf16, within 2% (and aux within 10%),
// the tolerance of the emulated bf16 run (bf16_training_test.cc says why). The run learns in both.
// Each run must also have used the table it names (the model reports "cuda" or "cuda/bf16"), and
// the bf16 run must differ from the fp32 oracle: a bf16 run that silently ran at fp32 would pass
// the tolerances, not this. And the GPU run is deterministic: two runs give the same losses and
// the same weights bit for bit (no atomics in any kernel; cuBLAS is reproducible on one device).
// With model.attention_probs recomputed (the RowStats attention kernels) the GPU run follows the
// CPU oracle with stored probabilities within the same tolerances.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "runtime/device/device.h"
#include "tests/runtime/train/short_run.h"

namespace furnace::train {
namespace {

constexpr int kSteps = 12;

// backend: the name of the table the model must have run on. must_differ: some step's loss must
// differ from the oracle's (the bf16 run rounds; the fp32 one may match it bit for bit).
void ExpectFollows(device::Precision precision, const char* backend, bool must_differ,
                   double loss_tol, double aux_tol, bool recompute_probs = false) {
  auto gpu = device::CreateCudaDevice(0);
  if (!gpu.ok() && gpu.status().code() == absl::StatusCode::kUnavailable) {
    GTEST_SKIP() << "no GPU: " << gpu.status().message();
  }
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  std::unique_ptr<device::Device> cpu = device::CreateCpuDevice();
  const absl::StatusOr<testing::ShortRun> want =
      testing::RunShort(*cpu, device::Precision::kFp32, kSteps);
  ASSERT_TRUE(want.ok()) << want.status();
  const absl::StatusOr<testing::ShortRun> got =
      testing::RunShort(**gpu, precision, kSteps, /*weight_mirror=*/true, recompute_probs);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->backend, backend);
  ASSERT_EQ(got->loss.size(), want->loss.size());
  double worst = 0;
  for (size_t s = 0; s < want->loss.size(); ++s) {
    const double rel = std::fabs(got->loss[s] - want->loss[s]) / std::fabs(want->loss[s]);
    const double rel_aux = std::fabs(got->aux[s] - want->aux[s]) / std::fabs(want->aux[s]);
    worst = std::max(worst, rel);
    EXPECT_LE(rel, loss_tol) << "step " << s << ": " << got->loss[s] << " vs " << want->loss[s];
    EXPECT_LE(rel_aux, aux_tol) << "step " << s;
  }
  EXPECT_LT(got->loss.back(), got->loss.front() - 0.1);
  if (must_differ) {
    EXPECT_GT(worst, 0.0) << "the " << got->backend
                          << " run is bit-identical to the fp32 CPU one: no bf16 arithmetic ran";
  }
  std::printf(
      "REPORT %s%s vs the fp32 CPU over %d steps: loss within %.2e relative (tolerance "
      "%.0e)\n",
      got->backend.c_str(), recompute_probs ? " (attention probs recomputed)" : "", kSteps, worst,
      loss_tol);
}

void ExpectRepeatable(device::Precision precision) {
  auto gpu = device::CreateCudaDevice(0);
  if (!gpu.ok() && gpu.status().code() == absl::StatusCode::kUnavailable) {
    GTEST_SKIP() << "no GPU: " << gpu.status().message();
  }
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  const absl::StatusOr<testing::ShortRun> first = testing::RunShort(**gpu, precision, kSteps);
  ASSERT_TRUE(first.ok()) << first.status();
  const absl::StatusOr<testing::ShortRun> second = testing::RunShort(**gpu, precision, kSteps);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(second->loss, first->loss);
  EXPECT_EQ(second->aux, first->aux);
  ASSERT_EQ(second->params.size(), first->params.size());
  size_t differ = 0;
  for (size_t i = 0; i < first->params.size(); ++i) {
    differ += std::memcmp(&first->params[i], &second->params[i], sizeof(float)) != 0;
  }
  EXPECT_EQ(differ, 0u) << "of " << first->params.size() << " weights differ between two runs";
  std::printf("REPORT %s: two runs of %d steps bit-identical (%zu weights, %zu differ)\n",
              first->backend.c_str(), kSteps, first->params.size(), differ);
}

TEST(CudaTrainingTest, Fp32FollowsTheCpu) {
  ExpectFollows(device::Precision::kFp32, "cuda", /*must_differ=*/false, 1e-3, 1e-2);
}

TEST(CudaTrainingTest, Bf16FollowsTheFp32Cpu) {
  ExpectFollows(device::Precision::kBf16, "cuda/bf16", /*must_differ=*/true, 2e-2, 1e-1);
}

TEST(CudaTrainingTest, Fp32RecomputedProbsFollowTheCpu) {
  ExpectFollows(device::Precision::kFp32, "cuda", /*must_differ=*/false, 1e-3, 1e-2,
                /*recompute_probs=*/true);
}

TEST(CudaTrainingTest, Bf16RecomputedProbsFollowTheFp32Cpu) {
  ExpectFollows(device::Precision::kBf16, "cuda/bf16", /*must_differ=*/true, 2e-2, 1e-1,
                /*recompute_probs=*/true);
}

TEST(CudaTrainingTest, Fp32RunsAreBitIdentical) { ExpectRepeatable(device::Precision::kFp32); }

TEST(CudaTrainingTest, Bf16RunsAreBitIdentical) { ExpectRepeatable(device::Precision::kBf16); }

}  // namespace
}  // namespace furnace::train
