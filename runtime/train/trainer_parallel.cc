// The step of one rank of a parallel layout (parallel.h has the sequence and why). Everything
// that crosses ranks goes through comm::Communicator; a failed collective fails the step with
// its Status, and the caller gives the step (and the job attempt) up.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "runtime/base/status.h"
#include "runtime/checkpoint/durable_file.h"
#include "runtime/checkpoint/reshard.h"
#include "runtime/device/backend.h"
#include "runtime/pipeline/one_f_one_b.h"
#include "runtime/tensor/transfer.h"
#include "runtime/train/trainer.h"

namespace furnace::train {
namespace {

constexpr uint32_t kGradientTag = 1u << 20;  // pipeline tags: activations j, gradients this + j
constexpr int kCountDigit = 8;               // counts travel as three exact floats (ReduceStats)

absl::Status AllReduce(comm::Communicator* group, float* data, int64_t n) {
  if (group == nullptr || group->size() == 1 || n == 0) return absl::OkStatus();
  return group->AllReduce(data, n);
}

// Sums the gradients of the `params` that `select` picks over `group`, packing them into buckets
// of at most bucket_floats (a parameter larger than that is a bucket of its own). The gradients
// and `bucket` (grown to fit) are memory of `device`; the packing is device copies.
template <typename Select>
absl::Status ReduceBucketed(comm::Communicator* group, const std::vector<ParamInfo>& params,
                            Select select, float* grads, int64_t bucket_floats,
                            device::Device& device, tensor::DeviceMemory& bucket) {
  if (group == nullptr || group->size() == 1) return absl::OkStatus();
  int64_t largest = 0, total = 0;
  for (const ParamInfo& p : params) {
    if (!select(p)) continue;
    largest = std::max(largest, p.numel());
    total += p.numel();
  }
  const int64_t capacity = std::max(largest, std::min(bucket_floats, total));
  if (capacity == 0) return absl::OkStatus();
  if (bucket.bytes() < static_cast<uint64_t>(capacity) * sizeof(float)) {
    bucket.Reset();
    ASSIGN_OR_RETURN(
        bucket, tensor::DeviceMemory::Allocate(
                    device, static_cast<uint64_t>(capacity) * sizeof(float), "gradient bucket"));
  }
  float* data = bucket.as<float>();
  int64_t used = 0;
  std::vector<const ParamInfo*> members;
  auto flush = [&]() -> absl::Status {
    if (used == 0) return absl::OkStatus();
    RETURN_IF_ERROR(group->AllReduce(data, used));
    int64_t at = 0;
    for (const ParamInfo* p : members) {
      RETURN_IF_ERROR(
          tensor::CopyOnDevice(device, grads + p->offset, data + at, p->numel() * sizeof(float)));
      at += p->numel();
    }
    used = 0;
    members.clear();
    return absl::OkStatus();
  };
  for (const ParamInfo& p : params) {
    if (!select(p)) continue;
    if (used > 0 && used + p.numel() > bucket_floats) RETURN_IF_ERROR(flush());
    RETURN_IF_ERROR(
        tensor::CopyOnDevice(device, data + used, grads + p.offset, p.numel() * sizeof(float)));
    used += p.numel();
    members.push_back(&p);
  }
  return flush();
}

// Every rank's `mine`, in rank order, on every rank of `group` (just `mine` without a group).
absl::StatusOr<std::vector<std::string>> AllGatherStrings(comm::Communicator* group,
                                                          const std::string& mine) {
  if (group == nullptr || group->size() == 1) return std::vector<std::string>{mine};
  std::vector<int64_t> sizes(group->size());
  const int64_t my_size = static_cast<int64_t>(mine.size());
  RETURN_IF_ERROR(group->AllGather(&my_size, sizes.data(), sizeof(int64_t)));
  int64_t total = 0;
  for (int64_t n : sizes) total += n;
  std::string all(static_cast<size_t>(total), '\0');
  RETURN_IF_ERROR(group->AllGatherV(mine.data(), my_size, all.data(), sizes));
  std::vector<std::string> out;
  int64_t at = 0;
  for (int64_t n : sizes) {
    out.push_back(all.substr(at, n));
    at += n;
  }
  return out;
}

// A failed Status as text for a gather: a one-byte marker '!', its code, its message (text that
// does not start with '!' is a rank's payload: OK).
std::string FailureText(const absl::Status& failed) {
  return absl::StrCat("!", std::string(1, static_cast<char>(failed.code())), failed.message());
}

// The first failure among gathered texts, prefixed with its rank (this rank's own as it is).
absl::Status FirstFailure(const std::vector<std::string>& all, int self, const absl::Status& mine) {
  for (int r = 0; r < static_cast<int>(all.size()); ++r) {
    if (all[r].empty() || all[r][0] != '!') continue;
    if (r == self) return mine;
    return absl::Status(static_cast<absl::StatusCode>(all[r][1]),
                        absl::StrCat("rank ", r, ": ", all[r].substr(2)));
  }
  return absl::OkStatus();
}

// Every rank of `group` returns the same Status: OK when every rank's `mine` is OK, else the
// first failing rank's, prefixed with its rank. Used where a failure may hit some ranks only and
// the others would otherwise go on into collectives their failed peers never join.
absl::Status AgreeOnStatus(comm::Communicator* group, const absl::Status& mine) {
  if (group == nullptr || group->size() == 1) return mine;
  ASSIGN_OR_RETURN(const std::vector<std::string> all,
                   AllGatherStrings(group, mine.ok() ? std::string() : FailureText(mine)));
  return FirstFailure(all, group->rank(), mine);
}

// The counters of every group and op so far (a step's numbers are the difference).
std::vector<CommStats> CommTotals(const ParallelRuntime& P) {
  std::vector<CommStats> totals;
  totals.reserve(P.all_groups.size() * comm::kNumCollectiveOps);
  for (const RankGroup& g : P.all_groups) {
    for (int i = 0; i < comm::kNumCollectiveOps; ++i) {
      const auto op = static_cast<comm::CollectiveOp>(i);
      const comm::CommCounters& c = g.comm->counters();
      totals.push_back({g.kind, op, c.bytes(op), c.calls(op), c.seconds(op)});
    }
  }
  return totals;
}

}  // namespace

absl::Status Trainer::RunSchedule(StepStats& stats, std::vector<MicroBatchResult>& results) {
  const ParallelRuntime& P = *parallel_;
  const data::SamplerConfig& sc = data_->config();
  const int m = config_.micro_batches, B = sc.batch;
  const double global_tokens = static_cast<double>(B) * sc.seq_len * m * P.dp;
  const int64_t act = stage_->ActivationFloats(B);
  const int64_t act_bytes = act * static_cast<int64_t>(sizeof(float));
  // The activations and their gradients between stages: device memory, sent and received as it
  // is (the pipeline group takes device buffers).
  tensor::DeviceMemory buffers[4];
  for (tensor::DeviceMemory& b : buffers) {
    ASSIGN_OR_RETURN(b, tensor::DeviceMemory::Allocate(device_, act_bytes, "pipeline activations"));
  }
  float* x_in = buffers[0].as<float>();
  float* x_out = buffers[1].as<float>();
  float* dx_out = buffers[2].as<float>();
  float* dx_in = buffers[3].as<float>();
  comm::Communicator* pipe = P.pipeline;
  int in_flight = 0;
  stage_->SetInFlightLimit(std::min(P.stages - P.stage, m));
  for (const pipeline::PipelineOp& op : pipeline::OneFOneB(P.stage, P.stages, m)) {
    const int j = op.micro;
    if (op.kind == pipeline::PipelineOp::kForward) {
      data::Batch batch;
      if (P.first_stage() || P.last_stage()) {
        ASSIGN_OR_RETURN(batch, data_->Sample(step_, 0, P.dp_rank * m + j));
      }
      if (!P.first_stage()) RETURN_IF_ERROR(pipe->Recv(x_in, act_bytes, P.stage - 1, j));
      // Micro-batch j of data-parallel rank r is the sampler's micro-batch r * m + j (above).
      stage_->SetStepContext(step_, (int64_t{P.dp_rank} * m + j) * B);
      ASSIGN_OR_RETURN(results[j], stage_->StageForward(j, batch.inputs.data(),
                                                        batch.targets.data(), x_in, B, x_out));
      if (!P.last_stage()) {
        RETURN_IF_ERROR(pipe->Send(x_out, act_bytes, P.stage + 1, j));
        // The first stage calls nothing on the pipeline until its first backward Recv: a
        // transport holding sends until the next call (NCCL) would hold the next stage's input
        // through the whole warm-up. Every other stage's next call is a Recv, which posts them.
        if (P.first_stage()) RETURN_IF_ERROR(pipe->PostSends());
      }
      stats.in_flight_peak = std::max(stats.in_flight_peak, ++in_flight);
      stats.routing_spike = stats.routing_spike || results[j].routing_spike;
    } else {
      if (!P.last_stage()) {
        RETURN_IF_ERROR(pipe->Recv(dx_out, act_bytes, P.stage + 1, kGradientTag + j));
      }
      RETURN_IF_ERROR(
          stage_->StageBackward(j, dx_out, 1.0 / global_tokens, 1.0 / (m * P.dp), dx_in));
      if (!P.first_stage()) {
        RETURN_IF_ERROR(pipe->Send(dx_in, act_bytes, P.stage - 1, kGradientTag + j));
      }
      --in_flight;
    }
  }
  if (pipe != nullptr && pipe->size() > 1) RETURN_IF_ERROR(pipe->WaitSends());
  return absl::OkStatus();
}

absl::Status Trainer::SyncGradients() {
  const ParallelRuntime& P = *parallel_;
  const std::vector<ParamInfo>& params = model_->params();
  float* g = model_->grad_data();
  const int64_t bucket = std::max<int64_t>(1, P.bucket_bytes / static_cast<int64_t>(sizeof(float)));
  const auto replicated_over_tp = [](const ParamInfo& p) {
    return p.sync == GradSync::kData && !p.shard.sharded();
  };
  if (P.tp > 1) {
    // One pass scales by 1/tp what tensor parallelism counts tp times: under the deepspeed
    // schedule with gathered rows every expert saw each token once per tensor-parallel peer, and
    // what TP replicates is averaged over the tensor group (equal in exact arithmetic; the
    // average keeps the replicas bit-identical). What the peers split (tp_partial: the s1 / s2
    // schedules' experts, sliced deepspeed experts, s1's router) is summed as it is.
    const float scale = 1.0f / static_cast<float>(P.tp);
    for (const ParamInfo& p : params) {
      if (p.tp_partial) continue;
      if (p.sync == GradSync::kExpertData || replicated_over_tp(p)) {
        ops_.scale(g + p.offset, scale, p.numel());
      }
    }
    RETURN_IF_ERROR(
        ReduceBucketed(P.tensor, params, replicated_over_tp, g, bucket, device_, bucket_));
  }
  RETURN_IF_ERROR(ReduceBucketed(
      P.data, params, [](const ParamInfo& p) { return p.sync == GradSync::kData; }, g, bucket,
      device_, bucket_));
  RETURN_IF_ERROR(ReduceBucketed(
      P.expert_data, params, [](const ParamInfo& p) { return p.sync == GradSync::kExpertData; }, g,
      bucket, device_, bucket_));
  if (P.stages > 1 && (P.first_stage() || P.last_stage())) {
    for (const ParamInfo& p : params) {
      if (p.name == "wte") RETURN_IF_ERROR(AllReduce(P.embedding, g + p.offset, p.numel()));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<double> Trainer::ClipParallel() {
  const ParallelRuntime& P = *parallel_;
  float* g = model_->grad_data();
  // The parameters this rank counts, in one call (on a GPU one host round trip, not one a tensor).
  const double local = ops_.sum_of_squares_ranges(g, norm_begin_.data(), norm_count_.data(),
                                                  static_cast<int>(norm_begin_.size()));
  // Summed in fp32 over the world: each term is already a double-accumulated partial sum. The
  // same all-reduce carries the asynchronous checkpoint's flags (AsyncAgreement), whether any
  // rank was asked for a checkpointed stop (StopToken), so every rank stops after the same step,
  // and whether any rank's memory planner votes for agreeing on collective drops next step.
  const AsyncAgreement local_async = LocalAsyncState();
  const float stop = run_stop_ != nullptr && run_stop_->checkpointed_stop_requested() ? 1.0f : 0;
  const float wish = model_->CollectiveDropVote() ? 1.0f : 0;
  float sums[6] = {static_cast<float>(local),
                   local_async.writing,
                   local_async.commit_open,
                   local_async.commit_failed,
                   stop,
                   wish};
  RETURN_IF_ERROR(AllReduce(P.world_group, sums, 6));
  async_agreed_ = {.writing = sums[1], .commit_open = sums[2], .commit_failed = sums[3]};
  stop_agreed_ = sums[4] > 0;
  model_->SetAgreeCollectiveDrops(sums[5] > 0);
  const double norm = std::sqrt(static_cast<double>(sums[0]));
  if (config_.clip > 0) {
    const double coef = config_.clip / (norm + 1e-6);
    if (coef < 1.0) ops_.scale(g, static_cast<float>(coef), model_->num_params());
  }
  return norm;
}

absl::Status Trainer::ReduceStats(const std::vector<MicroBatchResult>& results, StepStats& stats) {
  const ParallelRuntime& P = *parallel_;
  const int m = config_.micro_batches;
  const int E = stage_->num_experts();
  const size_t layers = results.empty() ? 0 : results[0].tokens_per_expert.size();
  // Counts, contributed by tensor-parallel rank 0 only (its peers hold the same tokens):
  // [dropped, tokens per expert (layers x E)].
  std::vector<int64_t> counts(1 + layers * E, 0);
  double loss = 0, aux = 0;
  if (P.tp_rank == 0) {
    for (const MicroBatchResult& r : results) {
      if (P.last_stage()) loss += r.loss / (m * P.dp);
      aux += r.aux_loss / (m * P.dp);
      counts[0] += r.dropped;
      for (size_t l = 0; l < r.tokens_per_expert.size() && l < layers; ++l) {
        for (size_t e = 0; e < r.tokens_per_expert[l].size() && static_cast<int>(e) < E; ++e) {
          counts[1 + l * E + e] += r.tokens_per_expert[l][e];
        }
      }
    }
  }
  // One fp32 all-reduce over the world: [loss, aux, then each count as (c >> 16, (c >> 8) & 255,
  // c & 255)]. The split keeps the counts exact: the two low parts sum to at most world * 255
  // and the high part to at most 2^24, all exact in fp32, for worlds up to 65,793 ranks and
  // counts below 2^40.
  constexpr int64_t kDigitMask = (int64_t{1} << kCountDigit) - 1;
  std::vector<float> v(2 + 3 * counts.size(), 0.0f);
  v[0] = static_cast<float>(loss);
  v[1] = static_cast<float>(aux);
  for (size_t i = 0; i < counts.size(); ++i) {
    v[2 + 3 * i] = static_cast<float>(counts[i] >> (2 * kCountDigit));
    v[3 + 3 * i] = static_cast<float>((counts[i] >> kCountDigit) & kDigitMask);
    v[4 + 3 * i] = static_cast<float>(counts[i] & kDigitMask);
  }
  RETURN_IF_ERROR(AllReduce(P.world_group, v.data(), static_cast<int64_t>(v.size())));
  for (size_t i = 0; i < counts.size(); ++i) {
    counts[i] = (std::llround(v[2 + 3 * i]) << (2 * kCountDigit)) +
                (std::llround(v[3 + 3 * i]) << kCountDigit) + std::llround(v[4 + 3 * i]);
  }
  stats.loss = v[0];
  stats.aux_loss = v[1];
  stats.dropped = counts[0];
  stats.tokens_per_expert.assign(layers, std::vector<int64_t>(E));
  for (size_t l = 0; l < layers; ++l) {
    for (int e = 0; e < E; ++e) stats.tokens_per_expert[l][e] = counts[1 + l * E + e];
  }
  return absl::OkStatus();
}

absl::StatusOr<StepStats> Trainer::StepParallel() {
  const ParallelRuntime& P = *parallel_;
  const data::SamplerConfig& sc = data_->config();
  const int m = config_.micro_batches;
  const double tokens = static_cast<double>(sc.batch) * sc.seq_len * m * P.dp;
  StepStats stats;
  stats.step = step_;
  stats.tokens = static_cast<int64_t>(tokens);
  const std::vector<CommStats> comm_before = CommTotals(P);
  const MemoryActionTotals actions_before = model_->MemoryActions();
  const std::vector<MoeOpTotal> moe_before = model_->MoeOps();

  const double t0 = clock_->MonotonicSeconds();
  model_->ZeroGrad();
  stage_->ResetActivationPeak();
  std::vector<MicroBatchResult> results(m);
  if (absl::Status s = RunSchedule(stats, results); !s.ok()) {
    stage_->AbandonMicroBatches();
    return s;
  }
  stats.activation_peak_bytes = stage_->ActivationPeakBytes();
  stats.predicted_peak_bytes = stage_->PredictedPeakBytes();
  const double t1 = clock_->MonotonicSeconds();
  RETURN_IF_ERROR(SyncGradients());
  ASSIGN_OR_RETURN(stats.grad_norm, ClipParallel());
  RETURN_IF_ERROR(ReduceStats(results, stats));
  RETURN_IF_ERROR(RefuseNonFinite(stats));  // global values: every rank refuses, or none
  const double t2 = clock_->MonotonicSeconds();
  stats.lr = config_.schedule.At(step_);
  stats.checkpoint_stall_seconds += WaitSnapshotCopied();
  adamw_->Update(model_->params(), model_->param_data(), model_->grad_data(), stats.lr, step_ + 1);
  RETURN_IF_ERROR(tensor::Synchronize(device_));  // the step's time is the device's
  const double t3 = clock_->MonotonicSeconds();

  stats.forward_backward_seconds = t1 - t0;
  stats.sync_seconds = t2 - t1;
  stats.optimizer_seconds = t3 - t2;
  stats.step_seconds = t3 - t0;
  stats.memory_actions = MemoryActionsSince(actions_before);
  stats.moe_ops = MoeOpsSince(moe_before);
  stats.moe_schedules = model_->MoeScheduleNames();
  FinishStats(stats, tokens, P.world);
  const std::vector<CommStats> comm_after = CommTotals(P);
  for (size_t i = 0; i < comm_after.size(); ++i) {
    CommStats d = comm_after[i];
    d.bytes -= comm_before[i].bytes;
    d.calls -= comm_before[i].calls;
    d.seconds -= comm_before[i].seconds;
    if (d.calls > 0) stats.comm.push_back(std::move(d));
  }
  ++step_;
  return stats;
}

absl::Status Trainer::SaveCheckpointParallel() {
  std::vector<float> host[3];
  absl::StatusOr<ShardState> copied = HostShardState(host);
  // A failed copy fails this rank's write, which every rank then learns (CommitShardParallel).
  const ShardState state = copied.ok() ? *copied : CurrentShardState();
  CheckpointStore store(config_.checkpoint.dir, config_.checkpoint.keep);
  return CommitShardParallel(
      copied.ok() ? store.WriteShard(state) : absl::StatusOr<ShardRecord>(copied.status()), state);
}

absl::Status Trainer::AgreeOnWorld(const absl::Status& mine) const {
  return AgreeOnStatus(parallel_ != nullptr ? parallel_->world_group : nullptr, mine);
}

absl::StatusOr<std::vector<ShardRecord>> Trainer::GatherShardRecords(
    const absl::StatusOr<ShardRecord>& written) {
  comm::Communicator* world = parallel_->world_group;
  ShardRecord mine;
  if (written.ok()) {
    mine = *written;
    mine.params = model_->params();
    mine.n = model_->num_params();
  }
  if (world == nullptr || world->size() == 1) {
    if (!written.ok()) return written.status();
    return std::vector<ShardRecord>{std::move(mine)};
  }
  // One gather: every rank's record (rank 0 commits; the others learn the sizes for free), or
  // its write's failure, which fails every rank with its cause.
  ASSIGN_OR_RETURN(const std::vector<std::string> texts,
                   AllGatherStrings(world, written.ok() ? SerializeShardRecord(mine)
                                                        : FailureText(written.status())));
  RETURN_IF_ERROR(FirstFailure(texts, world->rank(), written.status()));
  std::vector<ShardRecord> records;
  for (const std::string& text : texts) {
    ASSIGN_OR_RETURN(ShardRecord r, ParseShardRecord(text));
    records.push_back(std::move(r));
  }
  return records;
}

absl::Status Trainer::CommitShardParallel(const absl::StatusOr<ShardRecord>& written,
                                          const ShardState& state) {
  ASSIGN_OR_RETURN(const std::vector<ShardRecord> records, GatherShardRecords(written));
  CheckpointStore store(config_.checkpoint.dir, config_.checkpoint.keep);
  std::string retention;
  const absl::Status committed = parallel_->world_rank == 0
                                     ? store.Commit(model_->params(), state, records, &retention)
                                     : absl::OkStatus();
  // Nobody moves on (or reports the checkpoint) before it is committed, and a failed commit
  // fails every rank with its cause.
  RETURN_IF_ERROR(AgreeOnWorld(committed));
  last_saved_step_ = state.step;
  NoteRetention(state.step, retention);
  return absl::OkStatus();
}

absl::StatusOr<TensorShapes> Trainer::WholeModelShapes() const {
  const ParallelRuntime& P = *parallel_;
  // Every rank's whole tensors as lines "name<TAB>d0,d1,...", gathered and merged.
  absl::StatusOr<TensorShapes> mine = WholeShapes(model_->params());
  std::string text;
  if (mine.ok()) {
    for (const auto& [name, shape] : *mine) {
      absl::StrAppend(&text, name, "\t", absl::StrJoin(shape, ","), "\n");
    }
  }
  RETURN_IF_ERROR(AgreeOnStatus(P.world_group, mine.status()));
  ASSIGN_OR_RETURN(const std::vector<std::string> all, AllGatherStrings(P.world_group, text));
  TensorShapes model;
  for (const std::string& rank_text : all) {
    for (absl::string_view line : absl::StrSplit(rank_text, '\n', absl::SkipEmpty())) {
      const std::vector<absl::string_view> parts = absl::StrSplit(line, '\t');
      std::vector<int64_t> shape;
      for (absl::string_view d : absl::StrSplit(parts.back(), ',', absl::SkipEmpty())) {
        int64_t v = 0;
        if (!absl::SimpleAtoi(d, &v)) return absl::InternalError("trainer: bad tensor shape text");
        shape.push_back(v);
      }
      model.emplace(std::string(parts.front()), std::move(shape));
    }
  }
  return model;
}

absl::Status Trainer::CheckSameData() {
  if (parallel_ == nullptr) return absl::OkStatus();
  comm::Communicator* world = parallel_->world_group;
  if (world == nullptr || world->size() == 1) return absl::OkStatus();
  const std::string mine =
      absl::StrCat("training: ", data_->PositionAt(0).order,
                   "; held-out: ", held_out_ == nullptr ? "none" : held_out_->PositionAt(0).order);
  ASSIGN_OR_RETURN(const std::vector<std::string> all, AllGatherStrings(world, mine));
  std::vector<int> other;
  for (size_t r = 1; r < all.size(); ++r) {
    if (all[r] != all[0]) other.push_back(static_cast<int>(r));
  }
  if (other.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "data: rank(s) ", absl::StrJoin(other, ", "),
      " opened other data than rank 0 (each host must hold the same files under its data root: "
      "a stale or re-prepared copy trains other sequences); rank 0: ",
      all[0], "; rank ", other[0], ": ", all[other[0]]));
}

absl::Status Trainer::CheckSharedCheckpointDir() {
  comm::Communicator* world = parallel_->world_group;
  if (world == nullptr || world->size() == 1) return absl::OkStatus();
  const std::string& dir = config_.checkpoint.dir;
  const std::string path = (std::filesystem::path(dir) / ".furnace-shared-dir").string();
  std::string token;
  absl::Status wrote = absl::OkStatus();
  if (parallel_->world_rank == 0) {
    std::random_device random;
    token = absl::StrCat("furnace ", random(), "-", random(), "\n");
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    wrote = WriteFileDurably(path, token);
  }
  RETURN_IF_ERROR(AgreeOnStatus(world, wrote));
  ASSIGN_OR_RETURN(const std::vector<std::string> tokens, AllGatherStrings(world, token));
  std::string seen;
  const absl::Status read = ReadFileToString(path, &seen);
  const bool same = read.ok() && seen == tokens[0];
  ASSIGN_OR_RETURN(const std::vector<std::string> all, AllGatherStrings(world, same ? "" : "x"));
  std::vector<int> other;
  for (size_t r = 0; r < all.size(); ++r) {
    if (!all[r].empty()) other.push_back(static_cast<int>(r));
  }
  if (other.empty()) return absl::OkStatus();
  return absl::UnavailableError(absl::StrCat(
      "checkpoint.dir ", dir, " is not the directory rank 0 writes in on the host of rank(s) ",
      absl::StrJoin(other, ", "), " (they do not read the token rank 0 wrote there",
      read.ok() || same ? "" : absl::StrCat("; this rank: ", read.message()),
      "): it must be one file system that every rank's host shares (rank 0 commits every "
      "rank's shard from it)"));
}

absl::StatusOr<LoadedCheckpoint> Trainer::RestoreLatestParallel() {
  const ParallelRuntime& P = *parallel_;
  comm::Communicator* world = P.world_group;
  RETURN_IF_ERROR(CheckSharedCheckpointDir());
  CheckpointStore store(config_.checkpoint.dir, config_.checkpoint.keep);
  ASSIGN_OR_RETURN(const TensorShapes model, WholeModelShapes());
  // Each rank gathers its own part from whichever shards hold it (reshard.h): the layout that
  // wrote the checkpoint may be another one.
  absl::StatusOr<LoadedCheckpoint> loaded =
      LoadLatestIntoLayout(store, model_->params(), model_->num_params(), P.world_rank);
  absl::Status usable = absl::OkStatus();
  if (!loaded.ok() && !absl::IsNotFound(loaded.status())) {
    usable = loaded.status();
  } else if (loaded.ok()) {
    usable = CompareTensorSets(loaded->path, loaded->tensors, model);
  }
  RETURN_IF_ERROR(AgreeOnStatus(world, usable));

  // The ranks agree on one step: the oldest any of them could load (a shard that is damaged for
  // one rank sends every rank back to the previous checkpoint). -1: none.
  const int64_t mine = loaded.ok() ? loaded->step : -1;
  int64_t agreed = mine;
  std::vector<int64_t> steps{mine};
  if (world != nullptr && world->size() > 1) {
    steps.resize(world->size());
    RETURN_IF_ERROR(world->AllGather(&mine, steps.data(), sizeof(int64_t)));
    agreed = *std::min_element(steps.begin(), steps.end());
  }
  if (agreed < 0) {
    // Some ranks see checkpoints, others none: the directory is not the same for every rank (a
    // shared file system not mounted on one host). Starting afresh would write step 1 over the
    // run's checkpoints; every rank fails instead (retried: another placement may see them).
    const auto found = std::max_element(steps.begin(), steps.end());
    if (*found >= 0) {
      std::vector<int> none;
      for (size_t r = 0; r < steps.size(); ++r) {
        if (steps[r] < 0) none.push_back(static_cast<int>(r));
      }
      return absl::UnavailableError(absl::StrCat(
          "rank(s) ", absl::StrJoin(none, ", "), " found no checkpoint in ", config_.checkpoint.dir,
          " while rank ", found - steps.begin(), " found step ", *found,
          ": the checkpoint directory is not the same on every rank (a shared file system not "
          "mounted?); not starting afresh over the run's checkpoints"));
    }
    return loaded.status();
  }
  // Each rank's value of `x`, in rank order (this rank's alone without a group).
  const auto gather = [&](int64_t x) -> absl::StatusOr<std::vector<int64_t>> {
    if (world == nullptr || world->size() == 1) return std::vector<int64_t>{x};
    std::vector<int64_t> all(world->size());
    RETURN_IF_ERROR(world->AllGather(&x, all.data(), sizeof(int64_t)));
    return all;
  };
  // Every rank loads the agreed step (the one that found a newer one loads it now). When some
  // rank cannot (its shard of that step is damaged too), every rank goes down to the newest step
  // below it that each can load, and they agree again, until one loads on every rank or none is
  // left: two damaged shards of different steps cost the steps between, not the run.
  std::vector<std::string> no_notes;
  // Listed on every rank, and agreed on: one rank's failed listing must not leave the others in
  // the collectives below.
  absl::StatusOr<std::vector<int64_t>> listed = store.LoadableSteps(&no_notes);  // newest first
  RETURN_IF_ERROR(AgreeOnStatus(world, listed.status()));
  const std::vector<int64_t> candidates = *std::move(listed);
  std::vector<std::string> passed = loaded->skipped;
  // Which ranks could not load a step (their own logs say which file and why): named here, so the
  // account every rank gives (the job's "restored" event) says where to look.
  const auto could_not = [](int64_t step, const std::vector<int>& ranks) {
    return absl::StrCat("step ", step, ": rank", ranks.size() == 1 ? " " : "s ",
                        absl::StrJoin(ranks, ", "), " could not load ",
                        ranks.size() == 1 ? "its shard" : "their shards",
                        " (damaged; the rank's log names the file)");
  };
  if (agreed != mine) {
    std::vector<int> behind;
    for (size_t r = 0; r < steps.size(); ++r) {
      if (steps[r] < mine) behind.push_back(static_cast<int>(r));
    }
    passed.push_back(could_not(mine, behind));
  }
  int64_t target = agreed;
  while (true) {
    absl::Status here = absl::OkStatus();
    if (loaded->step != target) {
      absl::StatusOr<LoadedCheckpoint> at =
          LoadIntoLayout(store, target, model_->params(), model_->num_params(), P.world_rank);
      if (at.ok()) {
        loaded = std::move(at);
      } else {
        here = at.status();
      }
    }
    // Damage passes a step over; any other error (a shard that could not be read, another format
    // version) fails every rank alike, since an older step would be no cure and resuming from one
    // would uncommit the newer steps at the next checkpoint (checkpoint.h: IsDamage).
    RETURN_IF_ERROR(AgreeOnStatus(world, here.ok() || IsDamage(here) ? absl::OkStatus() : here));
    ASSIGN_OR_RETURN(const std::vector<int64_t> loaded_flags, gather(here.ok() ? 1 : 0));
    if (std::all_of(loaded_flags.begin(), loaded_flags.end(), [](int64_t f) { return f == 1; })) {
      break;
    }
    if (here.ok()) {
      std::vector<int> failed;
      for (size_t r = 0; r < loaded_flags.size(); ++r) {
        if (loaded_flags[r] != 1) failed.push_back(static_cast<int>(r));
      }
      passed.push_back(could_not(target, failed));
    } else {
      passed.push_back(std::string(here.message()));
    }
    int64_t next = -1;
    absl::Status unreadable = absl::OkStatus();
    for (const int64_t step : candidates) {
      if (step >= target) continue;
      absl::StatusOr<LoadedCheckpoint> at =
          LoadIntoLayout(store, step, model_->params(), model_->num_params(), P.world_rank);
      if (at.ok()) {
        loaded = std::move(at);
        next = step;
        break;
      }
      if (!IsDamage(at.status())) {
        unreadable = at.status();
        break;
      }
      passed.push_back(std::string(at.status().message()));
    }
    RETURN_IF_ERROR(AgreeOnStatus(world, unreadable));
    ASSIGN_OR_RETURN(const std::vector<int64_t> nexts, gather(next));
    target = *std::min_element(nexts.begin(), nexts.end());
    if (target < 0) {
      return absl::DataLossError(absl::StrCat(
          "checkpoint: no checkpoint in ", config_.checkpoint.dir,
          " loads on every rank; this rank passed over:\n  ", absl::StrJoin(passed, "\n  ")));
    }
  }
  loaded->skipped = std::move(passed);
  absl::Status restored = absl::OkStatus();
  if (restored.ok()) restored = Restore(*loaded);
  // Every rank resumes, or every rank fails with the same cause.
  RETURN_IF_ERROR(AgreeOnStatus(world, restored));
  return loaded;
}

}  // namespace furnace::train
