// The static memory policies change no number (issue 10, "drop + recompute"): selective and
// full_recompute train the tiny MoE of the layout tests to bit-identical per-step losses, aux
// losses, gradient norms and final parameters as `none`, on one process and on the layouts whose
// rebuilds are the hard part: expert parallelism with expert sharding (the expert buffers are
// rebuilt by re-running the dispatch / combine all-to-all on every rank of the group together),
// and 1F1B pipelines with several micro-batches in flight (each one's dropped tensors rebuilt in
// its own backward). Each parallel case forks one process per rank (Gloo over 127.0.0.1).
// The Spikes suite runs the same layouts with routing spikes (runtime/model/spikes.h) on steps 1
// and 3: the rebuilt router probabilities must carry the spike as forward's did. Each policy must
// also lower every rank's activation peak below none's (else bit-identity would prove nothing).
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "runtime/model/spikes.h"
#include "tests/runtime/parallel/layout_checks.h"

namespace furnace::testing {
namespace {

using memory::MemoryPolicy;

LayoutCase CaseFor(const Layout& l) {
  return CaseOn(l, TinyLayoutModel(/*top_k=*/2, /*capacity_factor=*/1.0), /*steps=*/4);
}

void CheckPolicies(const Layout& layout, const model::SpikeConfig& spikes) {
  const bool single = layout.pp * layout.dp * layout.tp == 1;
  const auto run = [&](MemoryPolicy policy) -> absl::StatusOr<RunResult> {
    LayoutCase c = CaseFor(layout);
    c.model.spikes = spikes;
    c.policy = policy;
    if (single) return RunSingle(c);
    return RunLayoutInTempDir(
        c, absl::StrCat("policy-", layout.name, "-", memory::MemoryPolicyName(policy),
                        spikes.enabled() ? "-spikes" : ""));
  };
  absl::StatusOr<RunResult> none = run(MemoryPolicy::kNone);
  ASSERT_TRUE(none.ok()) << none.status();
  if (spikes.enabled()) {
    EXPECT_EQ(none->routing_spike, (std::vector<bool>{false, true, false, true}));
  }
  for (MemoryPolicy policy : {MemoryPolicy::kSelective, MemoryPolicy::kFullRecompute}) {
    SCOPED_TRACE(memory::MemoryPolicyName(policy));
    absl::StatusOr<RunResult> r = run(policy);
    ASSERT_TRUE(r.ok()) << r.status();
    ExpectBitIdentical(*r, *none);
    // The policy must have acted, or the comparison above holds trivially: every rank's arena
    // peak of every step is below none's (routing is the same, the runs being bit-identical). It
    // holds on every rank of every layout here, a pipeline stage of one dense layer included: both
    // policies drop each attention's ln1.out (B T d floats) after its forward, so every point of
    // a micro-batch's run past its stage's first attention holds that much less, and the points
    // before it (the stage's first module, the first attention's forward and backward) stay
    // below the next FFN or MoE module's backward under none (its saved tensors and gradients
    // exceed the attention's backward scratch). A micro-batch in flight beside it (1F1B) holds
    // less too. The per-rank memory model (gpt_moe.h; adaptive_layout_test.cc checks it against
    // the arena) composes the peak this way.
    ASSERT_EQ(r->activation_peak.size(), none->activation_peak.size());
    for (size_t rank = 0; rank < none->activation_peak.size(); ++rank) {
      ASSERT_EQ(r->activation_peak[rank].size(), none->activation_peak[rank].size());
      for (size_t s = 0; s < none->activation_peak[rank].size(); ++s) {
        EXPECT_LT(r->activation_peak[rank][s], none->activation_peak[rank][s])
            << "rank " << rank << " step " << s << ": the policy freed nothing";
      }
    }
  }
}

class MemoryPolicyTest : public ::testing::TestWithParam<Layout> {};

TEST_P(MemoryPolicyTest, BitIdenticalToNone) { CheckPolicies(GetParam(), model::SpikeConfig{}); }

class SpikeMemoryPolicyTest : public ::testing::TestWithParam<Layout> {};

TEST_P(SpikeMemoryPolicyTest, BitIdenticalToNone) {
  model::SpikeConfig spikes;
  spikes.probability = 0.5;
  spikes.max_ratio = 2;  // experts / top_k
  spikes.seed = 164;     // spike steps 1 and 3 of 0..3
  CheckPolicies(GetParam(), spikes);
}

const Layout kLayouts[] = {
    {"single", 1, 1, 1, 1, 1, 2},           {"ep2_esp2", 1, 4, 1, 2, 2, 2},
    {"pp2_m4", 2, 1, 1, 1, 1, 4},           {"pp4_m8", 4, 1, 1, 1, 1, 8},
    {"tp2_pp2_ep2_esp2", 2, 2, 2, 2, 2, 2},
};

std::string LayoutName(const ::testing::TestParamInfo<Layout>& info) {
  return std::string(info.param.name);
}

INSTANTIATE_TEST_SUITE_P(Layouts, MemoryPolicyTest, ::testing::ValuesIn(kLayouts), LayoutName);
INSTANTIATE_TEST_SUITE_P(Spikes, SpikeMemoryPolicyTest, ::testing::ValuesIn(kLayouts), LayoutName);

}  // namespace
}  // namespace furnace::testing
