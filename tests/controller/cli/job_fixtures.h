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
  auto& m = *job.mutable_metrics();
  m["loss"] = 2.4512;
  m["aux_loss"] = 0.0123;
  m["tokens"] = 8192;
  m["tokens_per_second"] = 12345;
  m["step_seconds"] = 0.25;
  m["forward_backward_seconds"] = 0.2;
  m["optimizer_seconds"] = 0.03;
  m["mfu"] = 0.034;
  m["grad_norm"] = 1.25;
  m["lr"] = 3e-4;
  m["dropped_tokens"] = 12;
  m["activation_peak_bytes"] = 14050918;  // 13.4 MiB
  m["memory_budget_bytes"] = 64 << 20;
  m["model_flops"] = 1e12;
  m["entropy_floor"] = 2.1;
  m["imbalance_max"] = 1.34;
  m["imbalance.0"] = 1.34;
  m["imbalance.1"] = 1.12;
  const double tokens[2][4] = {{700, 500, 400, 448}, {560, 512, 500, 476}};
  for (int l = 0; l < 2; ++l) {
    for (int e = 0; e < 4; ++e) {
      m["expert_tokens." + std::to_string(l) + "." + std::to_string(e)] = tokens[l][e];
    }
  }
  return job;
}

}  // namespace furnace::cli::testing
