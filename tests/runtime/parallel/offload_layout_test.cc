// The static offload policy on parallel layouts (one forked process per rank, Gloo): an EP layout
// and a 1F1B pipeline with micro-batches in flight train to bit-identical losses, gradient norms
// and parameters with offload as with policy none on the same layout, and every rank that holds
// experts offloads.
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/runtime/parallel/layout_run.h"

namespace furnace::testing {
namespace {

model::ModelConfig TinyModel() {
  model::ModelConfig c;
  c.vocab = 32;
  c.seq_len = 8;
  c.d_model = 16;
  c.heads = 4;
  c.layers = 4;
  c.moe_every = 2;
  c.dense_ffn = 32;
  c.experts = 4;
  c.expert_ffn = 16;
  c.top_k = 2;
  c.capacity_factor = 1.0;
  c.normalize_topk = true;
  return c;
}

struct Layout {
  const char* name;
  int pp, dp, ep, m;
};

class OffloadLayoutTest : public ::testing::TestWithParam<Layout> {};

TEST_P(OffloadLayoutTest, OffloadIsBitIdenticalToNone) {
  const Layout& l = GetParam();
  LayoutCase c;
  c.model = TinyModel();
  c.sizes.pp = l.pp;
  c.sizes.dp = l.dp;
  c.sizes.ep = l.ep;
  c.micro_batches = l.m;
  c.steps = 4;
  auto run = [&](const char* tag) -> absl::StatusOr<RunResult> {
    const std::string dir =
        absl::StrCat(::testing::TempDir(), "/offload-", l.name, "-", tag, "-", getpid());
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
    absl::StatusOr<RunResult> r = RunLayout(c, dir);
    std::filesystem::remove_all(dir);
    return r;
  };
  absl::StatusOr<RunResult> none = run("none");
  ASSERT_TRUE(none.ok()) << none.status();
  c.offload_ratio = 1.0;
  c.host_link_gbps = 0.01;  // paced: reloads may arrive late and are waited for
  absl::StatusOr<RunResult> off = run("offload");
  ASSERT_TRUE(off.ok()) << off.status();

  EXPECT_EQ(off->loss, none->loss);
  EXPECT_EQ(off->aux_loss, none->aux_loss);
  EXPECT_EQ(off->grad_norm, none->grad_norm);
  ASSERT_EQ(off->params.size(), none->params.size());
  for (const auto& [name, values] : none->params) {
    const std::vector<float>& got = off->params.at(name);
    ASSERT_EQ(got.size(), values.size()) << name;
    EXPECT_EQ(std::memcmp(got.data(), values.data(), 4 * values.size()), 0) << name;
  }
  EXPECT_EQ(off->in_flight_peak, none->in_flight_peak);
  int64_t late = 0;
  for (int rank = 0; rank < c.sizes.world(); ++rank) {
    // Every rank holds MoE layers (pp 2: one on each stage).
    EXPECT_GT(off->stash_actions[rank].offloaded_bytes, 0u) << "rank " << rank;
    EXPECT_EQ(none->stash_actions[rank].offloaded_bytes, 0u) << "rank " << rank;
    late += off->stash_actions[rank].late_reloads;
  }
  std::printf("REPORT offload %s: bit-identical over %d steps, %lld late reloads\n", l.name,
              c.steps, static_cast<long long>(late));
}

const Layout kLayouts[] = {
    {"ep2", 1, 2, 2, 2},
    {"pp2_m4", 2, 1, 1, 4},
};

INSTANTIATE_TEST_SUITE_P(Layouts, OffloadLayoutTest, ::testing::ValuesIn(kLayouts),
                         [](const ::testing::TestParamInfo<Layout>& info) {
                           return std::string(info.param.name);
                         });

}  // namespace
}  // namespace furnace::testing
