// The static memory policies change no number (issue 10, "drop + recompute"): selective and
// full_recompute train the tiny MoE of the layout tests to bit-identical per-step losses, aux
// losses, gradient norms and final parameters as `none`, on one process and on the layouts whose
// rebuilds are the hard part: expert parallelism with expert sharding (the expert buffers are
// rebuilt by re-running the dispatch / combine all-to-all on every rank of the group together),
// and 1F1B pipelines with several micro-batches in flight (each one's dropped tensors rebuilt in
// its own backward). Each parallel case forks one process per rank (Gloo over 127.0.0.1).
#include <filesystem>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/runtime/parallel/layout_run.h"

namespace furnace::testing {
namespace {

using memory::MemoryPolicy;

struct Layout {
  const char* name;
  int pp, dp, tp, ep, esp, m;
};

LayoutCase CaseFor(const Layout& l) {
  LayoutCase c;
  c.model.vocab = 32;
  c.model.seq_len = 8;
  c.model.d_model = 16;
  c.model.heads = 4;
  c.model.layers = 4;
  c.model.moe_every = 2;  // layers 1 and 3 MoE, 0 and 2 dense
  c.model.dense_ffn = 32;
  c.model.experts = 4;
  c.model.expert_ffn = 16;
  c.model.top_k = 2;
  c.model.capacity_factor = 1.0;
  c.sizes.pp = l.pp;
  c.sizes.dp = l.dp;
  c.sizes.tp = l.tp;
  c.sizes.ep = l.ep;
  c.sizes.esp = l.esp;
  c.micro_batches = l.m;
  c.steps = 4;
  return c;
}

void ExpectIdentical(const RunResult& got, const RunResult& want) {
  EXPECT_EQ(got.loss, want.loss);
  EXPECT_EQ(got.aux_loss, want.aux_loss);
  EXPECT_EQ(got.grad_norm, want.grad_norm);
  ASSERT_EQ(got.params.size(), want.params.size());
  for (const auto& [name, ref] : want.params) {
    auto it = got.params.find(name);
    ASSERT_NE(it, got.params.end()) << name;
    ASSERT_EQ(it->second.size(), ref.size()) << name;
    for (size_t i = 0; i < ref.size(); ++i) {
      ASSERT_EQ(it->second[i], ref[i]) << name << "[" << i << "]";
    }
  }
}

class MemoryPolicyTest : public ::testing::TestWithParam<Layout> {};

TEST_P(MemoryPolicyTest, BitIdenticalToNone) {
  const Layout& layout = GetParam();
  const bool single = layout.pp * layout.dp * layout.tp == 1;
  const auto run = [&](MemoryPolicy policy) -> absl::StatusOr<RunResult> {
    LayoutCase c = CaseFor(layout);
    c.policy = policy;
    if (single) return RunSingle(c);
    const std::string dir = absl::StrCat(::testing::TempDir(), "/policy-", layout.name, "-",
                                         memory::MemoryPolicyName(policy), "-", getpid());
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
    absl::StatusOr<RunResult> r = RunLayout(c, dir);
    std::filesystem::remove_all(dir);
    return r;
  };
  absl::StatusOr<RunResult> none = run(MemoryPolicy::kNone);
  ASSERT_TRUE(none.ok()) << none.status();
  for (MemoryPolicy policy : {MemoryPolicy::kSelective, MemoryPolicy::kFullRecompute}) {
    SCOPED_TRACE(memory::MemoryPolicyName(policy));
    absl::StatusOr<RunResult> r = run(policy);
    ASSERT_TRUE(r.ok()) << r.status();
    ExpectIdentical(*r, *none);
  }
}

const Layout kLayouts[] = {
    {"single", 1, 1, 1, 1, 1, 2},           {"ep2_esp2", 1, 4, 1, 2, 2, 2},
    {"pp2_m4", 2, 1, 1, 1, 1, 4},           {"pp4_m8", 4, 1, 1, 1, 1, 8},
    {"tp2_pp2_ep2_esp2", 2, 2, 2, 2, 2, 2},
};

INSTANTIATE_TEST_SUITE_P(Layouts, MemoryPolicyTest, ::testing::ValuesIn(kLayouts),
                         [](const ::testing::TestParamInfo<Layout>& info) {
                           return std::string(info.param.name);
                         });

}  // namespace
}  // namespace furnace::testing
