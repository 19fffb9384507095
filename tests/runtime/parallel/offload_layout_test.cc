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
#include "tests/runtime/parallel/layout_checks.h"

namespace furnace::testing {
namespace {

struct Layout {
  const char* name;
  int pp, dp, ep, m;
};

class OffloadLayoutTest : public ::testing::TestWithParam<Layout> {};

TEST_P(OffloadLayoutTest, OffloadIsBitIdenticalToNone) {
  const Layout& l = GetParam();
  LayoutCase c;
  c.model = TinyLayoutModel(/*top_k=*/2, /*capacity_factor=*/1.0);
  c.sizes.pp = l.pp;
  c.sizes.dp = l.dp;
  c.sizes.ep = l.ep;
  c.micro_batches = l.m;
  c.steps = 4;
  auto run = [&](const char* tag) {
    return RunLayoutInTempDir(c, absl::StrCat("offload-", l.name, "-", tag));
  };
  absl::StatusOr<RunResult> none = run("none");
  ASSERT_TRUE(none.ok()) << none.status();
  c.offload_ratio = 1.0;
  c.host_link_gbps = 0.01;  // paced: reloads may arrive late and are waited for
  absl::StatusOr<RunResult> off = run("offload");
  ASSERT_TRUE(off.ok()) << off.status();

  ExpectBitIdentical(*off, *none);
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
