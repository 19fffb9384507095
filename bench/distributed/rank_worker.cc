#include "bench/distributed/rank_worker.h"

#include <fstream>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bench/common/stats.h"
#include "kernels/blas.h"
#include "nlohmann/json.hpp"
#include "runtime/base/status.h"
#include "runtime/comm/file_kv_store.h"
#include "runtime/comm/gloo_communicator.h"
#include "runtime/data/markov.h"
#include "runtime/data/sampler.h"
#include "runtime/device/device.h"
#include "runtime/model/gpt_moe.h"
#include "runtime/tensor/arena.h"
#include "runtime/train/rank_layout.h"
#include "runtime/train/trainer.h"

namespace furnace::bench {
namespace {

using json = nlohmann::json;

std::vector<int64_t> Calls(const train::ParallelRuntime& p) {
  std::vector<int64_t> calls(comm::kNumCollectiveOps, 0);
  for (const train::RankGroup& g : p.all_groups) {
    for (int op = 0; op < comm::kNumCollectiveOps; ++op) {
      calls[op] += g.comm->counters().calls(static_cast<comm::CollectiveOp>(op));
    }
  }
  return calls;
}

// Bytes per collective over all of the rank's groups (the report's per-op view).
std::vector<int64_t> BytesPerOp(const train::StepStats& st) {
  std::vector<int64_t> bytes(comm::kNumCollectiveOps, 0);
  for (const train::CommStats& c : st.comm) bytes[static_cast<int>(c.op)] += c.bytes;
  return bytes;
}

}  // namespace

std::string RankFile(const std::string& dir, int rank) {
  return absl::StrCat(dir, "/rank-", rank, ".json");
}

absl::Status RunRank(const RunConfig& config, const std::string& dir, int rank) {
  kernels::cpu::SetBlasThreads(config.blas_threads);
  const model::ModelConfig& mc = config.shape.model;
  ASSIGN_OR_RETURN(
      topology::Topology topo,
      topology::Topology::Create(config.sizes, config.sizes.world(), train::DimsOf(mc)));
  const double t_setup = Now();
  comm::FileKvStore store(dir + "/kv");
  const train::CommFactory factory = [&](const std::string& prefix, const std::string& name, int r,
                                         int size) {
    comm::GlooOptions o;
    o.rank = r;
    o.size = size;
    o.timeout_s = config.timeout_s;
    return comm::CreateGlooCommunicator(store, prefix, name, r, size, o);
  };
  ASSIGN_OR_RETURN(std::unique_ptr<train::RankLayout> layout,
                   train::BuildRankLayout(topo, rank, mc, factory));
  const double setup_s = Now() - t_setup;

  std::unique_ptr<device::Device> cpu = device::CreateCpuDevice();
  tensor::DeviceArena arena(*cpu, 0);
  ASSIGN_OR_RETURN(
      std::unique_ptr<model::GptMoe> model,
      model::GptMoe::Create(mc, config.seed, *cpu, arena, layout->shard, layout->model_groups()));
  ASSIGN_OR_RETURN(data::MarkovChain chain,
                   data::MarkovChain::Create({.vocab = mc.vocab, .seed = config.data_seed}));
  ASSIGN_OR_RETURN(std::unique_ptr<data::Sampler> sampler,
                   data::MakeMarkovSampler(std::move(chain), {.batch = config.shape.micro_batch,
                                                              .seq_len = mc.seq_len,
                                                              .seed = config.seed}));
  train::TrainConfig tc;
  const int total = config.warmup + config.steps;
  tc.steps = total;
  tc.micro_batches = config.shape.micro_batches;
  tc.seed = config.seed;
  tc.schedule.lr = config.lr;
  tc.schedule.warmup_steps = std::min(2, total);
  tc.schedule.max_steps = total;
  tc.clip = 1.0;
  ASSIGN_OR_RETURN(
      std::unique_ptr<train::Trainer> trainer,
      train::Trainer::Create(model.get(), sampler.get(), tc, nullptr, &layout->runtime));

  const topology::Coords& co = layout->coords;
  json out;
  out["rank"] = rank;
  out["coords"] = {{"pp", co.pp},   {"dp", co.dp}, {"tp", co.tp},
                   {"edp", co.edp}, {"ep", co.ep}, {"esp", co.esp}};
  out["setup_s"] = setup_s;
  out["params"] = model->num_params();
  json steps = json::array();
  for (int s = 0; s < total; ++s) {
    const std::vector<int64_t> calls_before = Calls(layout->runtime);
    absl::StatusOr<train::StepStats> st = trainer->Step();
    if (!st.ok()) {
      return absl::Status(st.status().code(),
                          absl::StrCat("step ", s, ": ", st.status().message()));
    }
    std::vector<int64_t> calls = Calls(layout->runtime);
    for (int op = 0; op < comm::kNumCollectiveOps; ++op) calls[op] -= calls_before[op];
    steps.push_back({{"step", st->step},
                     {"warmup", s < config.warmup},
                     {"step_s", st->step_seconds},
                     {"forward_backward_s", st->forward_backward_seconds},
                     {"sync_s", st->sync_seconds},
                     {"optimizer_s", st->optimizer_seconds},
                     {"loss", st->loss},
                     {"tokens", st->tokens},
                     {"in_flight_peak", st->in_flight_peak},
                     {"dropped", st->dropped},
                     {"comm_bytes", BytesPerOp(*st)},
                     {"comm_calls", calls},
                     {"tokens_per_expert", st->tokens_per_expert}});
  }
  out["steps"] = std::move(steps);
  const std::string path = RankFile(dir, rank);
  std::ofstream f(path);
  f << out.dump();
  f.close();
  if (!f) return absl::InternalError(absl::StrCat("cannot write ", path));
  return absl::OkStatus();
}

}  // namespace furnace::bench
