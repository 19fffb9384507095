// moe::ExpertDispatcher on in-process groups (threads): rows reach the rank that holds their
// expert, from the right source, in expert-major order (payloads encode source rank and row, so a
// misrouted row shows by value); FromExperts is the adjoint of ToExperts; counts of zero work.
#include "runtime/moe/dispatcher.h"

#include <cmath>
#include <memory>
#include <vector>

#include "gtest/gtest.h"
#include "runtime/comm/local_communicator.h"
#include "tests/runtime/parallel/local_world.h"

namespace furnace::moe {
namespace {

constexpr int kC = 3;

// Rank r's routed rows: counts[e] rows for each global expert e, grouped by expert; row value
// (source, expert, index, column) encoded as 1000 * source + 100 * expert + 10 * index + column.
std::vector<int64_t> CountsOf(int rank, int E) {
  std::vector<int64_t> c(E);
  for (int e = 0; e < E; ++e) c[e] = (rank * 7 + e * 3) % 4;  // includes zeros
  return c;
}

float Value(int src, int e, int i, int col) { return 1000.f * src + 100.f * e + 10.f * i + col; }

struct Layout {
  int ep, esp;
};

class DispatcherTest : public ::testing::TestWithParam<Layout> {};

TEST_P(DispatcherTest, RoutesByValueAndIsItsOwnAdjoint) {
  const int ep = GetParam().ep, esp = GetParam().esp, world = ep * esp, E = 4;
  // Rank r = esp_rank + esp * ep_rank: ESP groups are adjacent ranks.
  std::vector<std::unique_ptr<comm::LocalGroup>> ep_groups, esp_groups;
  for (int q = 0; q < esp; ++q) ep_groups.push_back(std::make_unique<comm::LocalGroup>(ep));
  for (int j = 0; j < ep; ++j) esp_groups.push_back(std::make_unique<comm::LocalGroup>(esp));
  std::vector<std::unique_ptr<comm::Communicator>> ep_comm(world), esp_comm(world);
  for (int r = 0; r < world; ++r) {
    const int q = r % esp, j = r / esp;
    ep_comm[r] = ep_groups[q]->Member(j);
    esp_comm[r] = esp_groups[j]->Member(q);
  }
  std::vector<double> lhs(world), rhs(world);
  const auto statuses = testing::LocalWorld::Run(world, [&](int r) -> absl::Status {
    const int q = r % esp, j = r / esp, El = E / ep;
    ExpertDispatcher d({ep_comm[r].get(), esp_comm[r].get()}, E);
    const std::vector<int64_t> counts = CountsOf(r, E);
    absl::StatusOr<DispatchHandle> h = d.Prepare(counts);
    if (!h.ok()) return h.status();
    std::vector<float> rows;
    for (int e = 0; e < E; ++e)
      for (int i = 0; i < counts[e]; ++i)
        for (int col = 0; col < kC; ++col) rows.push_back(Value(r, e, i, col));
    std::vector<float> scratch(ExpertDispatcher::ScratchRows(*h) * kC);
    std::vector<float> expert(h->R() * kC);
    if (absl::Status s = d.ToExperts(*h, rows.data(), expert.data(), kC, scratch.data()); !s.ok())
      return s;
    // Expected: for each local expert le, for each ESP peer q', for each EP source j', the rows
    // of source rank (q' + esp * j') for global expert j * El + le, in order.
    std::vector<float> want;
    for (int le = 0; le < El; ++le) {
      const int e = j * El + le;
      for (int qq = 0; qq < esp; ++qq)
        for (int jj = 0; jj < ep; ++jj) {
          const int src = qq + esp * jj;
          for (int i = 0; i < CountsOf(src, E)[e]; ++i)
            for (int col = 0; col < kC; ++col) want.push_back(Value(src, e, i, col));
        }
    }
    if (expert != want) return absl::InternalError(absl::StrCat("rank ", r, ": misrouted rows"));
    if (static_cast<int64_t>(want.size()) / kC != h->expert_offsets.back()) {
      return absl::InternalError("expert offsets");
    }
    // Adjoint: <ToExperts(x), y> == <x, FromExperts(y)>, summed over ranks.
    std::vector<float> y(expert.size());
    for (size_t i = 0; i < y.size(); ++i) y[i] = 0.001f * static_cast<float>((i * 7 + r) % 13);
    std::vector<float> back(rows.size());
    if (absl::Status s = d.FromExperts(*h, y.data(), back.data(), kC, scratch.data()); !s.ok())
      return s;
    for (size_t i = 0; i < y.size(); ++i) lhs[r] += static_cast<double>(expert[i]) * y[i];
    for (size_t i = 0; i < rows.size(); ++i) rhs[r] += static_cast<double>(rows[i]) * back[i];
    (void)q;
    return absl::OkStatus();
  });
  for (int r = 0; r < world; ++r) ASSERT_TRUE(statuses[r].ok()) << statuses[r];
  double l = 0, rr = 0;
  for (int r = 0; r < world; ++r) {
    l += lhs[r];
    rr += rhs[r];
  }
  EXPECT_NEAR(l, rr, 1e-6 * std::fabs(l));
}

INSTANTIATE_TEST_SUITE_P(Layouts, DispatcherTest,
                         ::testing::Values(Layout{1, 1}, Layout{2, 1}, Layout{4, 1}, Layout{1, 2},
                                           Layout{2, 2}),
                         [](const ::testing::TestParamInfo<Layout>& info) {
                           return absl::StrCat("ep", info.param.ep, "_esp", info.param.esp);
                         });

}  // namespace
}  // namespace furnace::moe
