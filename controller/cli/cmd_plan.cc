// furnace plan JOB.yaml [--profile FILE] [--ranks-per-node N]: each rank's memory (its parameters
// and model state, its activations under each static policy: controller/cli/job_model.h) and the
// MoE schedules' cost model (runtime/moe/cost_model.h) on the job's shapes, on this machine; the
// controller is not involved.
#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "controller/cli/commands.h"
#include "controller/cli/exit_codes.h"
#include "controller/cli/format.h"
#include "controller/cli/job_model.h"
#include "controller/spec/job_spec.h"
#include "google/protobuf/struct.pb.h"
#include "runtime/base/status.h"
#include "runtime/moe/cost_model.h"
#include "runtime/moe/schedule.h"
#include "runtime/topology/topology.h"

namespace furnace::cli {
namespace {

absl::StatusOr<std::string> ReadText(const std::string& path, const std::string& what) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    return absl::NotFoundError(
        absl::StrCat("cannot read ", what, " ", path, ": ", std::strerror(errno)));
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) return absl::InternalError(absl::StrCat("cannot read ", what, " ", path));
  return text.str();
}

std::string Ms(double seconds) { return absl::StrFormat("%.3f ms", seconds * 1e3); }

std::string Bytes(const moe::GroupBytes& b) {
  return absl::StrCat("tp ", FormatBytes(b.tp), ", ep ", FormatBytes(b.ep), ", esp ",
                      FormatBytes(b.esp));
}

google::protobuf::Value BytesJson(const moe::GroupBytes& b) {
  google::protobuf::Value v;
  auto& f = *v.mutable_struct_value()->mutable_fields();
  f["tp"].set_number_value(static_cast<double>(b.tp));
  f["ep"].set_number_value(static_cast<double>(b.ep));
  f["esp"].set_number_value(static_cast<double>(b.esp));
  return v;
}

