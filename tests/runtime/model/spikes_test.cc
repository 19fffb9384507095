// Routing-spike injection (runtime/model/spikes.h, MODEL.md "Routing-spike injection"):
//   * the share of spike steps is P: |share - P| <= 5 standard errors of a binomial share over
//     the steps counted (the draws are seeded, so this is a check of the generator, not a flaky
//     test);
//   * the busiest expert receives about r times the mean: forced tokens on a router whose logits
//     are i.i.d. normal (balanced in expectation), through the backend's softmax and top-k as in
//     the model, N = 32768 tokens; |busiest / mean - r| <= 5% of r for every draw (measured
//     worst below 3%: the binomial noise of the counts, plus the largest natural expert when r is
//     near 1);
//   * r varies over [1, R] and gets close to R;
//   * which tokens are forced depends on the token's global index only (any split of the global
//     batch forces the same tokens);
//   * invalid configurations name the field;
//   * on the model: spikes off (or on, on a step that is not a spike step) is bit-identical to a
//     model without spikes; a spike step routes every forced token to the spiking expert; under
//     full_recompute the rebuilt router probabilities carry the spike (bit-identical to none).
#include "runtime/model/spikes.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "model_test_util.h"
#include "runtime/device/backend.h"
#include "runtime/memory/policy.h"
#include "runtime/model/gpt_moe.h"

