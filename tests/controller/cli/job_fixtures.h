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

}  // namespace furnace::cli::testing
