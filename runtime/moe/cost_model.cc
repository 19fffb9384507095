#include "runtime/moe/cost_model.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kernels/permute.h"
#include "nlohmann/json.hpp"

namespace furnace::moe {
namespace {

constexpr int64_t kF32 = 4;
constexpr int64_t kI64 = 8;

int GroupIndex(OpGroup g) {
  switch (g) {
    case OpGroup::kTp:
      return 0;
    case OpGroup::kEp:
      return 1;
    case OpGroup::kEsp:
      return 2;
    case OpGroup::kNone:
      break;
  }
  return -1;
}

int GroupSize(const LayerShape& shape, OpGroup g) {
  switch (g) {
    case OpGroup::kTp:
      return shape.tp;
    case OpGroup::kEp:
      return shape.ep;
    case OpGroup::kEsp:
      return shape.esp;
    case OpGroup::kNone:
      break;
  }
  return 1;
}

// Adds `bytes` to group g unless g is a group of one (no collective there).
void AddOn(GroupBytes& out, const LayerShape& shape, OpGroup g, int64_t bytes) {
  if (GroupSize(shape, g) <= 1) return;
  switch (g) {
    case OpGroup::kTp:
      out.tp += bytes;
      break;
    case OpGroup::kEp:
      out.ep += bytes;
      break;
    case OpGroup::kEsp:
      out.esp += bytes;
      break;
    case OpGroup::kNone:
      break;
  }
}

// The bytes of the all-gather part of an op on group g (esp: the rows received; tp: the row share).
int64_t AllGatherBytes(OpGroup g, const LayerShape& shape, const ScheduleRows& rows) {
  if (g == OpGroup::kEsp) return rows.A * shape.C * kF32;
  return RoutedRows(shape) / std::max(shape.tp, 1) * shape.C * kF32;
}

double CollectiveSeconds(const CostProfile& p, const LayerShape& shape, CollectiveKind kind,
                         OpGroup g, int64_t bytes) {
  if (GroupSize(shape, g) <= 1) return 0;
  return p.at(kind, g).Seconds(static_cast<double>(bytes));
}

double CopySeconds(const CostProfile& p, int64_t bytes) {
  return p.copy.Seconds(static_cast<double>(bytes));
}

double OpSeconds(const CostProfile& p, const Op& op, Direction dir, const LayerShape& shape,
                 const ScheduleRows& rows, const GroupBytes& bytes) {
  const double grad = dir == Direction::kBackward ? 2.0 : 1.0;
  const int64_t row_bytes = shape.C * kF32;
  switch (op.kind) {
    case OpKind::kMpSplit:
      return 0;
    case OpKind::kMpAllGather:
    case OpKind::kRowAllGather:
      return CollectiveSeconds(p, shape, CollectiveKind::kAllGather, OpGroup::kTp, bytes.tp);
    case OpKind::kGate: {
      // The router GEMM, the layer norm over all N tokens and the softmax / top-k passes over the
      // gated ones (elementwise: priced as copies of what they read and write), and under s1 the
      // forward's exchange of the gate statistics over tp.
      const double flops = 2.0 * static_cast<double>(rows.gate_tokens) * shape.C * shape.E;
      const int64_t elementwise = (2 * shape.N * shape.C + 3 * rows.gate_tokens * shape.E) * kF32;
      return grad * (p.gemm.Seconds(flops) + CopySeconds(p, elementwise)) +
             CollectiveSeconds(p, shape, CollectiveKind::kAllGather, OpGroup::kTp, bytes.tp);
    }
    case OpKind::kOrder:
    case OpKind::kInverseOrder:
      return CopySeconds(p, rows.order_rows * row_bytes);
    case OpKind::kRowSplit:
      return CopySeconds(p, RoutedRows(shape) / std::max(shape.tp, 1) * row_bytes);
    case OpKind::kCounts:  // sliced experts exchange no counts over esp (no bytes there)
      return CollectiveSeconds(p, shape, CollectiveKind::kAllToAll, OpGroup::kEp, bytes.ep) +
             (bytes.esp > 0 ? CollectiveSeconds(p, shape, CollectiveKind::kAllGather, OpGroup::kEsp,
                                                bytes.esp)
                            : 0.0) +
             (bytes.tp > 0
                  ? CollectiveSeconds(p, shape, CollectiveKind::kAllGather, OpGroup::kTp, bytes.tp)
                  : 0.0);
    case OpKind::kAllToAll:
      return CollectiveSeconds(p, shape, CollectiveKind::kAllToAll, OpGroup::kEp, bytes.ep);
    case OpKind::kEspAllGather:
      return CollectiveSeconds(p, shape, CollectiveKind::kAllGather, OpGroup::kEsp, bytes.esp);
    case OpKind::kEspReduceScatter:
      return CollectiveSeconds(p, shape, CollectiveKind::kReduceScatter, OpGroup::kEsp, bytes.esp);
    case OpKind::kEspCopy:
      return 0;
    case OpKind::kEspAllReduce:
      // A reduce-scatter of the rows, then an all-gather of each peer's share (the ring
      // all-reduce's two halves).
      return CollectiveSeconds(p, shape, CollectiveKind::kReduceScatter, OpGroup::kEsp, bytes.esp) +
             CollectiveSeconds(p, shape, CollectiveKind::kAllGather, OpGroup::kEsp,
                               bytes.esp / std::max(shape.esp, 1));
    case OpKind::kExpert: {
      const double flops = 2.0 * static_cast<double>(rows.R) * shape.C *
                           (static_cast<double>(shape.f) / std::max(shape.esp, 1));
      return grad * 2.0 * p.gemm.Seconds(flops);
    }
    case OpKind::kFused: {
      const int64_t a2a_bytes = rows.S * row_bytes;
      const int64_t ag_bytes = AllGatherBytes(op.ag_group, shape, rows);
      const double t_a2a =
          CollectiveSeconds(p, shape, CollectiveKind::kAllToAll, OpGroup::kEp, a2a_bytes);
      const double t_ag =
          CollectiveSeconds(p, shape, CollectiveKind::kAllGather, op.ag_group, ag_bytes);
      // A group of one leaves nothing to overlap: the executor runs the other collective alone.
      if (GroupSize(shape, op.ag_group) <= 1) return t_a2a;
      if (shape.ep <= 1) return t_ag;
      // Pipelined over the ep steps: the longer of the two, plus a step's start-up per ep rank.
      const double alpha_max = std::max(p.at(CollectiveKind::kAllToAll, OpGroup::kEp).alpha,
                                        p.at(CollectiveKind::kAllGather, op.ag_group).alpha);
      return std::max(t_a2a, t_ag) + shape.ep * alpha_max;
    }
  }
  return 0;
}

std::string Ms(double seconds) { return absl::StrFormat("%.3g ms", seconds * 1e3); }

nlohmann::json FitJson(const AlphaBeta& ab) {
  return {{"alpha", ab.alpha}, {"beta", ab.beta}, {"r2", ab.r2}, {"points", ab.points}};
}

absl::StatusOr<AlphaBeta> FitFromJson(const nlohmann::json& j, const std::string& where) {
  if (!j.is_object()) return absl::InvalidArgumentError(absl::StrCat(where, ": not an object"));
  AlphaBeta ab;
  for (const char* key : {"alpha", "beta", "r2", "points"}) {
    if (!j.contains(key) || !j[key].is_number()) {
      return absl::InvalidArgumentError(absl::StrCat(where, ".", key, ": missing or not a number"));
    }
  }
  ab.alpha = j["alpha"].get<double>();
  ab.beta = j["beta"].get<double>();
  ab.r2 = j["r2"].get<double>();
  ab.points = j["points"].get<int>();
  return ab;
}

}  // namespace

int64_t RoutedRows(const LayerShape& shape) {
  const int64_t all = shape.N * shape.k;
  if (shape.capacity_factor <= 0 || shape.E <= 0) return all;
  return std::min(
      all,
      kernels::cpu::ExpertCapacity(shape.capacity_factor, shape.k, shape.N, shape.E) * shape.E);
}

ScheduleRows RowsOf(const LayerShape& shape, Schedule s) {
  const int64_t s_all = RoutedRows(shape);
  const int tp = std::max(shape.tp, 1);
  ScheduleRows r;
  switch (s) {
    case Schedule::kDeepspeed:
      r.gate_tokens = shape.N;
      r.order_rows = s_all;
      r.S = s_all;
      break;
    case Schedule::kS1:
      r.gate_tokens = shape.N / tp;
      r.order_rows = s_all / tp;
      r.S = s_all / tp;
      break;
    case Schedule::kS2:
      r.gate_tokens = shape.N;
      r.order_rows = s_all;
      r.S = s_all / tp;
      break;
  }
  r.A = r.S;
  r.R = SlicedExperts(s, shape.esp_is_tp, shape.esp) ? r.A : std::max(shape.esp, 1) * r.A;
  return r;
}

GroupBytes OpBytes(const Op& op, Direction dir, const LayerShape& shape, Schedule s) {
  const ScheduleRows rows = RowsOf(shape, s);
  const int64_t row_bytes = shape.C * kF32;
  GroupBytes b;
  switch (op.kind) {
    case OpKind::kGate:
      // s1's forward gathers every peer's choice counts and probability sums (2 E doubles).
      if (s == Schedule::kS1 && dir == Direction::kForward) {
        AddOn(b, shape, OpGroup::kTp, 2 * static_cast<int64_t>(shape.E) * 8);
      }
      break;
    case OpKind::kMpAllGather:
      AddOn(b, shape, OpGroup::kTp, shape.N / std::max(shape.tp, 1) * row_bytes);
      break;
    case OpKind::kRowAllGather:
      AddOn(b, shape, OpGroup::kTp, AllGatherBytes(OpGroup::kTp, shape, rows));
      break;
    case OpKind::kCounts:
      AddOn(b, shape, OpGroup::kEp, static_cast<int64_t>(shape.E / shape.ep) * shape.ep * kI64);
      // Sliced experts: the ESP peers received the same rows, so their counts are not exchanged.
      if (!SlicedExperts(s, shape.esp_is_tp, shape.esp)) {
        AddOn(b, shape, OpGroup::kEsp,
              static_cast<int64_t>(shape.ep) * (shape.E / shape.ep) * kI64);
      }
      // s2 splits the rows between the tp peers: they gather each one's ep rank and routing digest
      // (ScheduleExecutor::Prepare).
      if (s == Schedule::kS2) AddOn(b, shape, OpGroup::kTp, 2 * kI64);
      break;
    case OpKind::kAllToAll:
      AddOn(b, shape, OpGroup::kEp, rows.S * row_bytes);
      break;
    case OpKind::kEspAllGather:
      AddOn(b, shape, OpGroup::kEsp, rows.A * row_bytes);
      break;
    case OpKind::kEspReduceScatter:
    case OpKind::kEspAllReduce:
      AddOn(b, shape, OpGroup::kEsp, rows.R * row_bytes);
      break;
    case OpKind::kFused:
      AddOn(b, shape, OpGroup::kEp, rows.S * row_bytes);
      AddOn(b, shape, op.ag_group, AllGatherBytes(op.ag_group, shape, rows));
      break;
    case OpKind::kMpSplit:
    case OpKind::kOrder:
    case OpKind::kRowSplit:
    case OpKind::kEspCopy:
    case OpKind::kExpert:
    case OpKind::kInverseOrder:
      break;
  }
  return b;
}

GroupBytes ScheduleBytes(Direction dir, const LayerShape& shape, Schedule s) {
  GroupBytes total;
  const bool sliced = SlicedExperts(s, shape.esp_is_tp, shape.esp);
  for (const Op& op : dir == Direction::kForward ? ForwardOps(s, sliced) : BackwardOps(s, sliced)) {
    total += OpBytes(op, dir, shape, s);
  }
  return total;
}

AlphaBeta FitAlphaBeta(const std::vector<std::pair<double, double>>& bytes_seconds) {
  AlphaBeta ab;
  ab.points = static_cast<int>(bytes_seconds.size());
  if (bytes_seconds.empty()) return ab;
  const double n = static_cast<double>(bytes_seconds.size());
  double sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (const auto& [x, y] : bytes_seconds) {
    sx += x;
    sy += y;
    sxx += x * x;
    sxy += x * y;
  }
  const double mx = sx / n, my = sy / n;
  double vxx = 0, vxy = 0, ss_tot = 0;
  for (const auto& [x, y] : bytes_seconds) {
    vxx += (x - mx) * (x - mx);
    vxy += (x - mx) * (y - my);
    ss_tot += (y - my) * (y - my);
  }
  if (vxx > 0) {
    ab.beta = vxy / vxx;
    ab.alpha = my - ab.beta * mx;
  }
  if (vxx <= 0 || ab.alpha < 0) {  // through the origin
    ab.alpha = 0;
    ab.beta = sxx > 0 ? sxy / sxx : 0;
  }
  if (ab.beta < 0) {
    // Times that fall with size are noise over a flat start-up cost (latency-bound points on a
    // fast link): a negative slope would price the largest transfers at nothing, or less.
    ab.beta = 0;
    ab.alpha = std::max(0.0, my);
  }
  double ss_res = 0;
  for (const auto& [x, y] : bytes_seconds) {
    const double e = y - ab.Seconds(x);
    ss_res += e * e;
  }
  if (ss_tot > 0) {
    ab.r2 = 1.0 - ss_res / ss_tot;
  } else {
    ab.r2 = ss_res <= 1e-30 ? 1.0 : 0.0;
  }
  return ab;
}

const char* CollectiveKindName(CollectiveKind k) {
  switch (k) {
    case CollectiveKind::kAllToAll:
      return "all_to_all";
    case CollectiveKind::kAllGather:
      return "all_gather";
    case CollectiveKind::kReduceScatter:
      return "reduce_scatter";
  }
  return "?";
}

AlphaBeta& CostProfile::at(CollectiveKind kind, OpGroup group) {
  return collective[static_cast<int>(kind)][std::max(GroupIndex(group), 0)];
}

const AlphaBeta& CostProfile::at(CollectiveKind kind, OpGroup group) const {
  return collective[static_cast<int>(kind)][std::max(GroupIndex(group), 0)];
}

std::string CostProfile::ToJson() const {
  nlohmann::json collectives = nlohmann::json::object();
  for (OpGroup g : kCommGroups) {
    nlohmann::json group = nlohmann::json::object();
    for (CollectiveKind k : kAllCollectiveKinds) group[CollectiveKindName(k)] = FitJson(at(k, g));
    collectives[OpGroupName(g)] = group;
  }
  nlohmann::json j = {{"source", source},
                      {"seconds_spent", seconds_spent},
                      {"gemm", FitJson(gemm)},
                      {"copy", FitJson(copy)},
                      {"collectives", collectives}};
  return j.dump(2);
}

absl::StatusOr<CostProfile> CostProfile::FromJson(std::string_view text) {
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return absl::InvalidArgumentError("cost profile: not valid JSON");
  if (!j.is_object()) return absl::InvalidArgumentError("cost profile: not a JSON object");
  CostProfile p;
  if (!j.contains("source") || !j["source"].is_string()) {
    return absl::InvalidArgumentError("cost profile: source: missing or not a string");
  }
  p.source = j["source"].get<std::string>();
  if (j.contains("seconds_spent") && j["seconds_spent"].is_number()) {
    p.seconds_spent = j["seconds_spent"].get<double>();
  }
  for (const char* key : {"gemm", "copy", "collectives"}) {
    if (!j.contains(key)) {
      return absl::InvalidArgumentError(absl::StrCat("cost profile: ", key, ": missing"));
    }
  }
  absl::StatusOr<AlphaBeta> fit = FitFromJson(j["gemm"], "cost profile: gemm");
  if (!fit.ok()) return fit.status();
  p.gemm = *fit;
  fit = FitFromJson(j["copy"], "cost profile: copy");
  if (!fit.ok()) return fit.status();
  p.copy = *fit;
  const nlohmann::json& collectives = j["collectives"];
  for (OpGroup g : kCommGroups) {
    const std::string where = absl::StrCat("cost profile: collectives.", OpGroupName(g));
    if (!collectives.is_object() || !collectives.contains(OpGroupName(g))) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": missing"));
    }
    const nlohmann::json& group = collectives[OpGroupName(g)];
    for (CollectiveKind k : kAllCollectiveKinds) {
      if (!group.is_object() || !group.contains(CollectiveKindName(k))) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ".", CollectiveKindName(k), ": missing"));
      }
      fit = FitFromJson(group[CollectiveKindName(k)],
                        absl::StrCat(where, ".", CollectiveKindName(k)));
      if (!fit.ok()) return fit.status();
      p.at(k, g) = *fit;
    }
  }
  return p;
}

