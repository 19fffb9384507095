#include "tests/runtime/parallel/layout_run.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kernels/blas.h"
#include "runtime/base/status.h"
#include "runtime/comm/comm_watchdog.h"
#include "runtime/comm/device_staging.h"
#include "runtime/comm/emulated_transport.h"
#include "runtime/comm/file_kv_store.h"
#include "runtime/comm/gloo_communicator.h"
#include "runtime/data/markov.h"
#include "runtime/data/sampler.h"
#include "runtime/device/current_stream.h"
#include "runtime/device/device.h"
#include "runtime/device/emulated_device.h"
#include "runtime/memory/copy_engine.h"
#include "runtime/model/gpt_moe.h"
#include "runtime/tensor/arena.h"
#include "runtime/tensor/host_pool.h"
#include "runtime/tensor/transfer.h"
#include "runtime/train/moe_schedules.h"
#include "runtime/train/rank_layout.h"
#include "runtime/train/trainer.h"
#include "tests/runtime/comm/fork_world.h"

namespace furnace::testing {
namespace {

struct Trained {
  std::vector<double> loss, aux, norm;
  std::vector<bool> routing_spike;                      // per step
  std::vector<std::vector<int64_t>> tokens_per_expert;  // per step, layers x E flattened
  std::vector<double> eval_loss;                        // per evaluation
  int in_flight_peak = 0;
  std::vector<int64_t> comm_bytes = std::vector<int64_t>(comm::kNumCollectiveOps, 0);
  model::StashActionStats stash;
  std::vector<int64_t> activation_peak, predicted_peak, decisions, emergencies;  // per step
  std::vector<int64_t> agreements;                                               // per step
};

// The device a rank trains on (LayoutCase::device) and its compute stream.
struct RankDevice {
  std::unique_ptr<device::Device> device;
  std::unique_ptr<device::Stream> stream;
};

absl::StatusOr<RankDevice> MakeRankDevice(device::Kind kind) {
  RankDevice d;
  if (kind == device::Kind::kEmulated) {
    ASSIGN_OR_RETURN(d.device, device::CreateEmulatedDevice({.memory_bytes = size_t{256} << 20}));
  } else {
    d.device = device::CreateCpuDevice();
  }
  ASSIGN_OR_RETURN(d.stream, d.device->CreateStream());
  return d;
}

// The model's parameters in host memory.
std::vector<float> HostParams(model::GptMoe& model) {
  std::vector<float> out(model.num_params());
  const absl::Status s = tensor::CopyToHost(model.device(), out.data(), model.param_data(),
                                            out.size() * sizeof(float));
  if (!s.ok()) out.assign(out.size(), std::numeric_limits<float>::quiet_NaN());
  return out;
}

// What the model's stash actions go through; made before the model, which must not outlive it.
struct MemoryActions {
  std::unique_ptr<memory::CopyEngine> engine;
  std::unique_ptr<tensor::HostPool> host;
};

absl::StatusOr<MemoryActions> MakeMemoryActions(const LayoutCase& c, device::Device& device) {
  MemoryActions m;
  if (c.offload_ratio > 0 || c.policy == memory::MemoryPolicy::kAdaptive) {
    memory::CopyEngineOptions options;
    options.host_link_gbps = c.host_link_gbps;
    ASSIGN_OR_RETURN(m.engine, memory::CopyEngine::Create(device, options));
    m.host = std::make_unique<tensor::HostPool>(device, 0);
  }
  return m;
}

absl::Status ApplyMemoryActions(const LayoutCase& c, MemoryActions& m, model::GptMoe& model,
                                comm::Communicator* world = nullptr) {
  model.SetCompress(c.compress);
  if (c.policy == memory::MemoryPolicy::kAdaptive) {
    if (std::getenv("FURNACE_PLANNER_LOG") != nullptr) {  // the planner's decisions, for debugging
      model.SetPlannerLog(
          [](const std::string& line) { std::fprintf(stderr, "%s\n", line.c_str()); });
    }
    model::GptMoe::AdaptiveOptions options;
    options.drop_group = c.agree_drops ? world : nullptr;
    return c.adaptive_offload ? model.SetAdaptive(m.engine.get(), m.host.get(), options)
                              : model.SetAdaptive(nullptr, nullptr, options);
  }
  if (m.engine == nullptr) return absl::OkStatus();
  return model.SetOffload(c.offload_ratio, m.engine.get(), m.host.get());
}

// The training data, or (held_out) the held-out stream: the same chain, another seed. Rank
// c.other_data_rank's chain is another one.
absl::StatusOr<std::unique_ptr<data::Sampler>> MakeSampler(const LayoutCase& c, int rank,
                                                           bool held_out = false) {
  data::MarkovConfig mc;
  mc.vocab = c.model.vocab;
  mc.seed = c.seed + 1 + (rank >= 0 && rank == c.other_data_rank ? 100 : 0);
  ASSIGN_OR_RETURN(data::MarkovChain chain, data::MarkovChain::Create(mc));
  data::SamplerConfig sc;
  sc.batch = c.micro_batch;
  sc.seq_len = c.model.seq_len;
  sc.seed = held_out ? c.seed + 1000 : c.seed;
  return data::MakeMarkovSampler(std::move(chain), sc);
}

train::TrainConfig TrainConfigOf(const LayoutCase& c, int micro_batches) {
  train::TrainConfig tc;
  tc.steps = c.steps;
  tc.micro_batches = micro_batches;
  tc.seed = c.seed;
  tc.schedule.lr = c.lr;
  tc.schedule.warmup_steps = 2;
  tc.schedule.max_steps = c.steps;
  tc.clip = 1.0;
  tc.eval.every = c.eval_every;
  tc.eval.batches = c.eval_batches;
  return tc;
}

// rank: the world rank (-1: the single process).
absl::StatusOr<Trained> Train(const LayoutCase& c, model::GptMoe& model, int micro_batches,
                              const train::ParallelRuntime* parallel, int rank) {
  ASSIGN_OR_RETURN(std::unique_ptr<data::Sampler> sampler, MakeSampler(c, rank));
  ASSIGN_OR_RETURN(std::unique_ptr<data::Sampler> held_out, MakeSampler(c, rank, true));
  ASSIGN_OR_RETURN(std::unique_ptr<train::Trainer> trainer,
                   train::Trainer::Create(&model, sampler.get(), TrainConfigOf(c, micro_batches),
                                          nullptr, parallel, held_out.get()));
  RETURN_IF_ERROR(trainer->CheckSameData());  // as a worker's rank does before training
  Trained t;
  if (c.eval_every > 0) {  // the initial parameters, the same on every layout
    ASSIGN_OR_RETURN(const train::EvalResult e, trainer->Evaluate());
    t.eval_loss.push_back(e.loss);
  }
  for (int s = 0; s < c.steps; ++s) {
    ASSIGN_OR_RETURN(train::StepStats st, trainer->Step());
    if (train::EvalDue(trainer->config().eval, trainer->step(), c.steps)) {
      ASSIGN_OR_RETURN(const train::EvalResult e, trainer->Evaluate());
      t.eval_loss.push_back(e.loss);
    }
    t.loss.push_back(st.loss);
    t.aux.push_back(st.aux_loss);
    t.norm.push_back(st.grad_norm);
    t.routing_spike.push_back(st.routing_spike);
    std::vector<int64_t> counts;
    for (const std::vector<int64_t>& layer : st.tokens_per_expert) {
      counts.insert(counts.end(), layer.begin(), layer.end());
    }
    t.tokens_per_expert.push_back(std::move(counts));
    t.in_flight_peak = std::max(t.in_flight_peak, st.in_flight_peak);
    t.activation_peak.push_back(st.activation_peak_bytes);
    t.predicted_peak.push_back(st.predicted_peak_bytes);
    t.decisions.push_back(st.memory_actions.planner_decisions);
    t.emergencies.push_back(st.memory_actions.emergency_offloads);
    t.agreements.push_back(st.memory_actions.agreements);
    for (const train::CommStats& cs : st.comm) t.comm_bytes[static_cast<int>(cs.op)] += cs.bytes;
  }
  t.stash = model.stash().action_stats();
  return t;
}

int64_t GlobalNumel(const train::ParamInfo& p) {
  if (!p.shard.sharded()) return p.numel();
  int64_t n = 1;
  for (int64_t d : p.shard.global_shape) n *= d;
  return n;
}

template <typename T>
void Put(std::ofstream& out, const T& v) {
  out.write(reinterpret_cast<const char*>(&v), sizeof(T));
}
template <typename T>
bool Take(std::ifstream& in, T& v) {
  return static_cast<bool>(in.read(reinterpret_cast<char*>(&v), sizeof(T)));
}

std::string RankFile(const std::string& dir, int rank) {
  return absl::StrCat(dir, "/rank-", rank, ".bin");
}

absl::Status WriteRank(const std::string& path, const Trained& t, const model::GptMoe& model) {
  std::ofstream out(path, std::ios::binary);
  Put<int32_t>(out, static_cast<int32_t>(t.loss.size()));
  for (size_t s = 0; s < t.loss.size(); ++s) {
    Put(out, t.loss[s]);
    Put(out, t.aux[s]);
    Put(out, t.norm[s]);
    Put<int8_t>(out, t.routing_spike[s] ? 1 : 0);
    Put<int32_t>(out, static_cast<int32_t>(t.tokens_per_expert[s].size()));
    for (int64_t c : t.tokens_per_expert[s]) Put(out, c);
    Put(out, t.activation_peak[s]);
    Put(out, t.predicted_peak[s]);
    Put(out, t.decisions[s]);
    Put(out, t.emergencies[s]);
    Put(out, t.agreements[s]);
  }
  Put<int32_t>(out, static_cast<int32_t>(t.eval_loss.size()));
  for (double e : t.eval_loss) Put(out, e);
  Put<int32_t>(out, t.in_flight_peak);
  for (int64_t b : t.comm_bytes) Put(out, b);
  Put(out, t.stash);
  Put<int64_t>(out, model.planner_stats().agreed_drops);
  const auto PutString = [&out](const std::string& text) {
    Put<int32_t>(out, static_cast<int32_t>(text.size()));
    out.write(text.data(), static_cast<std::streamsize>(text.size()));
  };
  const std::map<std::string, moe::ExchangeCounters::Entry> ops =
      model.moe_op_counters().Snapshot();
  Put<int32_t>(out, static_cast<int32_t>(ops.size()));
  for (const auto& [name, entry] : ops) {
    PutString(name);
    Put<int64_t>(out, entry.bytes);
  }
  const std::vector<moe::Schedule> schedules = model.MoeSchedules();
  Put<int32_t>(out, static_cast<int32_t>(schedules.size()));
  for (moe::Schedule sc : schedules) PutString(moe::ScheduleName(sc));
  Put<int32_t>(out, static_cast<int32_t>(model.params().size()));
  const std::vector<float> host = HostParams(const_cast<model::GptMoe&>(model));
  const float* data = host.data();
  for (const train::ParamInfo& p : model.params()) {
    Put<int32_t>(out, static_cast<int32_t>(p.name.size()));
    out.write(p.name.data(), static_cast<std::streamsize>(p.name.size()));
    Put<int64_t>(out, GlobalNumel(p));
    Put<int64_t>(out, p.numel());
    for (int64_t i = 0; i < p.numel(); ++i) {
      Put<int64_t>(out, p.GlobalIndex(i));
      Put<float>(out, data[p.offset + i]);
    }
  }
  out.close();
  if (!out) return absl::InternalError(absl::StrCat("cannot write ", path));
  return absl::OkStatus();
}

// moe.schedule as a worker applies it (auto: calibrated on this layout's groups, no cache).
absl::Status SetSchedules(const LayoutCase& c, model::GptMoe& model,
                          const train::RankLayout& layout) {
  ASSIGN_OR_RETURN(
      const train::MoeScheduleChoice choice,
      train::ChooseMoeSchedules(c.schedule, model, layout, c.micro_batch, "", c.trial));
  return model.SetMoeSchedules(choice.per_layer);
}

int ChildMain(const LayoutCase& c, const std::string& dir, int rank) {
  kernels::cpu::SetBlasThreads(1);
  auto run = [&]() -> absl::Status {
    ASSIGN_OR_RETURN(topology::Topology topo,
                     topology::Topology::Create(c.sizes, c.sizes.world(), train::DimsOf(c.model)));
    // The device outlives everything below: the communicators stage through it.
    ASSIGN_OR_RETURN(RankDevice dev, MakeRankDevice(c.device));
    device::StreamScope scope(*dev.stream);
    comm::FileKvStore store(dir + "/kv");
    std::shared_ptr<comm::CommWatchdog> watchdog;  // the rank's, for stream communicators
    auto* emulated = dynamic_cast<device::EmulatedDevice*>(dev.device.get());
    if (c.stream_comms) {
      if (emulated == nullptr) return absl::InvalidArgumentError("stream_comms needs emulated");
      ASSIGN_OR_RETURN(watchdog, comm::CommWatchdog::Create({.timeout_s = 60}));
    }
    const train::CommFactory factory =
        [&](const std::string& prefix, const std::string& name, int r,
            int size) -> absl::StatusOr<std::unique_ptr<comm::Communicator>> {
      comm::GlooOptions o;
      o.rank = r;
      o.size = size;
      o.timeout_s = 60;
      ASSIGN_OR_RETURN(std::unique_ptr<comm::Communicator> gloo,
                       comm::CreateGlooCommunicator(store, prefix, name, r, size, o));
      if (c.stream_comms) {
        return comm::CreateEmulatedStreamCommunicator(std::move(gloo), *emulated, watchdog,
                                                      {.timeout_s = 60});
      }
      return comm::ForDevice(std::move(gloo), *dev.device);
    };
    ASSIGN_OR_RETURN(std::unique_ptr<train::RankLayout> layout,
                     train::BuildRankLayout(topo, rank, c.model, factory));
    device::Device& cpu = *dev.device;
    tensor::DeviceArena arena(cpu, c.device_budget);
    ASSIGN_OR_RETURN(MemoryActions actions, MakeMemoryActions(c, cpu));
    ASSIGN_OR_RETURN(
        std::unique_ptr<model::GptMoe> model,
        model::GptMoe::Create(c.model, c.seed, cpu, arena, layout->shard, layout->model_groups()));
    RETURN_IF_ERROR(model->SetMemoryPolicy(c.policy));
    RETURN_IF_ERROR(ApplyMemoryActions(c, actions, *model, layout->world.get()));
    RETURN_IF_ERROR(SetSchedules(c, *model, *layout));
    if (c.budget_at_routing_bound) {
      const std::optional<int64_t> bound = model->RoutingBoundActivationBytes(c.micro_batch);
      if (!bound.has_value())
        return absl::InvalidArgumentError("no routing bound (tp > 1: not computed)");
      arena.set_budget(static_cast<uint64_t>(*bound));
    }
    ASSIGN_OR_RETURN(Trained t, Train(c, *model, c.micro_batches, &layout->runtime, rank));
    return WriteRank(RankFile(dir, rank), t, *model);
  };
  const absl::Status s = run();
  if (!s.ok()) {
    std::fprintf(stderr, "rank %d: %s\n", rank, s.ToString().c_str());
    if (absl::IsAborted(s)) return kRankAborted;
    if (absl::IsResourceExhausted(s)) return kRankResourceExhausted;
    return absl::IsInvalidArgument(s) ? kRankInvalidArgument : 1;
  }
  return 0;
}

}  // namespace

absl::StatusOr<RunResult> RunLayout(const LayoutCase& c, const std::string& dir) {
  const int world = c.sizes.world();
  const std::vector<comm::forked::ChildExit> exits = comm::forked::RunForked(
      world, [&](int rank) { return ChildMain(c, dir, rank); }, 240);
  std::vector<std::string> failed;
  for (const auto& e : exits) {
    if (!e.ok()) failed.push_back(e.Describe());
  }
  if (!failed.empty()) return absl::InternalError(absl::StrJoin(failed, "; "));

  RunResult r;
  std::map<std::string, std::vector<uint8_t>> seen;
  std::map<std::string, float> spread;  // largest replica difference per tensor
  for (int rank = 0; rank < world; ++rank) {
    std::ifstream in(RankFile(dir, rank), std::ios::binary);
    int32_t steps = 0;
    if (!Take(in, steps)) return absl::DataLossError(absl::StrCat("rank ", rank, ": no output"));
    r.activation_peak.emplace_back();
    r.predicted_peak.emplace_back();
    r.planner_decisions.emplace_back();
    r.emergency_offloads.emplace_back();
    r.agreements.emplace_back();
    for (int s = 0; s < steps; ++s) {
      double loss = 0, aux = 0, norm = 0;
      Take(in, loss);
      Take(in, aux);
      Take(in, norm);
      int8_t spike = 0;
      Take(in, spike);
      int32_t n_counts = 0;
      Take(in, n_counts);
      std::vector<int64_t> counts(std::max(0, n_counts));
      for (int64_t& c : counts) Take(in, c);
      int64_t peak = 0, predicted = 0, decisions = 0, emergencies = 0, agreements = 0;
      Take(in, peak);
      Take(in, predicted);
      Take(in, decisions);
      Take(in, emergencies);
      Take(in, agreements);
      r.agreements.back().push_back(agreements);
      r.activation_peak.back().push_back(peak);
      r.predicted_peak.back().push_back(predicted);
      r.planner_decisions.back().push_back(decisions);
      r.emergency_offloads.back().push_back(emergencies);
      if (rank == 0) {
        r.loss.push_back(loss);
        r.aux_loss.push_back(aux);
        r.grad_norm.push_back(norm);
        r.routing_spike.push_back(spike != 0);
        r.tokens_per_expert.push_back(std::move(counts));
      } else if (loss != r.loss[s] || norm != r.grad_norm[s] ||
                 (spike != 0) != r.routing_spike[s] || counts != r.tokens_per_expert[s]) {
        return absl::InternalError(absl::StrCat(
            "rank ", rank, " reports loss ", loss, " norm ", norm, " spike ", spike,
            " expert tokens ", absl::StrJoin(counts, ","), " at step ", s, "; rank 0: ", r.loss[s],
            " ", r.grad_norm[s], " ", r.routing_spike[s] ? 1 : 0, " ",
            absl::StrJoin(r.tokens_per_expert[s], ",")));
      }
    }
    int32_t n_eval = 0;
    Take(in, n_eval);
    std::vector<double> evals(std::max(0, n_eval));
    for (double& e : evals) Take(in, e);
    if (rank == 0) {
      r.eval_loss = evals;
    } else if (evals != r.eval_loss) {
      return absl::InternalError(absl::StrCat("rank ", rank, " reports held-out losses ",
                                              absl::StrJoin(evals, ","),
                                              "; rank 0: ", absl::StrJoin(r.eval_loss, ",")));
    }
    int32_t in_flight = 0;
    Take(in, in_flight);
    r.in_flight_peak.push_back(in_flight);
    std::vector<int64_t> bytes(comm::kNumCollectiveOps);
    for (int64_t& b : bytes) Take(in, b);
    r.comm_bytes.push_back(bytes);
    model::StashActionStats stash;
    Take(in, stash);
    r.stash_actions.push_back(stash);
    int64_t agreed = 0;
    Take(in, agreed);
    r.agreed_drops.push_back(agreed);
    const auto TakeString = [&in]() {
      int32_t len = 0;
      Take(in, len);
      std::string text(static_cast<size_t>(std::max(0, len)), '\0');
      in.read(text.data(), len);
      return text;
    };
    int32_t n_ops = 0;
    Take(in, n_ops);
    r.moe_op_bytes.emplace_back();
    for (int32_t i = 0; i < n_ops; ++i) {
      const std::string name = TakeString();
      int64_t bytes = 0;
      Take(in, bytes);
      r.moe_op_bytes.back()[name] = bytes;
    }
    int32_t n_sched = 0;
    Take(in, n_sched);
    r.moe_schedules.emplace_back();
    for (int32_t i = 0; i < n_sched; ++i) r.moe_schedules.back().push_back(TakeString());
    int32_t n = 0;
    Take(in, n);
    for (int32_t i = 0; i < n; ++i) {
      int32_t len = 0;
      Take(in, len);
      std::string name(static_cast<size_t>(len), '\0');
      in.read(name.data(), len);
      int64_t global = 0, local = 0;
      Take(in, global);
      Take(in, local);
      std::vector<float>& whole = r.params[name];
      std::vector<uint8_t>& have = seen[name];
      if (whole.empty()) {
        whole.assign(global, std::numeric_limits<float>::quiet_NaN());
        have.assign(global, 0);
      }
      for (int64_t e = 0; e < local; ++e) {
        int64_t idx = 0;
        float v = 0;
        Take(in, idx);
        Take(in, v);
        if (idx < 0 || idx >= global) return absl::DataLossError("index out of range");
        if (have[idx]) {
          spread[name] = std::max(spread[name], std::fabs(whole[idx] - v));
        } else {
          whole[idx] = v;
          have[idx] = 1;
        }
      }
    }
    if (!in) return absl::DataLossError(absl::StrCat("rank ", rank, ": truncated output"));
  }
  for (const auto& [name, have] : seen) {
    if (std::find(have.begin(), have.end(), 0) != have.end()) {
      return absl::InternalError(absl::StrCat("no rank holds part of ", name));
    }
  }
  for (const auto& [name, diff] : spread) {
    float max = 0;
    for (float v : r.params[name]) max = std::max(max, std::fabs(v));
    if (max > 0) r.replica_spread = std::max(r.replica_spread, static_cast<double>(diff / max));
  }
  return r;
}

absl::StatusOr<RunResult> RunSingle(const LayoutCase& c) {
  kernels::cpu::SetBlasThreads(1);
  ASSIGN_OR_RETURN(RankDevice dev, MakeRankDevice(c.device));
  device::StreamScope scope(*dev.stream);
  device::Device& cpu = *dev.device;
  tensor::DeviceArena arena(cpu, c.device_budget);
  ASSIGN_OR_RETURN(MemoryActions actions, MakeMemoryActions(c, cpu));
  ASSIGN_OR_RETURN(std::unique_ptr<model::GptMoe> model,
                   model::GptMoe::Create(c.model, c.seed, cpu, arena));
  RETURN_IF_ERROR(model->SetMemoryPolicy(c.policy));
  RETURN_IF_ERROR(ApplyMemoryActions(c, actions, *model));
  ASSIGN_OR_RETURN(Trained t, Train(c, *model, c.micro_batches * c.sizes.dp, nullptr, -1));
  RunResult r;
  r.stash_actions.push_back(t.stash);
  r.agreed_drops.push_back(model->planner_stats().agreed_drops);
  r.loss = t.loss;
  r.aux_loss = t.aux;
  r.grad_norm = t.norm;
  r.routing_spike = t.routing_spike;
  r.tokens_per_expert = t.tokens_per_expert;
  r.eval_loss = t.eval_loss;
  r.activation_peak = {t.activation_peak};
  r.predicted_peak = {t.predicted_peak};
  r.planner_decisions = {t.decisions};
  r.emergency_offloads = {t.emergencies};
  r.agreements = {t.agreements};
  const std::vector<float> host = HostParams(*model);
  for (const train::ParamInfo& p : model->params()) {
    const float* d = host.data() + p.offset;
    r.params[p.name] = std::vector<float>(d, d + p.numel());
  }
  return r;
}

model::ModelConfig TinyLayoutModel(int top_k, double capacity_factor) {
  model::ModelConfig c;
  c.vocab = 32;
  c.seq_len = 8;
  c.d_model = 16;
  c.heads = 4;
  c.layers = 4;
  c.moe_every = 2;
  c.dense_ffn = 32;
  c.experts = 4;
  c.expert_ffn = 16;
  c.top_k = top_k;
  c.capacity_factor = capacity_factor;
  c.normalize_topk = top_k > 1;
  return c;
}

}  // namespace furnace::testing