namespace furnace::model {
namespace {

using ::testing::HasSubstr;
using testing::RandomTokens;
using testing::TinyConfig;

SpikeConfig Spikes(double p, double r, uint64_t seed) {
  SpikeConfig s;
  s.probability = p;
  s.max_ratio = r;
  s.seed = seed;
  return s;
}

TEST(SpikesTest, ShareOfSpikeStepsIsTheProbability) {
  constexpr int kSteps = 100000;
  for (double p : {0.029, 0.3, 0.9}) {
    const SpikeConfig config = Spikes(p, 2.6, 17);
    int spikes = 0;
    for (int64_t s = 0; s < kSteps; ++s) spikes += IsSpikeStep(config, s) ? 1 : 0;
    const double share = static_cast<double>(spikes) / kSteps;
    const double sigma = std::sqrt(p * (1 - p) / kSteps);
    EXPECT_NEAR(share, p, 5 * sigma) << "P = " << p;
    std::printf("P %.3f: %d spike steps of %d, share %.4f (%.1f standard errors)\n", p, spikes,
                kSteps, share, std::fabs(share - p) / sigma);
  }
  EXPECT_FALSE(IsSpikeStep(Spikes(0, 2.6, 17), 0));
  EXPECT_FALSE(IsSpikeStep(Spikes(1, 1, 17), 0));  // max_ratio 1: off
  for (int64_t s = 0; s < 100; ++s) EXPECT_TRUE(IsSpikeStep(Spikes(1, 2, 17), s));
}

// busiest / mean of the assignments when `spike` is applied to i.i.d. normal logits (N, E).
double MeasuredRatio(const RoutingSpike& spike, int N, int E, int k, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0, 1);
  std::vector<float> logits(static_cast<size_t>(N) * E), probs(logits.size());
  for (float& x : logits) x = normal(rng);
  spike.Apply(logits.data(), N, E);
  const device::Backend& ops = device::CpuBackend();
  ops.softmax_forward(probs.data(), logits.data(), N, E);
  std::vector<int32_t> idx(static_cast<size_t>(N) * k);
  std::vector<float> gates(idx.size());
  ops.topk_forward(idx.data(), gates.data(), probs.data(), N, E, k, true);
  std::vector<int64_t> counts(E, 0);
  for (int32_t e : idx) ++counts[e];
  const double mean = static_cast<double>(N) * k / E;
  return *std::max_element(counts.begin(), counts.end()) / mean;
}

TEST(SpikesTest, BusiestExpertGetsAboutRTimesTheMean) {
  struct Case {
    int E, k;
    double R;
  };
  constexpr int kN = 32768;
  constexpr double kRelTol = 0.05;
  for (const Case& c :
       {Case{8, 1, 2.6}, Case{8, 2, 4.0}, Case{16, 2, 3.0}, Case{4, 1, 4.0}, Case{4, 2, 2.0}}) {
    const SpikeConfig config = Spikes(1.0, c.R, 5);
    double worst = 0, largest_r = 1;
    for (int step = 0; step < 12; ++step) {
      const std::optional<RoutingSpike> spike = SpikeFor(config, c.E, c.k, step, 1, 0, 64);
      ASSERT_TRUE(spike.has_value());
      ASSERT_GE(spike->expert, 0);
      ASSERT_LT(spike->expert, c.E);
      ASSERT_GE(spike->ratio, 1.0);
      ASSERT_LE(spike->ratio, c.R);
      EXPECT_DOUBLE_EQ(spike->force_probability, c.k * (spike->ratio - 1) / (c.E - c.k));
      const double measured = MeasuredRatio(*spike, kN, c.E, c.k, 100 + step);
      const double rel = std::fabs(measured - spike->ratio) / spike->ratio;
      worst = std::max(worst, rel);
      largest_r = std::max(largest_r, spike->ratio);
      EXPECT_LE(rel, kRelTol) << "E " << c.E << " k " << c.k << " R " << c.R << " step " << step
                              << ": target " << spike->ratio << ", measured " << measured;
    }
    std::printf("E %d k %d R %.1f: worst |busiest/mean - r| / r = %.4f, largest r %.3f\n", c.E, c.k,
                c.R, worst, largest_r);
  }
}

TEST(SpikesTest, RatioVariesUpToTheMaximum) {
  const SpikeConfig config = Spikes(1.0, 2.6, 9);
  double lo = 10, hi = 0;
  std::vector<int> experts(8, 0);
  for (int step = 0; step < 2000; ++step) {
    const std::optional<RoutingSpike> spike = SpikeFor(config, 8, 1, step, 3, 0, 16);
    ASSERT_TRUE(spike.has_value());
    lo = std::min(lo, spike->ratio);
    hi = std::max(hi, spike->ratio);
    ++experts[spike->expert];
  }
  EXPECT_LT(lo, 1.01);
  EXPECT_GT(hi, 2.55);
  EXPECT_LE(hi, 2.6);
  for (int e = 0; e < 8; ++e) EXPECT_GT(experts[e], 150) << "expert " << e;  // about 250 each
}

TEST(SpikesTest, ForcedTokensDependOnTheGlobalTokenIndexOnly) {
  const SpikeConfig config = Spikes(1.0, 2.0, 3);
  constexpr int T = 8;
  const std::optional<RoutingSpike> whole = SpikeFor(config, 4, 2, 6, 1, 0, T);
  ASSERT_TRUE(whole.has_value());
  int forced = 0;
  for (int first_sequence : {0, 1, 5, 12}) {
    const std::optional<RoutingSpike> part = SpikeFor(config, 4, 2, 6, 1, first_sequence, T);
    ASSERT_TRUE(part.has_value());
    EXPECT_EQ(part->expert, whole->expert);
    EXPECT_EQ(part->ratio, whole->ratio);
    for (int n = 0; n < 4 * T; ++n) {
      EXPECT_EQ(part->Forced(n), whole->Forced(int64_t{first_sequence} * T + n));
      forced += part->Forced(n) ? 1 : 0;
    }
  }
  EXPECT_GT(forced, 0);
  // Another layer or step draws afresh.
  bool differs = false;
  for (int layer = 0; layer < 8 && !differs; ++layer) {
    const std::optional<RoutingSpike> other = SpikeFor(config, 4, 2, 7, layer, 0, T);
    differs = other->expert != whole->expert || other->ratio != whole->ratio;
  }
  EXPECT_TRUE(differs);
  EXPECT_FALSE(SpikeFor(Spikes(0, 2.0, 3), 4, 2, 6, 1, 0, T).has_value());
}

TEST(SpikesTest, ApplyAddsTheBiasToForcedTokensOnly) {
  const std::optional<RoutingSpike> spike = SpikeFor(Spikes(1.0, 4.0, 1), 4, 1, 0, 0, 0, 64);
  ASSERT_TRUE(spike.has_value());
  constexpr int N = 64, E = 4;
  std::vector<float> logits(N * E, 0.5f);
  spike->Apply(logits.data(), N, E);
  int forced = 0;
  for (int n = 0; n < N; ++n) {
    for (int e = 0; e < E; ++e) {
      const bool biased = spike->Forced(n) && e == spike->expert;
      EXPECT_EQ(logits[n * E + e], biased ? 0.5f + kSpikeBias : 0.5f);
    }
    forced += spike->Forced(n) ? 1 : 0;
  }
  EXPECT_GT(forced, 0);
}

TEST(SpikesTest, InvalidConfigurationsNameTheField) {
  EXPECT_TRUE(Spikes(0, 1, 0).Validate(8, 2).ok());
  EXPECT_TRUE(Spikes(1, 4, 0).Validate(8, 2).ok());  // R = E / k: every token forced
  EXPECT_THAT(Spikes(1.5, 2, 0).Validate(8, 2).message(),
              HasSubstr("spikes.probability = 1.5 is invalid: must be in [0, 1]"));
  EXPECT_THAT(Spikes(-0.1, 2, 0).Validate(8, 2).message(), HasSubstr("spikes.probability"));
  EXPECT_THAT(Spikes(0.5, 0.5, 0).Validate(8, 2).message(),
              HasSubstr("spikes.max_ratio = 0.5 is invalid: must be >= 1"));
  EXPECT_THAT(Spikes(0.5, 4.5, 0).Validate(8, 2).message(),
              HasSubstr("spikes.max_ratio = 4.5 is invalid: must be <= experts / top_k = 8 / 2"));
  ModelConfig c = TinyConfig();
  c.spikes = Spikes(0.5, 3, 0);  // E / k = 2
  EXPECT_THAT(c.Validate().message(), HasSubstr("spikes.max_ratio"));
  c.spikes = Spikes(std::nan(""), 2, 0);
  EXPECT_THAT(c.Validate().message(), HasSubstr("spikes.probability"));
}

// The model: spikes off is bit-identical, a spike step forces its tokens.
class SpikeModelTest : public ::testing::Test {
 protected:
  struct Run {
    train::MicroBatchResult result;
    std::vector<float> grads;
    uint64_t rebuilt_bytes = 0;  // by the memory policy's recomputes
  };
  // One ForwardBackward of B = 4 at (step, first sequence); no SetStepContext when step < 0.
  Run ForwardBackward(const SpikeConfig& spikes, int64_t step, int64_t first_sequence,
                      memory::MemoryPolicy policy = memory::MemoryPolicy::kNone) {
    ModelConfig c = TinyConfig();
    c.spikes = spikes;
    tensor::DeviceArena arena(*device_, 0);
    absl::StatusOr<std::unique_ptr<GptMoe>> m = GptMoe::Create(c, 5, *device_, arena);
    EXPECT_TRUE(m.ok()) << m.status();
    EXPECT_TRUE((*m)->SetMemoryPolicy(policy).ok());
    if (step >= 0) (*m)->SetStepContext(step, first_sequence);
    const int B = 4, N = B * c.seq_len;
    const std::vector<int32_t> in = RandomTokens(N, c.vocab, 31), tg = RandomTokens(N, c.vocab, 32);
    absl::StatusOr<train::MicroBatchResult> r =
        (*m)->ForwardBackward(in.data(), tg.data(), B, 1.0 / N, 1.0);
    EXPECT_TRUE(r.ok()) << r.status();
    return {*r, std::vector<float>((*m)->grad_data(), (*m)->grad_data() + (*m)->num_params()),
            (*m)->stash().rebuilt_bytes()};
  }
  static void ExpectBitIdentical(const Run& a, const Run& b) {
    EXPECT_EQ(std::memcmp(&a.result.loss, &b.result.loss, sizeof(double)), 0);
    EXPECT_EQ(std::memcmp(&a.result.aux_loss, &b.result.aux_loss, sizeof(double)), 0);
    EXPECT_EQ(a.result.tokens_per_expert, b.result.tokens_per_expert);
    ASSERT_EQ(a.grads.size(), b.grads.size());
    EXPECT_EQ(std::memcmp(a.grads.data(), b.grads.data(), a.grads.size() * sizeof(float)), 0);
    EXPECT_FALSE(b.result.routing_spike);
  }

