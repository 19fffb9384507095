#include "worker/step_telemetry.h"

#include <algorithm>
#include <utility>

namespace furnace::worker {

furnace::v1::CollectiveOp CollectiveOpOf(comm::CollectiveOp op) {
  switch (op) {
    case comm::CollectiveOp::kAllReduce:
      return furnace::v1::COLLECTIVE_OP_ALL_REDUCE;
    case comm::CollectiveOp::kReduceScatter:
      return furnace::v1::COLLECTIVE_OP_REDUCE_SCATTER;
    case comm::CollectiveOp::kAllGather:
      return furnace::v1::COLLECTIVE_OP_ALL_GATHER;
    case comm::CollectiveOp::kAllToAll:
      return furnace::v1::COLLECTIVE_OP_ALL_TO_ALL;
    case comm::CollectiveOp::kBroadcast:
      return furnace::v1::COLLECTIVE_OP_BROADCAST;
    case comm::CollectiveOp::kSend:
      return furnace::v1::COLLECTIVE_OP_SEND;
    case comm::CollectiveOp::kRecv:
      return furnace::v1::COLLECTIVE_OP_RECV;
    case comm::CollectiveOp::kBarrier:
      return furnace::v1::COLLECTIVE_OP_BARRIER;
  }
  return furnace::v1::COLLECTIVE_OP_UNSPECIFIED;
}

furnace::v1::ParallelGroup ParallelGroupOf(const std::string& kind) {
  static const std::pair<const char*, furnace::v1::ParallelGroup> kGroups[] = {
      {"world", furnace::v1::PARALLEL_GROUP_WORLD},
      {"tp", furnace::v1::PARALLEL_GROUP_TP},
      {"dp", furnace::v1::PARALLEL_GROUP_DP},
      {"pp", furnace::v1::PARALLEL_GROUP_PP},
      {"ep", furnace::v1::PARALLEL_GROUP_EP},
      {"esp", furnace::v1::PARALLEL_GROUP_ESP},
      {"edp", furnace::v1::PARALLEL_GROUP_EDP},
      {"embedding", furnace::v1::PARALLEL_GROUP_EMBEDDING},
  };
  for (const auto& [name, group] : kGroups) {
    if (kind == name) return group;
  }
  return furnace::v1::PARALLEL_GROUP_UNSPECIFIED;
}

furnace::v1::MoeLayerSchedule MoeLayerScheduleOf(const std::string& name) {
  static const std::pair<const char*, furnace::v1::MoeLayerSchedule> kSchedules[] = {
      {"deepspeed", furnace::v1::MOE_LAYER_SCHEDULE_DEEPSPEED},
      {"s1", furnace::v1::MOE_LAYER_SCHEDULE_S1},
      {"s2", furnace::v1::MOE_LAYER_SCHEDULE_S2},
  };
  for (const auto& [n, schedule] : kSchedules) {
    if (name == n) return schedule;
  }
  return furnace::v1::MOE_LAYER_SCHEDULE_UNSPECIFIED;
}

furnace::v1::StepTelemetry StepTelemetryOf(const train::StepStats& s,
                                           const StepTelemetryContext& context) {
  furnace::v1::StepTelemetry t;
  t.set_loss(s.loss);
  t.set_aux_loss(s.aux_loss);
  t.set_tokens(context.reporter ? static_cast<uint64_t>(s.tokens) : 0);
  t.set_tokens_per_second(s.tokens_per_second);
  t.set_step_seconds(s.step_seconds);
  t.set_forward_backward_seconds(s.forward_backward_seconds);
  t.set_optimizer_seconds(s.optimizer_seconds);
  t.set_sync_seconds(s.sync_seconds);
  t.set_checkpoint_seconds(s.checkpoint_seconds);
  t.set_checkpoint_stall_seconds(s.checkpoint_stall_seconds);
  t.set_checkpoint_error(s.checkpoint_error);
  t.set_checkpoint_interval_steps(
      static_cast<uint32_t>(std::max<int64_t>(0, s.checkpoint_interval_steps)));
  t.set_checkpoint_interval_seconds(s.checkpoint_interval_seconds);
  if (s.eval) {
    furnace::v1::EvalTelemetry* e = t.mutable_eval();
    e->set_loss(s.eval->loss);
    e->set_perplexity(s.eval->perplexity);
    e->set_batches(static_cast<uint32_t>(s.eval->batches));
    e->set_tokens(static_cast<uint64_t>(s.eval->tokens));
    e->set_seconds(s.eval->seconds);
    e->set_step(static_cast<uint64_t>(s.step) + 1);
  }
  t.set_mfu(s.mfu);
  t.set_model_flops(s.model_flops);
  t.set_peak_flops(s.peak_flops);
  t.set_grad_norm(s.grad_norm);
  t.set_lr(s.lr);
  t.set_dropped_tokens(static_cast<uint64_t>(s.dropped));
  t.set_entropy_floor(context.entropy_floor);
  t.set_routing_spike(s.routing_spike);
  t.set_moe_schedule_reason(context.moe_schedule_reason);
  for (size_t l = 0; l < s.imbalance.size(); ++l) {
    furnace::v1::MoeLayerTelemetry* layer = t.add_moe_layers();
    layer->set_layer(static_cast<uint32_t>(l));
    layer->set_imbalance(s.imbalance[l]);
    // A model that names no schedule for the layer runs the baseline.
    layer->set_schedule(l < s.moe_schedules.size() ? MoeLayerScheduleOf(s.moe_schedules[l])
                                                   : furnace::v1::MOE_LAYER_SCHEDULE_DEEPSPEED);
    if (context.reporter && l < s.tokens_per_expert.size()) {
      for (int64_t tokens : s.tokens_per_expert[l]) {
        layer->add_expert_tokens(static_cast<uint64_t>(tokens));
      }
    }
  }
  for (const train::CommStats& c : s.comm) {
    furnace::v1::CommTelemetry* comm = t.add_comm();
    comm->set_op(CollectiveOpOf(c.op));
    comm->set_group(ParallelGroupOf(c.group));
    comm->set_bytes(static_cast<uint64_t>(c.bytes));
    comm->set_seconds(c.seconds);
    comm->set_calls(static_cast<uint64_t>(c.calls));
  }
  for (const train::MoeOpTotal& o : s.moe_ops) {
    furnace::v1::MoeOpTelemetry* op = t.add_moe_ops();
    op->set_op(o.op);
    op->set_bytes(static_cast<uint64_t>(std::max<int64_t>(0, o.bytes)));
    op->set_seconds(o.seconds);
    op->set_calls(static_cast<uint64_t>(std::max<int64_t>(0, o.calls)));
  }
  furnace::v1::MemoryTelemetry* memory = t.mutable_memory();
  memory->set_activation_peak_bytes(static_cast<uint64_t>(s.activation_peak_bytes));
  memory->set_budget_bytes(static_cast<uint64_t>(context.memory_budget_bytes));
  memory->set_pipeline_in_flight(static_cast<uint32_t>(s.in_flight_peak));
  memory->set_late_reloads(
      static_cast<uint64_t>(std::max<int64_t>(0, s.memory_actions.late_reloads)));
  memory->set_predicted_peak_bytes(
      static_cast<uint64_t>(std::max<int64_t>(0, s.predicted_peak_bytes)));
  memory->set_planner_seconds(s.memory_actions.planner_seconds);
  memory->set_planner_decisions(
      static_cast<uint32_t>(std::max<int64_t>(0, s.memory_actions.planner_decisions)));
  memory->set_emergency_offloads(
      static_cast<uint32_t>(std::max<int64_t>(0, s.memory_actions.emergency_offloads)));
  memory->set_agreements(static_cast<uint32_t>(std::max<int64_t>(0, s.memory_actions.agreements)));
  memory->set_agreed_drops(
      static_cast<uint32_t>(std::max<int64_t>(0, s.memory_actions.agreed_drops)));
  memory->set_agreement_seconds(s.memory_actions.agreement_seconds);
  const std::pair<furnace::v1::PlannerAction, uint64_t> actions[] = {
      {furnace::v1::PLANNER_ACTION_OFFLOAD, s.memory_actions.offloaded_bytes},
      {furnace::v1::PLANNER_ACTION_COMPRESS, s.memory_actions.compressed_bytes},
      {furnace::v1::PLANNER_ACTION_RECOMPUTE, s.memory_actions.recomputed_bytes},
  };
  for (const auto& [action, bytes] : actions) {
    if (bytes == 0) continue;
    furnace::v1::PlannerActionBytes* p = t.add_planner();
    p->set_action(action);
    p->set_bytes(bytes);
  }
  return t;
}

}  // namespace furnace::worker
