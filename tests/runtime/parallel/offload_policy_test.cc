// Stash actions in whole training runs, single process (the layouts are in
// offload_layout_test.cc):
//   * the static offload policy trains to bit-identical losses, gradient norms and parameters as
//     policy none, unpaced and paced to a slow host link (reloads then arrive late and are waited
//     for), and offloads exactly its share of the expert buffers;
//   * reduced-precision storage of the whitelisted expert buffers (runtime/memory/codec.h) keeps a
//     50-step run on the Markov chain within a stated margin of policy none: the mean loss of the
//     last 10 steps within 0.2% (bf16) and 0.5% (fp8 e4m3), every step's loss within 1% / 2%.
//     Measured: last-10 mean 6.3e-5 (bf16) and 8.8e-5 (fp8) relative, worst step 2.0e-3 / 2.2e-3;
//   * the adaptive policy acts only when a micro-batch is short, stays under the budget and trains
//     bit-identically to none.
#include <cmath>
#include <cstdio>
#include <cstring>

#include "gtest/gtest.h"
#include "tests/runtime/parallel/layout_checks.h"

namespace furnace::testing {
namespace {

TEST(OffloadPolicyTest, OffloadTrainsBitIdenticallyToNone) {
  LayoutCase c;
  c.model = TinyLayoutModel(/*top_k=*/2, /*capacity_factor=*/0);  // dropless
  c.steps = 5;
  absl::StatusOr<RunResult> none = RunSingle(c);
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_EQ(none->stash_actions[0].offloaded_bytes, 0u);

  // Per MoE layer and micro-batch: R = N k = 2 * 8 * 2 = 32 rows; expert input, pre, hidden and
  // output are 32 x 16 floats each, 2 KiB. 2 MoE layers x 2 micro-batches x 5 steps = 20 of them.
  struct Case {
    double ratio, gbps;
    uint64_t offloaded;
  };
  for (const Case& k : {Case{1.0, 0, 20 * 8192}, Case{0.5, 0, 20 * 4096}, Case{0.3, 0, 20 * 2048},
                        Case{1.0, 0.02, 20 * 8192}}) {
    c.offload_ratio = k.ratio;
    c.host_link_gbps = k.gbps;  // 20 MB/s: 0.1 ms per buffer, slower than the compute
    absl::StatusOr<RunResult> off = RunSingle(c);
    ASSERT_TRUE(off.ok()) << off.status();
    SCOPED_TRACE(::testing::Message() << "ratio " << k.ratio << " link " << k.gbps);
    ExpectBitIdentical(*off, *none);
    const model::StashActionStats& st = off->stash_actions[0];
    EXPECT_EQ(st.offloaded_bytes, k.offloaded);
    EXPECT_LE(st.reloaded_bytes, st.offloaded_bytes);
    std::printf(
        "REPORT offload ratio %.1f link %g GB/s: %llu bytes offloaded, %llu reloaded, "
        "%lld late reloads\n",
        k.ratio, k.gbps, static_cast<unsigned long long>(st.offloaded_bytes),
        static_cast<unsigned long long>(st.reloaded_bytes),
        static_cast<long long>(st.late_reloads));
  }
}

double MeanTail(const std::vector<double>& v, size_t n) {
  double sum = 0;
  for (size_t i = v.size() - n; i < v.size(); ++i) sum += v[i];
  return sum / static_cast<double>(n);
}

TEST(OffloadPolicyTest, CompressedExpertBuffersStayNearNoneOverAMarkovRun) {
  LayoutCase c;
  c.model = TinyLayoutModel(/*top_k=*/2, /*capacity_factor=*/0);  // dropless
  c.steps = 50;
  absl::StatusOr<RunResult> none = RunSingle(c);
  ASSERT_TRUE(none.ok()) << none.status();
  struct Case {
    memory::Codec codec;
    double tail_margin, step_margin;
  };
  for (const Case& k :
       {Case{memory::Codec::kBf16, 0.002, 0.01}, Case{memory::Codec::kFp8E4M3, 0.005, 0.02}}) {
    c.compress = k.codec;
    absl::StatusOr<RunResult> run = RunSingle(c);
    ASSERT_TRUE(run.ok()) << run.status();
    SCOPED_TRACE(memory::CodecName(k.codec));
    ASSERT_EQ(run->loss.size(), none->loss.size());
    EXPECT_GT(run->stash_actions[0].compressed_bytes, 0u);
    EXPECT_NE(run->loss, none->loss);  // lossy: the runs do differ
    double worst_step = 0;
    for (size_t s = 0; s < none->loss.size(); ++s) {
      const double rel = std::fabs(run->loss[s] - none->loss[s]) / none->loss[s];
      worst_step = std::max(worst_step, rel);
      EXPECT_LE(rel, k.step_margin) << "step " << s;
    }
    const double tail =
        std::fabs(MeanTail(run->loss, 10) - MeanTail(none->loss, 10)) / MeanTail(none->loss, 10);
    EXPECT_LE(tail, k.tail_margin);
    EXPECT_LT(MeanTail(run->loss, 10), run->loss[0]);  // it still learns
    std::printf(
        "REPORT compress %s: last-10 mean loss %.5f vs none %.5f (rel %.2e), worst step "
        "rel %.2e, %llu bytes compressed\n",
        memory::CodecName(k.codec), MeanTail(run->loss, 10), MeanTail(none->loss, 10), tail,
        worst_step, static_cast<unsigned long long>(run->stash_actions[0].compressed_bytes));
  }
}

}  // namespace
}  // namespace furnace::testing