// The memory section: per pipeline stage, what one of its ranks holds; then the job's own
// memory settings against it. `schedule`: the MoE schedule the figures assume.
void PrintMemory(std::ostream& out, const v1::JobSpec& spec, const std::vector<StageMemory>& stages,
                 moe::Schedule schedule) {
  const v1::ParallelSpec& p = spec.parallel();
  const auto list = [&](const StageMemory& s, auto bytes_of) {
    std::string text;
    for (const PolicyActivationBytes& b : s.policies) {
      absl::StrAppend(&text, text.empty() ? " " : ", ", b.policy, " ", FormatBytes(bytes_of(b)));
    }
    return text;
  };
  out << "\nmemory per rank (micro-batches of " << p.micro_batch() << " x "
      << spec.model().seq_len() << " tokens; MoE layers under " << moe::ScheduleName(schedule)
      << (spec.moe().schedule() == "auto"
              ? " (auto's pick here; the ranks calibrate their own and may pick another)"
              : "")
      << (spec.model().attention_probs() == "recomputed"
              ? "; attention probabilities recomputed in backward (model.attention_probs), 2 "
                "floats a query row kept instead of seq_len"
              : "")
      << "; model state: fp32 weights, gradients and AdamW moments, 16 bytes a parameter, "
         "outside the activation arena that memory.device_budget bounds; the largest parts, not a "
         "total: pipeline and gradient-bucket buffers are not counted):\n";
  for (const StageMemory& s : stages) {
    out << "  stage " << s.stage << " ("
        << (s.end_layer - s.first_layer == 1
                ? absl::StrCat("layer ", s.first_layer)
                : absl::StrCat("layers ", s.first_layer, "-", s.end_layer - 1))
        << ", " << s.ranks << (s.ranks == 1 ? " rank" : " ranks") << "): " << s.parameters
        << " parameters, " << FormatBytes(s.model_state_bytes) << " of model state";
    if (s.bf16_mirror_bytes > 0) {
      out << " + " << FormatBytes(s.bf16_mirror_bytes) << " bf16 weight mirror";
    }
    out << "\n    activations, one micro-batch (balanced routing):"
        << list(s, [](const PolicyActivationBytes& b) { return b.one; }) << "\n";
    if (s.micro_batches_in_flight > 1) {
      out << "    with " << s.micro_batches_in_flight << " micro-batches in flight (1F1B):"
          << list(s, [](const PolicyActivationBytes& b) { return b.in_flight; }) << "\n";
    }
    const bool worst_known = !s.policies.empty() && s.policies.front().worst_in_flight;
    if (worst_known) {
      out << "    under the routing that sends this rank the most:"
          << list(s, [](const PolicyActivationBytes& b) { return *b.worst_in_flight; }) << "\n";
    }
    out << "    adaptive needs at least " << FormatBytes(s.least_activation_bytes)
        << " (balanced routing; a budget below it is refused), "
        << (s.any_routing_bytes
                ? absl::StrCat(FormatBytes(*s.any_routing_bytes), " for any routing")
                : std::string("any routing not computed with tensor parallelism"))
        << "\n";
  }
  const v1::MemorySpec& m = spec.memory();
  const uint64_t budget = m.device_budget();
  out << "the job's memory: policy " << m.policy() << ", device_budget "
      << (budget == 0 ? std::string("none (the device's memory)") : FormatBytes(budget));
  if (budget == 0) {
    out << "\n";
    return;
  }
  // The first stage whose `bytes_of` exceeds the budget (nullopt: not computed counts as none).
  const auto over = [&](auto bytes_of) -> const StageMemory* {
    for (const StageMemory& s : stages) {
      const std::optional<int64_t> bytes = bytes_of(s);
      if (bytes.has_value() && static_cast<int64_t>(budget) < *bytes) return &s;
    }
    return nullptr;
  };
  const auto policy_bytes = [](const StageMemory& s, const std::string& name, bool worst) {
    for (const PolicyActivationBytes& b : s.policies) {
      if (b.policy == name) return worst ? b.worst_in_flight : std::optional<int64_t>(b.in_flight);
    }
    return std::optional<int64_t>();
  };
  const bool any_unknown = std::any_of(stages.begin(), stages.end(), [](const StageMemory& x) {
    return !x.any_routing_bytes.has_value();
  });
  if (const StageMemory* s = over(
          [](const StageMemory& x) { return std::optional<int64_t>(x.least_activation_bytes); })) {
    out << ": below stage " << s->stage << "'s least (" << FormatBytes(s->least_activation_bytes)
        << "): its ranks refuse the job before the first step\n";
    return;
  }
  // The static policy whose figures the job's is judged by (offload keeps every tensor through
  // each MoE layer's forward: none's, before its moves, which the plan does not project).
  const std::string judged = m.policy() == "offload" ? "none" : m.policy();
  if (m.policy() != "adaptive") {
    const std::string restart =
        spec.recovery().max_restarts() > 0
            ? "the controller then restarts the job under adaptive at this budget"
            : "with recovery.max_restarts 0 the job then fails";
    if (const StageMemory* s =
            over([&](const StageMemory& x) { return policy_bytes(x, judged, false); })) {
      out << ": "
          << (m.policy() == "offload" ? "none (offload before its moves, which this plan "
                                        "does not project) needs "
                                      : absl::StrCat("policy ", judged, " needs "))
          << FormatBytes(*policy_bytes(*s, judged, false)) << " on stage " << s->stage
          << (m.policy() == "offload" ? ": its first step may run out of memory ("
                                      : ", so its first step runs out of memory (")
          << restart << ")\n";
      return;
    }
    if (const StageMemory* s =
            over([&](const StageMemory& x) { return policy_bytes(x, judged, true); })) {
      out << ": covers balanced routing; a step routed far from balance can need up to "
          << FormatBytes(*policy_bytes(*s, judged, true)) << " on stage " << s->stage << " under "
          << judged << " and would run out of memory (" << restart << ")\n";
      return;
    }
    const bool worst_unknown = std::any_of(stages.begin(), stages.end(), [&](const auto& x) {
      return !policy_bytes(x, judged, true).has_value();
    });
    out << (worst_unknown ? ": covers balanced routing (the worst routing is not computed with "
                            "tensor parallelism)\n"
                          : ": leaves room for any routing\n");
    return;
  }
  if (const StageMemory* s = over([](const StageMemory& x) { return x.any_routing_bytes; })) {
    out << ": covers balanced routing; a step routed far from balance can need up to "
        << FormatBytes(*s->any_routing_bytes) << " on stage " << s->stage
        << ", which no policy can move while its MoE layer runs\n";
    return;
  }
  out << (any_unknown ? ": covers balanced routing (the worst routing is not computed with tensor "
                        "parallelism)\n"
                      : ": leaves room for any routing\n");
}

