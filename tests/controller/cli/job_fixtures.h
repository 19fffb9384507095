// JobDetail builders shared by the CLI tests.
#pragma once

#include <string>

#include "furnace/v1/controller.pb.h"

namespace furnace::cli::testing {

inline constexpr double kT0 = 1'700'000'000.0;

inline v1::JobDetail MakeJob(v1::JobState state, uint32_t attempt, uint64_t step,
                             uint64_t total = 10) {
  v1::JobDetail job;
  auto* s = job.mutable_summary();
  s->set_job_id("j-1");
  s->set_name("cc-smoke");
  s->set_kind("commcheck");
  s->set_state(state);
  s->set_attempt(attempt);
  s->set_restarts(attempt > 0 ? attempt - 1 : 0);
  s->set_world_size(2);
  s->set_submitted_unix(kT0);
  s->set_updated_unix(kT0 + 65);
  s->set_step(step);
  s->set_total_steps(total);
  return job;
}

inline void AddEvent(v1::JobDetail* job, double t, const std::string& kind,
                     const std::string& message) {
  auto* e = job->add_events();
  e->set_unix_time(t);
  e->set_kind(kind);
  e->set_message(message);
}

inline void AddComm(v1::JobDetail* job, const std::string& collective, uint64_t bytes,
                    double algbw) {
  auto* c = job->add_comm();
  c->set_collective(collective);
  c->set_bytes(bytes);
  c->set_world_size(2);
  c->set_time_s(static_cast<double>(bytes) / (algbw * 1e9));
  c->set_algbw_gbps(algbw);
  c->set_busbw_gbps(algbw);
  c->set_verified(true);
}

// A train job at step 50/100 whose rank 0 reported a full set of training figures: two MoE layers
// of four experts each, a Markov entropy floor, a 64 MiB budget.
inline v1::JobDetail MakeTrainJob(v1::JobState state = v1::JOB_RUNNING) {
  v1::JobDetail job = MakeJob(state, 1, 50, 100);
  job.mutable_summary()->set_name("tiny");
  job.mutable_summary()->set_kind("train");
  v1::StepTelemetry& t = *job.mutable_telemetry();
  t.set_loss(2.4512);
  t.set_aux_loss(0.0123);
  t.set_tokens(8192);
  t.set_tokens_per_second(12345);
  t.set_step_seconds(0.25);
  t.set_forward_backward_seconds(0.2);
  t.set_optimizer_seconds(0.03);
  t.set_mfu(0.034);
  t.set_grad_norm(1.25);
  t.set_lr(3e-4);
  t.set_dropped_tokens(12);
  t.mutable_memory()->set_activation_peak_bytes(14050918);  // 13.4 MiB
  t.mutable_memory()->set_budget_bytes(64 << 20);
  t.set_model_flops(1e12);
  t.set_entropy_floor(2.1);
  const double imbalance[2] = {1.34, 1.12};
  const uint64_t tokens[2][4] = {{700, 500, 400, 448}, {560, 512, 500, 476}};
  for (int l = 0; l < 2; ++l) {
    v1::MoeLayerTelemetry* layer = t.add_moe_layers();
    layer->set_layer(l);
    layer->set_imbalance(imbalance[l]);
    layer->set_schedule(v1::MOE_LAYER_SCHEDULE_DEEPSPEED);
    for (int e = 0; e < 4; ++e) layer->add_expert_tokens(tokens[l][e]);
  }
  return job;
}

}  // namespace furnace::cli::testing