namespace furnace::testing {
namespace {

// The adaptive policy in one process, where dropless routing gives every micro-batch the same
// bytes: under a budget every micro-batch lacks, it acts on every micro-batch, stays under the
// budget and trains bit-identically to none (offload and recompute only); under a budget that
// fits (with its 2% margin) it never acts and changes nothing.
TEST(AdaptivePolicyTest, ActsOnlyWhenShortAndStaysBitIdentical) {
  LayoutCase c;
  c.model = TinyLayoutModel(/*top_k=*/2, /*capacity_factor=*/0);
  c.steps = 4;
  absl::StatusOr<RunResult> none = RunSingle(c);
  ASSERT_TRUE(none.ok()) << none.status();
  const int64_t peak = none->activation_peak[0][0];
  for (int s = 0; s < c.steps; ++s) {
    ASSERT_EQ(none->activation_peak[0][s], peak) << "dropless: the same bytes every step";
    EXPECT_EQ(none->predicted_peak[0][s], peak) << "the memory model is exact on one rank";
  }

  c.policy = memory::MemoryPolicy::kAdaptive;
  c.device_budget = static_cast<uint64_t>(peak / 0.98) + 64;
  absl::StatusOr<RunResult> roomy = RunSingle(c);
  ASSERT_TRUE(roomy.ok()) << roomy.status();
  ExpectBitIdentical(*roomy, *none);
  for (int s = 0; s < c.steps; ++s) {
    EXPECT_EQ(roomy->planner_decisions[0][s], 0) << "step " << s;
    EXPECT_EQ(roomy->activation_peak[0][s], peak) << "step " << s;
  }

  for (double share : {0.9, 0.8}) {
    c.device_budget = static_cast<uint64_t>(share * peak);
    {
      LayoutCase tight_none = c;
      tight_none.policy = memory::MemoryPolicy::kNone;
      // The arena refuses the allocation past its budget (BudgetedPool: ResourceExhausted).
      const absl::StatusOr<RunResult> refused = RunSingle(tight_none);
      EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted)
          << "none at " << share << " of its peak: " << refused.status();
    }
    absl::StatusOr<RunResult> tight = RunSingle(c);
    ASSERT_TRUE(tight.ok()) << share << ": " << tight.status();
    ExpectBitIdentical(*tight, *none);
    for (int s = 0; s < c.steps; ++s) {
      EXPECT_LE(tight->activation_peak[0][s], static_cast<int64_t>(c.device_budget));
      // Two micro-batches a step, each one short.
      EXPECT_GE(tight->planner_decisions[0][s], 2) << share << " step " << s;
    }
    std::printf(
        "REPORT adaptive single process, budget %.0f%% of none's peak (%lld B): peak %lld B, "
        "%lld decisions in step 0, %lld emergency offloads, %llu B offloaded and reloaded\n",
        100 * share, static_cast<long long>(peak),
        static_cast<long long>(tight->activation_peak[0][0]),
        static_cast<long long>(tight->planner_decisions[0][0]),
        static_cast<long long>(tight->emergency_offloads[0][0]),
        static_cast<unsigned long long>(tight->stash_actions[0].offloaded_bytes));
  }
}

}  // namespace
}  // namespace furnace::testing