google::protobuf::Value MemoryJson(const std::vector<StageMemory>& stages) {
  google::protobuf::Value v;
  auto* list = v.mutable_list_value();
  for (const StageMemory& s : stages) {
    auto& f = *list->add_values()->mutable_struct_value()->mutable_fields();
    f["stage"].set_number_value(s.stage);
    f["first_layer"].set_number_value(s.first_layer);
    f["end_layer"].set_number_value(s.end_layer);
    f["ranks"].set_number_value(s.ranks);
    f["parameters"].set_number_value(static_cast<double>(s.parameters));
    f["model_state_bytes"].set_number_value(static_cast<double>(s.model_state_bytes));
    f["bf16_mirror_bytes"].set_number_value(static_cast<double>(s.bf16_mirror_bytes));
    f["micro_batches_in_flight"].set_number_value(s.micro_batches_in_flight);
    auto& a = *f["activation_bytes"].mutable_struct_value()->mutable_fields();
    for (const PolicyActivationBytes& b : s.policies) {
      auto& e = *a[b.policy].mutable_struct_value()->mutable_fields();
      e["one_micro_batch"].set_number_value(static_cast<double>(b.one));
      e["in_flight"].set_number_value(static_cast<double>(b.in_flight));
      if (b.worst_in_flight) {
        e["worst_routing_in_flight"].set_number_value(static_cast<double>(*b.worst_in_flight));
      } else {
        e["worst_routing_in_flight"].set_null_value(google::protobuf::NULL_VALUE);
      }
    }
    f["least_activation_bytes"].set_number_value(static_cast<double>(s.least_activation_bytes));
    if (s.any_routing_bytes) {
      f["any_routing_bytes"].set_number_value(static_cast<double>(*s.any_routing_bytes));
    } else {
      f["any_routing_bytes"].set_null_value(google::protobuf::NULL_VALUE);
    }
  }
  return v;
}

std::string GroupPlace(int size, bool intra, bool fitted) {
  if (size <= 1) return absl::StrCat(size, " (no collective)");
  if (fitted) return absl::StrCat(size);
  return absl::StrCat(size, intra ? " intra-node" : " inter-node");
}

}  // namespace

IntraNode PlanIntraNode(const topology::Topology& topology, int ranks_per_node) {
  using topology::GroupKind;
  const int rpn = std::max(1, ranks_per_node);
  IntraNode out;
  for (int r = 0; r < topology.world_size(); ++r) {
    const int node = r / rpn;
    const auto on_node = [&](const std::vector<int>& group) {
      return std::all_of(group.begin(), group.end(), [&](int m) { return m / rpn == node; });
    };
    out.tp = out.tp && on_node(topology.Group(GroupKind::kTensor, r));
    out.esp = out.esp && on_node(topology.Group(GroupKind::kExpertShard, r));
    for (int m : topology.Group(GroupKind::kExpert, r)) {
      out.ep = out.ep && on_node(topology.Group(GroupKind::kExpertShard, m));
    }
  }
  return out;
}

