// Topology: validation, then rank <-> coordinate arithmetic. A rank's in-stage index is the rank
// with its pp digit removed: the digits below pp's stride stay, those above are divided by pp. That
// keeps the relative order of the dp and tp digits, so the same arithmetic works for every order.
#include "runtime/topology/topology.h"

#include <algorithm>
#include <array>
#include <climits>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "runtime/base/status.h"

namespace furnace::topology {
namespace {

// "{1, 2, 4}": the divisors of n (n >= 1).
std::string Divisors(int64_t n) {
  std::vector<int64_t> low, high;
  for (int64_t d = 1; d * d <= n; ++d) {
    if (n % d != 0) continue;
    low.push_back(d);
    if (d != n / d) high.push_back(n / d);
  }
  low.insert(low.end(), high.rbegin(), high.rend());
  return absl::StrCat("{", absl::StrJoin(low, ", "), "}");
}

// Parses "a-b-c" (fastest first) into the positions of names[0..2] in it, or an error naming
// `field`.
absl::StatusOr<std::array<int, 3>> ParseOrder(const std::string& field, const std::string& order,
                                              const std::array<const char*, 3>& names) {
  const std::vector<std::string> parts = absl::StrSplit(order, '-');
  std::array<int, 3> position = {-1, -1, -1};
  bool ok = parts.size() == 3;
  for (int i = 0; ok && i < 3; ++i) {
    auto it = std::find(names.begin(), names.end(), parts[i]);
    if (it == names.end() || position[it - names.begin()] != -1) {
      ok = false;
    } else {
      position[it - names.begin()] = i;
    }
  }
  if (!ok) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " = '", order, "' is invalid; allowed: ", names[0], ", ", names[1],
                     " and ", names[2], " once each, fastest first, joined by '-' (e.g. '",
                     absl::StrJoin(names, "-"), "')"));
  }
  return position;
}

// Strides for three dimensions with `sizes`, laid out in the order given by `position`.
std::array<int, 3> Strides(const std::array<int, 3>& sizes, const std::array<int, 3>& position) {
  std::array<int, 3> by_position{};  // dimension index at each position
  for (int d = 0; d < 3; ++d) by_position[position[d]] = d;
  std::array<int, 3> strides{};
  int stride = 1;
  for (int p = 0; p < 3; ++p) {
    strides[by_position[p]] = stride;
    stride *= sizes[by_position[p]];
  }
  return strides;
}

absl::Status CheckDivides(const char* divisor_field, int divisor, const char* dividend_field,
                          int dividend, const char* short_name) {
  if (dividend == 0 || dividend % divisor == 0) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(divisor_field, " = ", divisor, " must divide ", dividend_field, " = ", dividend,
                   "; allowed: ", short_name, " in ", Divisors(dividend)));
}

absl::Status Validate(const ParallelSizes& s, int world_size, const ModelDims& dims) {
  const std::pair<const char*, int> fields[] = {{"parallel.pp", s.pp},
                                                {"parallel.dp", s.dp},
                                                {"parallel.tp", s.tp},
                                                {"parallel.ep", s.ep},
                                                {"parallel.esp", s.esp}};
  for (const auto& [field, value] : fields) {
    if (value < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, " = ", value, " is invalid; allowed: an integer >= 1"));
    }
  }
  const int64_t world = int64_t{s.pp} * s.dp * s.tp;
  if (world > INT32_MAX) {
    return absl::InvalidArgumentError(
        absl::StrCat("parallel.pp * parallel.dp * parallel.tp = ", s.pp, " * ", s.dp, " * ", s.tp,
                     " = ", world, " is too large; allowed: at most ", INT32_MAX));
  }
  const int64_t dp_tp = int64_t{s.dp} * s.tp;
  const int64_t ep_esp = int64_t{s.ep} * s.esp;
  if (dp_tp % ep_esp != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "parallel.ep * parallel.esp = ", ep_esp, " must divide parallel.dp * parallel.tp = ", dp_tp,
        "; allowed: ep * esp in ", Divisors(dp_tp)));
  }
  if (world_size != world) {
    return absl::InvalidArgumentError(absl::StrCat(
        "world_size = ", world_size, " must equal parallel.pp * parallel.dp * parallel.tp = ", s.pp,
        " * ", s.dp, " * ", s.tp, " = ", world, "; allowed: ", world));
  }
  RETURN_IF_ERROR(CheckDivides("parallel.tp", s.tp, "model.heads", dims.heads, "tp"));
  RETURN_IF_ERROR(CheckDivides("parallel.tp", s.tp, "model.d_model", dims.d_model, "tp"));
  RETURN_IF_ERROR(CheckDivides("parallel.tp", s.tp, "model.dense_ffn", dims.dense_ffn, "tp"));
  if (dims.layers != 0 && s.pp > dims.layers) {
    return absl::InvalidArgumentError(absl::StrCat("parallel.pp = ", s.pp,
                                                   " must be <= model.layers = ", dims.layers,
                                                   "; allowed: pp in 1..", dims.layers));
  }
  RETURN_IF_ERROR(CheckDivides("parallel.ep", s.ep, "moe.experts", dims.experts, "ep"));
  RETURN_IF_ERROR(CheckDivides("parallel.esp", s.esp, "model.expert_ffn", dims.expert_ffn, "esp"));
  return absl::OkStatus();
}

}  // namespace

