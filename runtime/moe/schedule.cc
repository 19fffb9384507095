#include "runtime/moe/schedule.h"

#include <algorithm>
#include <array>

namespace furnace::moe {
namespace {

Op Local(OpKind k) { return Op{k, OpGroup::kNone, OpGroup::kNone}; }
Op On(OpKind k, OpGroup g) { return Op{k, g, OpGroup::kNone}; }

// The forward list before fusion: every communication a plain collective.
std::vector<Op> Unfused(Schedule s, bool sliced) {
  sliced = sliced && s == Schedule::kDeepspeed;
  std::vector<Op> ops;
  if (s == Schedule::kS1) ops.push_back(Local(OpKind::kMpSplit));
  ops.push_back(Local(OpKind::kGate));
  ops.push_back(Local(OpKind::kOrder));
  if (s == Schedule::kS2) ops.push_back(Local(OpKind::kRowSplit));
  ops.push_back(On(OpKind::kCounts, OpGroup::kEp));
  ops.push_back(On(OpKind::kAllToAll, OpGroup::kEp));
  ops.push_back(On(sliced ? OpKind::kEspCopy : OpKind::kEspAllGather, OpGroup::kEsp));
  ops.push_back(Local(OpKind::kExpert));
  ops.push_back(On(sliced ? OpKind::kEspAllReduce : OpKind::kEspReduceScatter, OpGroup::kEsp));
  ops.push_back(On(OpKind::kAllToAll, OpGroup::kEp));
  if (s == Schedule::kS2) ops.push_back(On(OpKind::kRowAllGather, OpGroup::kTp));
  ops.push_back(Local(OpKind::kInverseOrder));
  if (s == Schedule::kS1) ops.push_back(On(OpKind::kMpAllGather, OpGroup::kTp));
  return ops;
}

bool Fuses(Schedule s) { return s == Schedule::kS2; }

bool IsAllGather(OpKind k) { return k == OpKind::kEspAllGather || k == OpKind::kRowAllGather; }

// Every all-to-all immediately followed by an all-gather becomes one fused op.
std::vector<Op> Fuse(const std::vector<Op>& ops) {
  std::vector<Op> out;
  for (size_t i = 0; i < ops.size(); ++i) {
    if (ops[i].kind == OpKind::kAllToAll && i + 1 < ops.size() && IsAllGather(ops[i + 1].kind)) {
      out.push_back(Op{OpKind::kFused, ops[i].group, ops[i + 1].group});
      ++i;
      continue;
    }
    out.push_back(ops[i]);
  }
  return out;
}

// The adjoint of one unfused op; kCounts has none (backward reuses forward's counts).
std::optional<Op> Adjoint(const Op& op) {
  switch (op.kind) {
    case OpKind::kMpSplit:
      return On(OpKind::kMpAllGather, OpGroup::kTp);
    case OpKind::kMpAllGather:
      return Local(OpKind::kMpSplit);
    case OpKind::kRowSplit:
      return On(OpKind::kRowAllGather, OpGroup::kTp);
    case OpKind::kRowAllGather:
      return Local(OpKind::kRowSplit);
    case OpKind::kEspAllGather:
      return On(OpKind::kEspReduceScatter, OpGroup::kEsp);
    case OpKind::kEspReduceScatter:
      return On(OpKind::kEspAllGather, OpGroup::kEsp);
    case OpKind::kEspCopy:
      return On(OpKind::kEspAllReduce, OpGroup::kEsp);
    case OpKind::kEspAllReduce:
      return On(OpKind::kEspCopy, OpGroup::kEsp);
    case OpKind::kCounts:
      return std::nullopt;
    case OpKind::kAllToAll:
    case OpKind::kGate:
    case OpKind::kOrder:
    case OpKind::kExpert:
    case OpKind::kInverseOrder:
    case OpKind::kFused:
      return op;
  }
  return op;
}

}  // namespace

const char* ScheduleName(Schedule s) {
  switch (s) {
    case Schedule::kDeepspeed:
      return "deepspeed";
    case Schedule::kS1:
      return "s1";
    case Schedule::kS2:
      return "s2";
  }
  return "?";
}

std::optional<Schedule> ParseSchedule(std::string_view name) {
  for (Schedule s : kAllSchedules) {
    if (name == ScheduleName(s)) return s;
  }
  return std::nullopt;
}

const char* DirectionName(Direction d) { return d == Direction::kForward ? "forward" : "backward"; }

const char* OpGroupName(OpGroup g) {
  switch (g) {
    case OpGroup::kNone:
      return "";
    case OpGroup::kTp:
      return "tp";
    case OpGroup::kEp:
      return "ep";
    case OpGroup::kEsp:
      return "esp";
  }
  return "?";
}

const char* OpKindName(OpKind k) {
  switch (k) {
    case OpKind::kMpSplit:
      return "mp_split";
    case OpKind::kMpAllGather:
      return "mp_all_gather";
    case OpKind::kGate:
      return "gate";
    case OpKind::kOrder:
      return "order";
    case OpKind::kRowSplit:
      return "row_split";
    case OpKind::kRowAllGather:
      return "row_all_gather";
    case OpKind::kCounts:
      return "counts";
    case OpKind::kAllToAll:
      return "a2a";
    case OpKind::kEspAllGather:
      return "ag";
    case OpKind::kEspReduceScatter:
      return "rs";
    case OpKind::kEspCopy:
      return "copy";
    case OpKind::kEspAllReduce:
      return "ar";
    case OpKind::kFused:
      return "fused";
    case OpKind::kExpert:
      return "expert";
    case OpKind::kInverseOrder:
      return "inverse";
  }
  return "?";
}

std::string Op::Name() const {
  if (kind == OpKind::kFused) {
    return std::string("fused(a2a ") + OpGroupName(group) + ", ag " + OpGroupName(ag_group) + ")";
  }
  if (group == OpGroup::kNone) return OpKindName(kind);
  return std::string(OpKindName(kind)) + "(" + OpGroupName(group) + ")";
}

namespace {

std::vector<Op> BuildForward(Schedule s, bool sliced) {
  const std::vector<Op> ops = Unfused(s, sliced);
  return Fuses(s) ? Fuse(ops) : ops;
}

std::vector<Op> BuildBackward(Schedule s, bool sliced) {
  std::vector<Op> ops;
  const std::vector<Op> fwd = Unfused(s, sliced);
  for (auto it = fwd.rbegin(); it != fwd.rend(); ++it) {
    if (std::optional<Op> adj = Adjoint(*it); adj.has_value()) ops.push_back(*adj);
  }
  return Fuses(s) ? Fuse(ops) : ops;
}

// Per (form, schedule), indexed by their values.
template <std::vector<Op> (*Build)(Schedule, bool)>
const std::vector<Op>& Lists(Schedule s, bool sliced) {
  static const std::array<std::array<std::vector<Op>, 3>, 2> lists = {{
      {Build(Schedule::kDeepspeed, false), Build(Schedule::kS1, false),
       Build(Schedule::kS2, false)},
      {Build(Schedule::kDeepspeed, true), Build(Schedule::kS1, true), Build(Schedule::kS2, true)},
  }};
  return lists[sliced ? 1 : 0][static_cast<size_t>(s)];
}

}  // namespace

bool SlicedExperts(Schedule s, bool esp_is_tp, int esp) {
  return s == Schedule::kDeepspeed && esp_is_tp && esp > 1;
}

const std::vector<Op>& ForwardOps(Schedule s, bool sliced) {
  return Lists<BuildForward>(s, sliced);
}
const std::vector<Op>& BackwardOps(Schedule s, bool sliced) {
  return Lists<BuildBackward>(s, sliced);
}

std::string OpListString(const std::vector<Op>& ops) {
  std::string out;
  for (const Op& op : ops) {
    if (!out.empty()) out += " . ";
    out += op.Name();
  }
  return out;
}

bool ExpertRowsDuplicated(Schedule s, bool sliced) { return s == Schedule::kDeepspeed && !sliced; }
bool GateOnTokenSlice(Schedule s) { return s == Schedule::kS1; }

}  // namespace furnace::moe
