// Full-model finite differences in float on the tiny config, for a sample of elements of EVERY
// parameter, dropless and with capacity 1.0 (which drops tokens here).
//
// Objective: J = ce_scale * sum of token CE + aux_scale * aux with ce_scale = 1 / (B T),
// aux_scale = 1, i.e. what ForwardBackward differentiates. Central differences with eps = 1e-2 on
// parameters rescaled to std ~0.3 (so routing is decisive and gradients are not tiny).
// Tolerance: |fd - analytic| <= 1e-4 + 2e-2 * max(|fd|, |analytic|). Routing is piecewise
// constant: an element whose +-eps evaluations route differently from the base is skipped (and
// counted; at most a few per run).
// A third case runs on a routing-spike step (spikes.h): the spike's logit bias is a constant, so
// the same finite differences hold with most tokens forced onto one expert.
#include <algorithm>
#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "model_test_util.h"
#include "runtime/model/gpt_moe.h"
#include "runtime/model/spikes.h"

namespace furnace::model {
namespace {

using testing::RandomTokens;
using testing::TinyConfig;

constexpr double kEps = 1e-2;
constexpr double kAbsTol = 1e-4;
constexpr double kRelTol = 2e-2;

// Larger, seeded parameter values than the init: decisive routing, visible gradients.
void Randomize(GptMoe& m, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> n(0, 1);
  for (const train::ParamInfo& p : m.params()) {
    const bool ln_weight =
        p.name.ends_with("ln1.weight") || p.name.ends_with("ln2.weight") || p.name == "lnf.weight";
    float* x = m.param_data() + p.offset;
    for (int64_t i = 0; i < p.numel(); ++i) {
      if (ln_weight) {
        x[i] = 1.0f + 0.1f * n(rng);
      } else if (p.shape.size() == 2) {
        x[i] = (p.name.ends_with("router") ? 0.5f : 0.3f) * n(rng);
      } else {
        x[i] = 0.1f * n(rng);
      }
    }
  }
}

struct Eval {
  double objective;
  std::vector<std::vector<int64_t>> routed;
  int64_t dropped;
};

Eval Evaluate(GptMoe& m, const std::vector<int32_t>& in, const std::vector<int32_t>& tg, int B) {
  absl::StatusOr<train::MicroBatchResult> r = m.Evaluate(in.data(), tg.data(), B);
  EXPECT_TRUE(r.ok()) << r.status();
  return {r->loss + r->aux_loss, r->tokens_per_expert, r->dropped};
}

// spikes: when given, every evaluation runs on a spike step whose spike forces most tokens.
void GradCheck(double capacity_factor, bool expect_drops, const SpikeConfig* spikes = nullptr) {
  std::unique_ptr<device::Device> device = device::CreateCpuDevice();
  tensor::DeviceArena arena(*device, 0);
  ModelConfig c = TinyConfig(capacity_factor);
  if (spikes != nullptr) c.spikes = *spikes;
  absl::StatusOr<std::unique_ptr<GptMoe>> made = GptMoe::Create(c, 7, *device, arena);
  ASSERT_TRUE(made.ok()) << made.status();
  GptMoe& m = **made;
  Randomize(m, 11);
  if (spikes != nullptr) {
    int64_t step = 0;
    while (SpikeFor(*spikes, c.experts, c.top_k, step, 1, 0, c.seq_len)->force_probability < 0.6)
      ++step;
    m.SetStepContext(step, 0);
  }
  const int B = 2, N = B * c.seq_len;
  const std::vector<int32_t> in = RandomTokens(N, c.vocab, 1), tg = RandomTokens(N, c.vocab, 2);

  m.ZeroGrad();
  absl::StatusOr<train::MicroBatchResult> r =
      m.ForwardBackward(in.data(), tg.data(), B, 1.0 / N, 1.0);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(std::isfinite(r->loss));
  EXPECT_EQ(r->routing_spike, spikes != nullptr);
  EXPECT_GT(r->aux_loss, 0);
  if (expect_drops) {
    EXPECT_GT(r->dropped, 0);
  } else {
    EXPECT_EQ(r->dropped, 0);
  }
  const Eval base = Evaluate(m, in, tg, B);
  EXPECT_NEAR(base.objective, r->loss + r->aux_loss, 1e-9);
  const std::vector<float> grad(m.grad_data(), m.grad_data() + m.num_params());

  std::mt19937 rng(3);
  int checked = 0, skipped = 0;
  double worst = 0;
  for (const train::ParamInfo& p : m.params()) {
    std::vector<int64_t> idx = {0, p.numel() - 1};
    std::uniform_int_distribution<int64_t> pick(0, p.numel() - 1);
    for (int s = 0; s < 4; ++s) idx.push_back(pick(rng));
    for (int64_t i : idx) {
      float* x = m.param_data() + p.offset + i;
      const float saved = *x;
      *x = static_cast<float>(saved + kEps);
      const Eval plus = Evaluate(m, in, tg, B);
      *x = static_cast<float>(saved - kEps);
      const Eval minus = Evaluate(m, in, tg, B);
      *x = saved;
      if (plus.routed != base.routed || minus.routed != base.routed ||
          plus.dropped != base.dropped || minus.dropped != base.dropped) {
        ++skipped;
        continue;
      }
      const double fd = (plus.objective - minus.objective) / (2 * kEps);
      const double an = grad[p.offset + i];
      const double err = std::abs(fd - an);
      const double tol = kAbsTol + kRelTol * std::max(std::abs(fd), std::abs(an));
      worst = std::max(worst, err / tol);
      EXPECT_LE(err, tol) << p.name << "[" << i << "] fd " << fd << " analytic " << an;
      ++checked;
    }
  }
  EXPECT_LE(skipped, 6);
  EXPECT_GT(checked, 6 * static_cast<int>(m.params().size()) - 6);
  std::printf(
      "capacity_factor %.1f: %d elements checked, %d skipped (routing changed), worst "
      "error / tolerance %.3f\n",
      capacity_factor, checked, skipped, worst);
}

TEST(GradCheckTest, Dropless) { GradCheck(0.0, false); }
TEST(GradCheckTest, CapacityOneDrops) { GradCheck(1.0, true); }
TEST(GradCheckTest, RoutingSpikeStep) {
  SpikeConfig spikes;
  spikes.probability = 1;
  spikes.max_ratio = 2;  // TinyConfig: experts / top_k = 4 / 2
  spikes.seed = 4;
  GradCheck(0.0, false, &spikes);
}

}  // namespace
}  // namespace furnace::model