CostProfile DefaultProfile(bool tp_intra, bool ep_intra, bool esp_intra) {
  const AlphaBeta intra{.alpha = 5e-6, .beta = 1.0 / 100e9};
  const AlphaBeta inter{.alpha = 20e-6, .beta = 1.0 / 12.5e9};
  CostProfile p;
  const bool intra_of[3] = {tp_intra, ep_intra, esp_intra};
  for (int g = 0; g < 3; ++g) {
    for (CollectiveKind k : kAllCollectiveKinds) {
      p.at(k, kCommGroups[g]) = intra_of[g] ? intra : inter;
    }
  }
  p.gemm = AlphaBeta{.alpha = 10e-6, .beta = 1.0 / 100e12};
  p.copy = AlphaBeta{.alpha = 5e-6, .beta = 1.0 / 1e12};
  p.source = absl::StrCat(
      "default profile: tp ", tp_intra ? "intra" : "inter", ", ep ", ep_intra ? "intra" : "inter",
      ", esp ", esp_intra ? "intra" : "inter",
      "-node (intra 5 us + 100 GB/s, inter 20 us + 12.5 GB/s, GEMM 10 us + 100 TFLOP/s, copy 5 "
      "us + 1 TB/s)");
  return p;
}

Prediction Predict(const CostProfile& profile, const LayerShape& shape, Schedule s) {
  Prediction pred;
  pred.schedule = s;
  const ScheduleRows rows = RowsOf(shape, s);
  const bool sliced = SlicedExperts(s, shape.esp_is_tp, shape.esp);
  pred.sliced = sliced;
  for (Direction dir : {Direction::kForward, Direction::kBackward}) {
    const bool fwd = dir == Direction::kForward;
    std::vector<OpCost>& ops = fwd ? pred.forward_ops : pred.backward_ops;
    double& seconds = fwd ? pred.forward_s : pred.backward_s;
    GroupBytes& bytes = fwd ? pred.forward_bytes : pred.backward_bytes;
    for (const Op& op : fwd ? ForwardOps(s, sliced) : BackwardOps(s, sliced)) {
      OpCost cost{.op = op, .bytes = OpBytes(op, dir, shape, s)};
      cost.seconds = OpSeconds(profile, op, dir, shape, rows, cost.bytes);
      seconds += cost.seconds;
      bytes += cost.bytes;
      ops.push_back(cost);
    }
  }
  return pred;
}