  std::unique_ptr<device::Device> device_ = device::CreateCpuDevice();
};

TEST_F(SpikeModelTest, SpikesOffIsBitIdentical) {
  const Run plain = ForwardBackward(SpikeConfig{}, -1, 0);
  ExpectBitIdentical(plain, ForwardBackward(SpikeConfig{}, 3, 8));
  ExpectBitIdentical(plain, ForwardBackward(Spikes(0, 2, 9), 3, 8));   // probability 0
  ExpectBitIdentical(plain, ForwardBackward(Spikes(1, 1, 9), 3, 8));   // max_ratio 1
  ExpectBitIdentical(plain, ForwardBackward(Spikes(1, 2, 9), -1, 0));  // no step yet
  // Spikes on, on a step that is not a spike step.
  const SpikeConfig half = Spikes(0.5, 2, 9);
  int64_t calm = 0;
  while (IsSpikeStep(half, calm)) ++calm;
  ExpectBitIdentical(plain, ForwardBackward(half, calm, 8));
}

TEST_F(SpikeModelTest, SpikeStepRoutesForcedTokensToTheExpert) {
  const SpikeConfig config = Spikes(1.0, 2.0, 9);  // TinyConfig: E / k = 4 / 2 = 2
  const ModelConfig c = TinyConfig();
  const int layer = 1;  // the MoE layer
  // A step whose spike forces most tokens.
  int64_t step = 0;
  while (SpikeFor(config, c.experts, c.top_k, step, layer, 8, c.seq_len)->force_probability < 0.6)
    ++step;
  const RoutingSpike spike = *SpikeFor(config, c.experts, c.top_k, step, layer, 8, c.seq_len);
  int64_t forced = 0;
  for (int n = 0; n < 4 * c.seq_len; ++n) forced += spike.Forced(n) ? 1 : 0;
  ASSERT_GT(forced, 4 * c.seq_len / 2);

  const Run plain = ForwardBackward(SpikeConfig{}, -1, 0);
  const Run spiked = ForwardBackward(config, step, 8);
  EXPECT_TRUE(spiked.result.routing_spike);
  ASSERT_EQ(spiked.result.tokens_per_expert.size(), 1u);
  // Every forced token routes to the expert (k = 2: once each), and no token twice.
  EXPECT_GE(spiked.result.tokens_per_expert[0][spike.expert], forced);
  EXPECT_LE(spiked.result.tokens_per_expert[0][spike.expert], 4 * c.seq_len);
  EXPECT_NE(spiked.result.tokens_per_expert, plain.result.tokens_per_expert);
  EXPECT_NE(spiked.result.loss, plain.result.loss);
  std::printf("spike on expert %d, r %.3f: %lld of %d tokens forced, expert tokens %lld -> %lld\n",
              spike.expert, spike.ratio, static_cast<long long>(forced), 4 * c.seq_len,
              static_cast<long long>(plain.result.tokens_per_expert[0][spike.expert]),
              static_cast<long long>(spiked.result.tokens_per_expert[0][spike.expert]));
}

// full_recompute drops the router probabilities and rebuilds them in backward: the rebuild adds
// the same spike, so the step is bit-identical to keeping them.
TEST_F(SpikeModelTest, RecomputedRouterProbsCarryTheSpike) {
  const SpikeConfig config = Spikes(1.0, 2.0, 9);
  const Run kept = ForwardBackward(config, 2, 4);
  const Run rebuilt = ForwardBackward(config, 2, 4, memory::MemoryPolicy::kFullRecompute);
  EXPECT_TRUE(kept.result.routing_spike);
  EXPECT_EQ(kept.rebuilt_bytes, 0u);
  EXPECT_GT(rebuilt.rebuilt_bytes, 0u);
  EXPECT_EQ(std::memcmp(&kept.result.loss, &rebuilt.result.loss, sizeof(double)), 0);
  EXPECT_EQ(std::memcmp(&kept.result.aux_loss, &rebuilt.result.aux_loss, sizeof(double)), 0);
  EXPECT_EQ(kept.result.tokens_per_expert, rebuilt.result.tokens_per_expert);
  ASSERT_EQ(kept.grads.size(), rebuilt.grads.size());
  EXPECT_EQ(std::memcmp(kept.grads.data(), rebuilt.grads.data(), kept.grads.size() * sizeof(float)),
            0);
  // And the spike mattered to those gradients.
  const Run plain = ForwardBackward(SpikeConfig{}, 2, 4);
  EXPECT_NE(std::memcmp(kept.grads.data(), plain.grads.data(), kept.grads.size() * sizeof(float)),
            0);
}

}  // namespace
}  // namespace furnace::model