absl::StatusOr<int> RunPlan(const CommandContext& ctx, const std::string& path,
                            const PlanOptions& options) {
  absl::StatusOr<std::string> yaml = ReadText(path, "job file");
  if (!yaml.ok()) return absl::InvalidArgumentError(yaml.status().message());  // as submit
  ASSIGN_OR_RETURN(const v1::JobSpec spec, spec::ParseJobYaml(*yaml, path));
  if (spec.kind() != "train") {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": a ", spec.kind(),
                     " job builds no model and has no MoE schedule to plan (plan "
                     "takes a train job)"));
  }
  const v1::ModelSpec& m = spec.model();
  const v1::ParallelSpec& p = spec.parallel();
  const v1::MoeSpec& moe_spec = spec.moe();

  std::vector<int> moe_layers;
  const uint32_t every = std::max<uint32_t>(m.moe_every(), 1);
  for (uint32_t l = 0; l < m.layers(); ++l) {
    if (l % every == every - 1) moe_layers.push_back(static_cast<int>(l));
  }

  // Whether the ESP group is the TP group (deepspeed's experts then sliced): the spec's layout
  // as the ranks build it (worker/rank_groups.cc TopologyFromTask reads the same fields; the CLI
  // may not link worker/, nor runtime/ the proto). The spec was validated.
  absl::StatusOr<topology::Topology> topo = TopologyOf(spec);
  if (!topo.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": parallel: ", topo.status().message()));
  }
  const moe::LayerShape shape{.N = int64_t{p.micro_batch()} * m.seq_len(),
                              .C = static_cast<int>(m.d_model()),
                              .f = static_cast<int>(m.expert_ffn()),
                              .E = static_cast<int>(moe_spec.experts()),
                              .k = static_cast<int>(moe_spec.top_k()),
                              .capacity_factor = moe_spec.capacity_factor(),
                              .tp = static_cast<int>(p.tp()),
                              .ep = static_cast<int>(p.ep()),
                              .esp = static_cast<int>(p.esp()),
                              .esp_is_tp = topo->EspGroupIsTpGroup()};
  const int world = static_cast<int>(spec::WorldSize(spec));
  const int rpn = options.ranks_per_node > 0 ? options.ranks_per_node : world;
  const IntraNode intra = PlanIntraNode(*topo, rpn);

  moe::CostProfile profile;
  const bool fitted = !options.profile.empty();
  if (fitted) {
    absl::StatusOr<std::string> text = ReadText(options.profile, "cost profile");
    if (!text.ok()) return LocalError(text.status());
    absl::StatusOr<moe::CostProfile> parsed = moe::CostProfile::FromJson(*text);
    if (!parsed.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(options.profile, ": ", parsed.status().message()));
    }
    profile = *std::move(parsed);
  } else {
    profile = moe::DefaultProfile(intra.tp, intra.ep, intra.esp);
  }

  const moe::Choice choice = moe::ChooseSchedule(profile, shape);
  const std::string layers = absl::StrJoin(moe_layers, ", ");
  // What auto's ranks then time (runtime/moe/trial.h): more than deepspeed alone, or nothing.
  std::vector<std::string> tried;
  for (moe::Schedule s : moe::TrialCandidates(choice, shape)) tried.push_back(moe::ScheduleName(s));
  if (tried.size() < 2) tried.clear();

  // The schedule the ranks run (auto: the cost model's pick here; the ranks pick with a profile
  // measured on their own groups, so theirs can differ). Tensor parallelism 1: deepspeed.
  moe::Schedule running = moe::Schedule::kDeepspeed;
  if (moe_spec.schedule() == "auto") {
    running = choice.schedule;
  } else if (const std::optional<moe::Schedule> named = moe::ParseSchedule(moe_spec.schedule());
             named.has_value()) {
    running = *named;
  }
  const std::vector<StageMemory> memory = PlanMemory(spec, *topo, running);

  if (ctx.json) {
    google::protobuf::Struct result;
    auto& f = *result.mutable_fields();
    f["job"].set_string_value(spec.name());
    auto* layer_list = f["moe_layers"].mutable_list_value();
    for (int l : moe_layers) layer_list->add_values()->set_number_value(l);
    auto& s = *f["shape"].mutable_struct_value()->mutable_fields();
    s["N"].set_number_value(static_cast<double>(shape.N));
    s["C"].set_number_value(shape.C);
    s["f"].set_number_value(shape.f);
    s["E"].set_number_value(shape.E);
    s["k"].set_number_value(shape.k);
    s["capacity_factor"].set_number_value(shape.capacity_factor);
    s["tp"].set_number_value(shape.tp);
    s["ep"].set_number_value(shape.ep);
    s["esp"].set_number_value(shape.esp);
    f["profile"].set_string_value(profile.source);
    auto* schedules = f["schedules"].mutable_list_value();
    for (const moe::Prediction& pred : choice.all) {
      auto& e = *schedules->add_values()->mutable_struct_value()->mutable_fields();
      e["schedule"].set_string_value(moe::ScheduleName(pred.schedule));
      e["sliced_experts"].set_bool_value(pred.sliced);
      e["forward_s"].set_number_value(pred.forward_s);
      e["backward_s"].set_number_value(pred.backward_s);
      e["forward_bytes"] = BytesJson(pred.forward_bytes);
      e["backward_bytes"] = BytesJson(pred.backward_bytes);
      e["forward_ops"].set_string_value(
          moe::OpListString(moe::ForwardOps(pred.schedule, pred.sliced)));
      e["backward_ops"].set_string_value(
          moe::OpListString(moe::BackwardOps(pred.schedule, pred.sliced)));
    }
    auto& a = *f["auto"].mutable_struct_value()->mutable_fields();
    a["schedule"].set_string_value(moe::ScheduleName(choice.schedule));
    a["reason"].set_string_value(choice.reason);
    auto* trial = a["trial"].mutable_list_value();
    for (const std::string& name : tried) trial->add_values()->set_string_value(name);
    f["job_schedule"].set_string_value(moe_spec.schedule());
    f["memory"] = MemoryJson(memory);
    f["memory_schedule"].set_string_value(moe::ScheduleName(running));
    RETURN_IF_ERROR(PrintJson(result, *ctx.out));
    return kExitOk;
  }

  std::ostream& out = *ctx.out;
  out << "job " << spec.name() << ": " << m.layers() << " layers, MoE layers "
      << (moe_layers.empty() ? "none" : layers) << "\n";
  if (moe_layers.empty()) {  // (the spec refuses it today: moe_every <= layers)
    PrintMemory(out, spec, memory, running);
    return kExitOk;
  }
  out << "MoE layer shape (every MoE layer): N " << shape.N << " tokens per rank per micro-batch ("
      << "micro_batch " << p.micro_batch() << " x seq_len " << m.seq_len() << "), d_model "
      << shape.C << ", expert_ffn " << shape.f << ", experts " << shape.E << ", top_k " << shape.k
      << ", "
      << (shape.capacity_factor > 0 ? absl::StrCat("capacity_factor ", shape.capacity_factor)
                                    : std::string("dropless"))
      << "; " << moe::RoutedRows(shape) << " routed rows\n";
  out << "groups: tp " << GroupPlace(shape.tp, intra.tp, fitted) << ", ep "
      << GroupPlace(shape.ep, intra.ep, fitted) << ", esp "
      << GroupPlace(shape.esp, intra.esp, fitted)
      << (fitted ? "" : absl::StrCat(" (", world, " ranks, ", rpn, " per node)")) << "\n";
  out << "profile: " << profile.source << "\n";
  for (const moe::Prediction& pred : choice.all) {
    out << "\n"
        << moe::ScheduleName(pred.schedule) << ": forward " << Ms(pred.forward_s) << ", backward "
        << Ms(pred.backward_s) << ", total " << Ms(pred.total_s()) << "\n";
    out << "  forward bytes   " << Bytes(pred.forward_bytes) << "\n";
    out << "  backward bytes  " << Bytes(pred.backward_bytes) << "\n";
    out << "  forward ops     " << moe::OpListString(moe::ForwardOps(pred.schedule, pred.sliced))
        << "\n";
    out << "  backward ops    " << moe::OpListString(moe::BackwardOps(pred.schedule, pred.sliced))
        << "\n";
  }
  out << "\nauto: " << moe::ScheduleName(choice.schedule) << " (" << choice.reason << ")\n";
  if (!tried.empty()) {
    out << "  the ranks then time the MoE layer under " << absl::StrJoin(tried, ", ")
        << " (predicted within " << moe::TrialOptions().window
        << "x of the best) and run the one measured fastest by 5% (deepspeed first, then the "
           "predicted order)";
    if (spec.memory().device_budget() > 0) {
      out << ": not under memory.device_budget, where this pick stands";
    }
    out << "\n";
  }
  out << "the job's moe.schedule: " << moe_spec.schedule() << "\n";
  PrintMemory(out, spec, memory, running);
  return kExitOk;
}

}  // namespace furnace::cli
