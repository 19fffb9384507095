// Held-out evaluation (runtime/train/held_out_eval.h) on parallel layouts, forked ranks over
// Gloo: the held-out loss is the single process's on every layout (before training, on the same
// parameters, and after each evaluated step), every rank reports the same number, and a run with
// evaluation trains bit for bit as one without.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#include "gtest/gtest.h"
#include "tests/runtime/parallel/layout_checks.h"

namespace furnace::testing {
namespace {

// 5 held-out batches: not a multiple of dp 2, so one data-parallel rank repeats a batch that is
// not counted in the last round.
LayoutCase EvalCase(const Layout& l) {
  LayoutCase c = CaseOn(l, TinyLayoutModel(/*top_k=*/2, /*capacity_factor=*/0), /*steps=*/3);
  c.eval_every = 2;
  c.eval_batches = 5;
  return c;
}

class EvalLayoutTest : public ::testing::TestWithParam<Layout> {};

TEST_P(EvalLayoutTest, EvalLossIsTheSingleProcessOne) {
  const Layout& layout = GetParam();
  const LayoutCase c = EvalCase(layout);
  absl::StatusOr<RunResult> single = RunSingle(c);
  ASSERT_TRUE(single.ok()) << single.status();
  absl::StatusOr<RunResult> parallel = RunLayoutInTempDir(c, std::string("eval-") + layout.name);
  ASSERT_TRUE(parallel.ok()) << parallel.status();
  // Before training, after step 2 and after step 3 (the last).
  ASSERT_EQ(single->eval_loss.size(), 3u);
  ASSERT_EQ(parallel->eval_loss.size(), 3u);
  // The initial parameters are the same on every layout; the losses differ by fp32 round-off of
  // the layout's sums (tensor-parallel partial products, expert exchange) only.
  double worst = 0;
  for (size_t i = 0; i < single->eval_loss.size(); ++i) {
    const double rel =
        std::fabs(parallel->eval_loss[i] - single->eval_loss[i]) / single->eval_loss[i];
    worst = std::max(worst, rel);
    EXPECT_LE(rel, 1e-7) << "evaluation " << i << ": " << parallel->eval_loss[i] << " vs "
                         << single->eval_loss[i];
  }
  std::printf("REPORT eval %s: held-out loss %.6f -> %.6f, worst rel diff to single %.2e\n",
              layout.name, single->eval_loss.front(), single->eval_loss.back(), worst);
}

const Layout kEvalLayouts[] = {
    {"dp2_ep2", 1, 2, 1, 2, 1, 2},
    {"tp2_ep2", 1, 1, 2, 2, 1, 2},
    {"pp2_dp2", 2, 2, 1, 1, 1, 2},
};

INSTANTIATE_TEST_SUITE_P(Layouts, EvalLayoutTest, ::testing::ValuesIn(kEvalLayouts),
                         [](const ::testing::TestParamInfo<Layout>& info) {
                           return std::string(info.param.name);
                         });

TEST(EvalLayoutTest, EvaluationDoesNotChangeTraining) {
  const Layout layout = {"dp2_ep2", 1, 2, 1, 2, 1, 2};
  LayoutCase with = EvalCase(layout);
  LayoutCase without = with;
  without.eval_every = 0;
  without.eval_batches = 0;
  absl::StatusOr<RunResult> a = RunLayoutInTempDir(with, "eval-on");
  ASSERT_TRUE(a.ok()) << a.status();
  absl::StatusOr<RunResult> b = RunLayoutInTempDir(without, "eval-off");
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(a->eval_loss.size(), 3u);
  ExpectBitIdentical(*a, *b);
}

}  // namespace
}  // namespace furnace::testing