const char* GroupKindName(GroupKind kind) {
  switch (kind) {
    case GroupKind::kTensor:
      return "tp";
    case GroupKind::kData:
      return "dp";
    case GroupKind::kPipeline:
      return "pp";
    case GroupKind::kExpert:
      return "ep";
    case GroupKind::kExpertShard:
      return "esp";
    case GroupKind::kExpertData:
      return "edp";
    case GroupKind::kEmbedding:
      return "embedding";
  }
  return "unknown";
}

absl::StatusOr<Topology> Topology::Create(const ParallelSizes& sizes, int world_size,
                                          const ModelDims& dims) {
  RETURN_IF_ERROR(Validate(sizes, world_size, dims));
  ASSIGN_OR_RETURN(const auto dense, ParseOrder("parallel.order", sizes.order, {"tp", "dp", "pp"}));
  ASSIGN_OR_RETURN(const auto moe,
                   ParseOrder("parallel.moe_order", sizes.moe_order, {"esp", "ep", "edp"}));
  Topology t;
  t.sizes_ = sizes;
  const std::array<int, 3> dense_strides = Strides({sizes.tp, sizes.dp, sizes.pp}, dense);
  t.stride_tp_ = dense_strides[0];
  t.stride_dp_ = dense_strides[1];
  t.stride_pp_ = dense_strides[2];
  const std::array<int, 3> moe_strides = Strides({sizes.esp, sizes.ep, t.edp()}, moe);
  t.stride_esp_ = moe_strides[0];
  t.stride_ep_ = moe_strides[1];
  t.stride_edp_ = moe_strides[2];
  return t;
}

Coords Topology::CoordsOf(int rank) const {
  Coords c;
  c.pp = rank / stride_pp_ % sizes_.pp;
  c.dp = rank / stride_dp_ % sizes_.dp;
  c.tp = rank / stride_tp_ % sizes_.tp;
  const int in_stage = rank % stride_pp_ + rank / (stride_pp_ * sizes_.pp) * stride_pp_;
  c.edp = in_stage / stride_edp_ % edp();
  c.ep = in_stage / stride_ep_ % sizes_.ep;
  c.esp = in_stage / stride_esp_ % sizes_.esp;
  return c;
}

int Topology::RankOf(int pp, int dp, int tp) const {
  return pp * stride_pp_ + dp * stride_dp_ + tp * stride_tp_;
}

int Topology::RankOfExpert(int pp, int edp, int ep, int esp) const {
  const int in_stage = edp * stride_edp_ + ep * stride_ep_ + esp * stride_esp_;
  return in_stage % stride_pp_ + pp * stride_pp_ + in_stage / stride_pp_ * stride_pp_ * sizes_.pp;
}

std::vector<int> Topology::Group(GroupKind kind, int rank) const {
  const Coords c = CoordsOf(rank);
  std::vector<int> members;
  switch (kind) {
    case GroupKind::kTensor:
      for (int i = 0; i < sizes_.tp; ++i) members.push_back(RankOf(c.pp, c.dp, i));
      break;
    case GroupKind::kData:
      for (int i = 0; i < sizes_.dp; ++i) members.push_back(RankOf(c.pp, i, c.tp));
      break;
    case GroupKind::kPipeline:
      for (int i = 0; i < sizes_.pp; ++i) members.push_back(RankOf(i, c.dp, c.tp));
      break;
    case GroupKind::kExpert:
      for (int i = 0; i < sizes_.ep; ++i) members.push_back(RankOfExpert(c.pp, c.edp, i, c.esp));
      break;
    case GroupKind::kExpertShard:
      for (int i = 0; i < sizes_.esp; ++i) members.push_back(RankOfExpert(c.pp, c.edp, c.ep, i));
      break;
    case GroupKind::kExpertData:
      for (int i = 0; i < edp(); ++i) members.push_back(RankOfExpert(c.pp, i, c.ep, c.esp));
      break;
    case GroupKind::kEmbedding:
      if (sizes_.pp == 1 || (c.pp != 0 && c.pp != sizes_.pp - 1)) {
        members.push_back(rank);
      } else {
        members = {RankOf(0, c.dp, c.tp), RankOf(sizes_.pp - 1, c.dp, c.tp)};
      }
      break;
  }
  return members;
}

bool Topology::EspGroupIsTpGroup() const {
  if (sizes_.esp != sizes_.tp) return false;
  for (int r = 0; r < world_size(); ++r) {
    std::vector<int> esp = Group(GroupKind::kExpertShard, r), tp = Group(GroupKind::kTensor, r);
    std::sort(esp.begin(), esp.end());
    std::sort(tp.begin(), tp.end());
    if (esp != tp) return false;
  }
  return true;
}

std::vector<std::vector<int>> Topology::AllGroups(GroupKind kind) const {
  // Ranks grow with every coordinate, so a group's first member is its smallest rank.
  std::vector<std::vector<int>> groups;
  for (int r = 0; r < world_size(); ++r) {
    std::vector<int> g = Group(kind, r);
    if (g.front() == r) groups.push_back(std::move(g));
  }
  return groups;
}

std::pair<int, int> Topology::StageLayers(int stage, int pp, int layers) {
  const int base = layers / pp, extra = layers % pp;
  const int first = stage * base + std::min(stage, extra);
  return {first, first + base + (stage < extra ? 1 : 0)};
}

}  // namespace furnace::topology