Choice ChooseSchedule(const CostProfile& profile, const LayerShape& shape) {
  Choice choice;
  for (Schedule s : kAllSchedules) choice.all.push_back(Predict(profile, shape, s));
  if (shape.tp <= 1) {
    choice.schedule = Schedule::kDeepspeed;
    choice.reason = "tp = 1: nothing to pause";
    return choice;
  }
  size_t best = 0;
  for (size_t i = 1; i < choice.all.size(); ++i) {
    if (choice.all[i].total_s() < choice.all[best].total_s()) best = i;
  }
  choice.schedule = choice.all[best].schedule;
  choice.reason = absl::StrCat(ScheduleName(choice.schedule), ": ", Ms(choice.all[best].total_s()),
                               " fwd+bwd vs");
  // The others, fastest first.
  std::vector<const Prediction*> others;
  for (size_t i = 0; i < choice.all.size(); ++i) {
    if (i != best) others.push_back(&choice.all[i]);
  }
  std::stable_sort(others.begin(), others.end(), [](const Prediction* a, const Prediction* b) {
    return a->total_s() < b->total_s();
  });
  for (size_t i = 0; i < others.size(); ++i) {
    absl::StrAppend(&choice.reason, i == 0 ? " " : ", ", ScheduleName(others[i]->schedule), " ",
                    Ms(others[i]->total_s()));
  }
  const Prediction* picked = &choice.all[best];
  if (choice.schedule == Schedule::kS1 && shape.N % shape.tp != 0) {
    // s1 splits the tokens over tp (executor.h): the cheapest of the others runs instead.
    picked = others.front();
    choice.schedule = picked->schedule;
    choice.reason =
        absl::StrCat(ScheduleName(picked->schedule), ": s1 would be cheaper but ", shape.N,
                     " tokens do not split over tp = ", shape.tp, "; ", choice.reason);
  }
  const Prediction& deepspeed = choice.all[0];
  if (choice.schedule != Schedule::kDeepspeed &&
      picked->total_s() > deepspeed.total_s() * (1 - kParmMargin)) {
    choice.reason =
        absl::StrCat("deepspeed: ", ScheduleName(picked->schedule), " is predicted only ",
                     absl::StrFormat("%.0f%%", 100 * (1 - picked->total_s() / deepspeed.total_s())),
                     " faster, under the ", absl::StrFormat("%.0f%%", 100 * kParmMargin),
                     " a Parm schedule must gain; ", choice.reason);
    choice.schedule = Schedule::kDeepspeed;
  }
  return choice;
}

std::vector<Schedule> TrialCandidates(const Choice& predicted, const LayerShape& shape,
                                      const TrialOptions& options) {
  std::vector<Schedule> out = {Schedule::kDeepspeed};
  if (shape.tp <= 1 || predicted.all.size() != std::size(kAllSchedules)) return out;
  const auto allowed = [&shape](Schedule s) {
    return s != Schedule::kS1 || shape.N % shape.tp == 0;
  };
  double best = -1;
  for (const Prediction& p : predicted.all) {
    if (allowed(p.schedule) && (best < 0 || p.total_s() < best)) best = p.total_s();
  }
  for (const Prediction& p : predicted.all) {
    if (p.schedule != Schedule::kDeepspeed && allowed(p.schedule) &&
        p.total_s() <= options.window * best) {
      out.push_back(p.schedule);
    }
  }
  return out;
}

}  // namespace furnace::moe
