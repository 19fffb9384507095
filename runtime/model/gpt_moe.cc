#include "runtime/model/gpt_moe.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <optional>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "runtime/base/status.h"
#include "runtime/device/current_stream.h"
#include "runtime/model/attention_block.h"
#include "runtime/model/embedding.h"
#include "runtime/model/head.h"
#include "runtime/model/init.h"
#include "runtime/model/mlp_block.h"
#include "runtime/model/moe_block.h"
#include "runtime/model/spikes.h"

namespace furnace::model {

struct LayerState {
  AttentionSaved attn;
  bool moe = false;
  MlpSaved mlp;
  MoeSaved moe_saved;
  StashHandle out() const { return moe ? moe_saved.out : mlp.out; }
};

struct ForwardState {
  int B = 0;
  int micro = 0;
  std::vector<MoeRows> rows;          // this stage's MoE layers, in order
  std::vector<ModuleBytes> declared;  // the memory model's modules for its rows (NotePrediction)
  int64_t declared_saved = 0;         // their saved bytes
  int64_t declared_peak = 0;          // and its peak through this stage on an empty arena
  StreamSpan forward;              // marks around the forward on the compute stream (training only)
  bool routing_spike = false;      // a spike step: each MoE layer adds its spike (spikes.h)
  EmbeddingSaved embedding;        // first stage
  StashHandle input;               // later stages: the previous stage's output, (B, T, C)
  std::vector<LayerState> layers;  // this stage's layers, in order
  HeadSaved head;                  // last stage
  StashHandle first_input() const { return input.valid() ? input : embedding.out; }
};

namespace {

// Releases every stashed tensor when a ForwardBackward / Evaluate leaves, whatever the path.
class StashGuard {
 public:
  explicit StashGuard(Stash& stash) : stash_(stash) {}
  ~StashGuard() { stash_.ReleaseAll(); }

 private:
  Stash& stash_;
};

}  // namespace

GptMoe::GptMoe(const ModelConfig& config, const device::Backend& ops, device::Device& device,
               tensor::DeviceArena& activations, const ModelShard& shard, ParallelGroups groups)
    : config_(config),
      shard_(shard),
      groups_(groups),
      layout_(BuildParamLayout(config, shard)),
      ops_(ops),
      device_(device),
      arena_(activations),
      stash_(device.kind()),
      uploads_(device) {
  stash_.SetDeviceMemory(&arena_, &ops_);
  global_params_ = shard.whole() ? layout_.total : BuildParamLayout(config).total;
}

GptMoe::~GptMoe() {
  in_flight_.clear();
  stash_.ReleaseAll();
}

namespace {

// InitParameter over every parameter, in chunks of kInitChunk elements shared out to up to one
// thread per core (one thread for a model below two chunks: tests, small shards).
void InitParametersParallel(uint64_t seed, const std::vector<train::ParamInfo>& params, int layers,
                            float* out) {
  constexpr int64_t kInitChunk = int64_t{1} << 21;
  struct Task {
    const train::ParamInfo* param;
    int64_t begin, end;
  };
  std::vector<Task> tasks;
  for (const train::ParamInfo& p : params) {
    for (int64_t b = 0; b < p.numel(); b += kInitChunk) {
      tasks.push_back({&p, b, std::min(p.numel(), b + kInitChunk)});
    }
  }
  const int threads = static_cast<int>(std::min<size_t>(
      std::max(1u, std::thread::hardware_concurrency()), std::max<size_t>(1, tasks.size() / 2)));
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t t = next++; t < tasks.size(); t = next++) {
      const Task& task = tasks[t];
      InitParameterRange(seed, *task.param, layers, out + task.param->offset, task.begin, task.end);
    }
  };
  std::vector<std::thread> pool;
  for (int i = 1; i < threads; ++i) pool.emplace_back(work);
  work();
  for (std::thread& t : pool) t.join();
}

}  // namespace

absl::StatusOr<std::unique_ptr<GptMoe>> GptMoe::Create(const ModelConfig& config, uint64_t seed,
                                                       device::Device& device,
                                                       tensor::DeviceArena& activations,
                                                       const ModelShard& shard,
                                                       ParallelGroups groups,
                                                       device::Precision precision) {
  RETURN_IF_ERROR(config.Validate());
  ASSIGN_OR_RETURN(const device::Backend* ops, device::BackendFor(device, precision));
  if (&activations.device() != &device) {
    return absl::InvalidArgumentError("GptMoe: the activation arena belongs to another device");
  }
  std::unique_ptr<GptMoe> model(new GptMoe(config, *ops, device, activations, shard, groups));
  const uint64_t bytes = static_cast<uint64_t>(model->layout_.total) * sizeof(float);
  ASSIGN_OR_RETURN(model->params_, tensor::DeviceMemory::Allocate(device, bytes, "parameters"));
  ASSIGN_OR_RETURN(model->grads_, tensor::DeviceMemory::Allocate(device, bytes, "gradients"));
  // Initialised on the host (counter-based, layout-independent: init.h), then uploaded once. Each
  // element is a pure function of its index, so a large model is filled by several threads in
  // chunks (a 2-billion-parameter model takes a minute on one core).
  std::vector<float> init(model->layout_.total);
  InitParametersParallel(seed, model->layout_.params, config.layers, init.data());
  RETURN_IF_ERROR(tensor::CopyToDevice(device, model->params_.data(), init.data(), bytes));
  if (ops->precision == device::Precision::kBf16) {
    ASSIGN_OR_RETURN(model->mirror_,
                     tensor::DeviceMemory::Allocate(device, bytes / 2, "parameters (bf16 mirror)"));
    model->mirror_registration_ = device::WeightMirror(
        model->params_.as<float>(), model->mirror_.as<uint16_t>(), model->layout_.total);
  }
  RETURN_IF_ERROR(tensor::Fill(device, model->grads_.data(), 0, bytes));
  // The default, deepspeed on every MoE layer, with its gradient reduction (ParamInfo::tp_partial:
  // sliced experts are not scaled by 1 / tp), for a caller that never sets the schedules.
  RETURN_IF_ERROR(model->SetMoeSchedules(
      std::vector<moe::Schedule>(config.num_moe_layers(), moe::Schedule::kDeepspeed)));
  return model;
}

void GptMoe::ZeroGrad() {
  // Enqueued on the current stream; a failure is the device's sticky error, reported by the next
  // synchronisation.
  tensor::Fill(device_, grads_.data(), 0, grads_.bytes()).IgnoreError();
}

train::MemoryActionTotals GptMoe::MemoryActions() const {
  const StashActionStats a = stash_.action_stats();
  return {.recomputed_bytes = stash_.rebuilt_bytes(),
          .offloaded_bytes = a.offloaded_bytes,
          .compressed_bytes = a.compressed_bytes,
          .late_reloads = a.late_reloads,
          .planner_seconds = planner_stats_.seconds,
          .planner_decisions = planner_stats_.decisions,
          .emergency_offloads = planner_stats_.emergency_offloads,
          .agreements = planner_stats_.agreements,
          .agreed_drops = planner_stats_.agreed_drops,
          .agreement_seconds = planner_stats_.agreement_seconds};
}

void GptMoe::SetStepContext(int64_t step, int64_t first_global_sequence) {
  step_ = step;
  first_sequence_ = first_global_sequence;
}

const train::ParamInfo* GptMoe::FindParam(const std::string& name) const {
  for (const train::ParamInfo& p : layout_.params) {
    if (p.name == name) return &p;
  }
  return nullptr;
}

MoeShape GptMoe::LayerMoe(const MoeShape& base, int layer) const {
  MoeShape m = base;
  if (layer >= 0 && layer < static_cast<int>(moe_schedules_.size())) {
    m.schedule = moe_schedules_[layer];
  }
  return m;
}

absl::Status GptMoe::SetMoeSchedules(const std::vector<moe::Schedule>& per_moe_layer) {
  if (static_cast<int>(per_moe_layer.size()) != config_.num_moe_layers()) {
    return absl::InvalidArgumentError(absl::StrCat("moe schedules: ", per_moe_layer.size(),
                                                   " given for ", config_.num_moe_layers(),
                                                   " MoE layers"));
  }
  const int tp = groups_.tp == nullptr ? 1 : groups_.tp->size();
  moe_schedules_.assign(config_.layers, moe::Schedule::kDeepspeed);
  size_t next = 0;
  for (int l = 0; l < config_.layers; ++l) {
    if (config_.IsMoeLayer(l))
      moe_schedules_[l] = tp > 1 ? per_moe_layer[next++] : moe::Schedule::kDeepspeed;
  }
  // How each layer's gradients are reduced over tp: the experts saw each row once (s1, s2,
  // deepspeed with sliced experts) or once per peer (deepspeed otherwise: scaled by 1 / tp); the
  // router saw this peer's tokens only (s1: summed over tp) or all of them (averaged).
  const int esp = groups_.esp == nullptr ? 1 : groups_.esp->size();
  for (train::ParamInfo& info : layout_.params) {
    info.tp_partial = false;
    for (int l = 0; l < config_.layers; ++l) {
      if (!config_.IsMoeLayer(l)) continue;
      const std::string prefix = absl::StrCat("layers.", l, ".moe.");
      if (info.name.compare(0, prefix.size(), prefix) != 0) continue;
      const moe::Schedule s = moe_schedules_[l];
      info.tp_partial =
          info.sync == train::GradSync::kExpertData
              ? !moe::ExpertRowsDuplicated(s, moe::SlicedExperts(s, groups_.esp_is_tp, esp))
              : info.name == prefix + "router" && moe::GateOnTokenSlice(s);
    }
  }
  return absl::OkStatus();
}

std::vector<train::MoeOpTotal> GptMoe::MoeOps() const {
  std::vector<train::MoeOpTotal> out;
  for (const auto& [op, e] : moe_counters_.Snapshot())
    out.push_back({op, e.bytes, e.calls, e.seconds});
  return out;
}

bool GptMoe::SlicedExperts(moe::Schedule s) const {
  return moe::SlicedExperts(s, groups_.esp_is_tp, groups_.esp == nullptr ? 1 : groups_.esp->size());
}

absl::StatusOr<double> GptMoe::TimeMoeLayer(moe::Schedule schedule, int B, const float* x_host,
                                            const float* dout_host) {
  if (!in_flight_.empty()) {
    return absl::FailedPreconditionError("the MoE layer trial runs before the first step only");
  }
  if (B < 1) return absl::InvalidArgumentError(absl::StrCat("micro-batch size B = ", B, " < 1"));
  int layer = -1;
  for (int l = shard_.first_layer; l < shard_.end_layer(config_); ++l) {
    if (layout_.layers[l].moe) {
      layer = l;
      break;
    }
  }
  if (layer < 0) return 0.0;
  RETURN_IF_ERROR(RefreshWeightMirror());
  const Dims dims{B,
                  config_.seq_len,
                  config_.d_model,
                  config_.heads,
                  shard_.tp,
                  config_.recompute_attention_probs};
  MoeShape moe = LayerMoe(MoeShapeOf(config_, shard_), layer);
  moe.schedule = schedule;
  // No planner (its hooks) and no counters: the trial is not a step.
  ModuleContext ctx{ops_, arena_, stash_, groups_, nullptr};
  const int64_t NC = int64_t{dims.N()} * dims.C;
  ASSIGN_OR_RETURN(tensor::Buffer x, AllocF32(ctx, NC, "trial.x", false));
  RETURN_IF_ERROR(Upload(ctx, x.data(), x_host, F32Bytes(NC)));
  ASSIGN_OR_RETURN(StashHandle x_in,
                   SaveF32(ctx, "trial.x", layer, std::move(x), {B, dims.T, dims.C}));
  ASSIGN_OR_RETURN(tensor::Buffer dres, AllocF32(ctx, NC, "trial.grad", false));
  RETURN_IF_ERROR(Upload(ctx, dres.data(), dout_host, F32Bytes(NC)));
  RETURN_IF_ERROR(tensor::Synchronize(device_));
  const auto t0 = std::chrono::steady_clock::now();
  const float* p = params_.as<float>();
  absl::StatusOr<MoeSaved> saved =
      MoeBlockForward(ctx, dims, moe, layer, layout_.layers[layer], p, x_in);
  absl::Status status = saved.status();
  // The memory policy's drops (selective, full_recompute), as after the module in a forward: the
  // backward then rebuilds them (the expert buffers by re-running the schedule's exchanges).
  if (status.ok()) status = stash_.ApplyPendingDrops();
  if (status.ok()) {
    status = MoeBlockBackward(ctx, dims, moe, layout_.layers[layer], p, grads_.as<float>(), *saved,
                              x_in, 1.0, dres.as<float>());
  }
  if (status.ok()) status = tensor::Synchronize(device_);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  stash_.Release(x_in).IgnoreError();  // (gone already if the backward released it)
  dres.Reset();
  ZeroGrad();
  RETURN_IF_ERROR(status);
  RETURN_IF_ERROR(tensor::Synchronize(device_));
  arena_.ResetPeak();
  return seconds;
}

std::vector<std::string> GptMoe::MoeScheduleNames() const {
  std::vector<std::string> out;
  for (moe::Schedule s : MoeSchedules()) out.push_back(moe::ScheduleName(s));
  return out;
}

std::vector<moe::Schedule> GptMoe::MoeSchedules() const {
  std::vector<moe::Schedule> out;
  for (int l = 0; l < config_.layers; ++l) {
    if (!config_.IsMoeLayer(l)) continue;
    out.push_back(l < static_cast<int>(moe_schedules_.size()) ? moe_schedules_[l]
                                                              : moe::Schedule::kDeepspeed);
  }
  return out;
}

ModuleContext GptMoe::Context() {
  // Evaluation has no backward to plan for: the planner stays out of it.
  MemoryHooks* hooks = adaptive() && arena_.budget() > 0 && !evaluating_ ? this : nullptr;
  ModuleContext ctx{ops_, arena_, stash_, groups_, hooks};
  ctx.moe_counters = &moe_counters_;
  ctx.uploads = &uploads_;
  return ctx;
}

absl::Status GptMoe::CheckInputs(const int32_t* inputs, const int32_t* targets, int B) const {
  if (B < 1) return absl::InvalidArgumentError(absl::StrCat("micro-batch size B = ", B, " < 1"));
  const int64_t n = int64_t{B} * config_.seq_len;
  for (int64_t i = 0; i < n; ++i) {
    if (inputs != nullptr && (inputs[i] < 0 || inputs[i] >= config_.vocab)) {
      return absl::InvalidArgumentError(absl::StrCat("input token ", i, " = ", inputs[i],
                                                     " is outside [0, ", config_.vocab, ")"));
    }
    if (targets != nullptr && (targets[i] < 0 || targets[i] >= config_.vocab)) {
      return absl::InvalidArgumentError(absl::StrCat("target token ", i, " = ", targets[i],
                                                     " is outside [0, ", config_.vocab, ")"));
    }
  }
  return absl::OkStatus();
}

absl::Status GptMoe::RefreshWeightMirror() {
  if (!mirror_registration_.registered() || !mirror_stale_) return absl::OkStatus();
  // Enqueued on the current stream ahead of this forward's GEMMs, which read it in stream order.
  ops_.cast_f32_to_bf16(mirror_.as<uint16_t>(), params_.as<float>(), layout_.total);
  mirror_stale_ = false;
  return absl::OkStatus();
}

absl::StatusOr<ForwardState> GptMoe::Forward(const int32_t* inputs, const int32_t* targets,
                                             const float* x_in, int B) {
  RETURN_IF_ERROR(RefreshWeightMirror());
  const Dims dims{B,
                  config_.seq_len,
                  config_.d_model,
                  config_.heads,
                  shard_.tp,
                  config_.recompute_attention_probs};
  const MoeShape moe = MoeShapeOf(config_, shard_);
  ModuleContext ctx = Context();
  const float* p = params_.as<float>();
  ForwardState st;
  if (!evaluating_) {
    RETURN_IF_ERROR(ReadMicroBatchTimes());
    if (adaptive()) NoteLateReloads();
    ASSIGN_OR_RETURN(st.forward.begin, Mark());
  }
  st.B = B;
  st.micro = cur_micro_;
  st.routing_spike = step_ >= 0 && IsSpikeStep(config_.spikes, step_);
  fwd_rows_.clear();
  fwd_B_ = B;
  copy_committed_seconds_ = 0;
  moved_.erase(cur_micro_);
  planned_.erase(cur_micro_);
  future_drops_.erase(cur_micro_);
  agreeable_.clear();
  in_backward_ = false;
  deferred_.clear();
  cur_module_ = 0;  // the embedding (or the received activation)

  if (shard_.first_stage()) {
    ASSIGN_OR_RETURN(st.embedding,
                     EmbeddingForward(ctx, dims, inputs, p + layout_.wte, p + layout_.wpe));
    RETURN_IF_ERROR(stash_.ApplyPendingDrops());
    RETURN_IF_ERROR(ReleaseBehindEvaluation(st.first_input()));
  } else {
    const int64_t NC = int64_t{dims.N()} * dims.C;
    ASSIGN_OR_RETURN(tensor::Buffer in, AllocF32(ctx, NC, "stage.input", false));  // (B, T, C)
    RETURN_IF_ERROR(tensor::CopyOnDevice(device_, in.data(), x_in, F32Bytes(NC)));
    ASSIGN_OR_RETURN(st.input, SaveF32(ctx, "stage.input", shard_.first_layer, std::move(in),
                                       {B, dims.T, dims.C}));
  }
  StashHandle x = st.first_input();
  for (int l = shard_.first_layer; l < shard_.end_layer(config_); ++l) {
    const LayerOffsets& off = layout_.layers[l];
    const int i = l - shard_.first_layer;
    cur_module_ = 1 + 2 * i;
    LayerState ls;
    ls.moe = off.moe;
    ASSIGN_OR_RETURN(ls.attn, AttentionBlockForward(ctx, dims, l, off, p, x));
    RETURN_IF_ERROR(stash_.ApplyPendingDrops());
    RETURN_IF_ERROR(ReleaseBehindEvaluation(ls.attn.out));
    cur_module_ = 2 + 2 * i;
    if (off.moe) {
      const std::optional<RoutingSpike> spike =
          st.routing_spike ? SpikeFor(config_.spikes, config_.experts, config_.top_k, step_, l,
                                      first_sequence_, config_.seq_len)
                           : std::nullopt;
      ASSIGN_OR_RETURN(ls.moe_saved, MoeBlockForward(ctx, dims, LayerMoe(moe, l), l, off, p,
                                                     ls.attn.out, spike ? &*spike : nullptr));
      const MoeSaved& ms = ls.moe_saved;
      MoeRows rows{ms.rows, ms.distributed ? ms.dispatch.R() : ms.rows,
                   ms.distributed ? moe::ScheduleExecutor::ScratchRows(ms.dispatch) : 0,
                   ms.distributed};
      rows.gated = ms.gated;
      fwd_rows_.push_back(rows);
    } else {
      ASSIGN_OR_RETURN(ls.mlp, MlpBlockForward(ctx, dims, shard_.local_dense_ffn(config_), l, off,
                                               p, ls.attn.out));
    }
    RETURN_IF_ERROR(stash_.ApplyPendingDrops());
    // (An evaluation keeps nothing for a backward: nothing to offload or compress.)
    if (off.moe && !evaluating_) RETURN_IF_ERROR(ActAfterMoeForward(ls.moe_saved));
    x = ls.out();
    RETURN_IF_ERROR(ReleaseBehindEvaluation(x));
    st.layers.push_back(std::move(ls));
  }
  if (shard_.last_stage()) {
    cur_module_ = 1 + 2 * static_cast<int>(st.layers.size());
    ASSIGN_OR_RETURN(st.head, HeadForward(ctx, dims, config_.vocab, p + layout_.wte,
                                          p + layout_.lnf_w, p + layout_.lnf_b, x, targets,
                                          capture_logits_ ? &last_logits_ : nullptr));
    RETURN_IF_ERROR(stash_.ApplyPendingDrops());
  }
  last_stashed_bytes_ = stash_.stashed_bytes();
  st.rows = fwd_rows_;
  // The bytes the saved tensors of this stage's micro-batch take, for the 1F1B reservation.
  NotePrediction(st);
  if (!evaluating_) {
    ASSIGN_OR_RETURN(st.forward.end, Mark());
  }
  return st;
}

absl::StatusOr<std::unique_ptr<comm::StreamMark>> GptMoe::Mark() {
  if (marker_ == nullptr) {
    ASSIGN_OR_RETURN(marker_, comm::CreateStreamMarker(device_));
  }
  return marker_->Mark(device::CurrentStreamOf(device_));
}

absl::Status GptMoe::TimedBackward(ForwardState& st, const float* dx_out, double ce_scale,
                                   double aux_scale, float* dx_in) {
  StreamSpan backward;
  ASSIGN_OR_RETURN(backward.begin, Mark());
  if (absl::Status s = Backward(st, dx_out, ce_scale, aux_scale, dx_in); !s.ok()) {
    // The backward's buffers are tagged without their layer (the forward's carry it): an
    // out-of-memory error says which module's backward ran out.
    if (!absl::IsResourceExhausted(s)) return s;
    return absl::ResourceExhaustedError(absl::StrCat(
        ModuleName(cur_module_), " backward (micro-batch ", st.micro, "): ", s.message()));
  }
  ASSIGN_OR_RETURN(backward.end, Mark());
  if (st.forward.end != nullptr) {
    unread_times_.push_back({st.B, std::move(st.forward), std::move(backward)});
    while (unread_times_.size() > kMaxUnreadTimes) unread_times_.pop_front();
  }
  return ReadMicroBatchTimes();
}

std::string GptMoe::ModuleName(int module) const {
  if (module <= 0) return shard_.first_stage() ? "the embedding" : "the stage input";
  const int local = (module - 1) / 2;
  const int layers = shard_.end_layer(config_) - shard_.first_layer;
  if (local >= layers) return "the head";
  const int layer = shard_.first_layer + local;
  return absl::StrCat("layers.", layer, ".",
                      module % 2 == 1             ? "attention"
                      : config_.IsMoeLayer(layer) ? "moe"
                                                  : "mlp");
}

absl::Status GptMoe::ReadMicroBatchTimes() {
  while (!unread_times_.empty()) {
    MicroBatchTimes& t = unread_times_.front();
    ASSIGN_OR_RETURN(const bool passed, t.backward.end->Passed());
    if (!passed) break;  // not run yet: read at a later micro-batch
    // The forward ran before its backward on the same stream: it has passed too.
    ASSIGN_OR_RETURN(const double forward, t.forward.end->SecondsSince(*t.forward.begin));
    ASSIGN_OR_RETURN(const double backward, t.backward.end->SecondsSince(*t.backward.begin));
    NoteMicroBatchTime(t.B, forward + backward);
    unread_times_.pop_front();
  }
  return absl::OkStatus();
}

absl::Status GptMoe::Backward(const ForwardState& st, const float* dx_out, double ce_scale,
                              double aux_scale, float* dx_in) {
  const Dims dims{st.B,          config_.seq_len, config_.d_model,
                  config_.heads, shard_.tp,       config_.recompute_attention_probs};
  const MoeShape moe = MoeShapeOf(config_, shard_);
  ModuleContext ctx = Context();
  const float* p = params_.as<float>();
  float* g = grads_.as<float>();
  const int64_t NC = int64_t{dims.N()} * dims.C;
  cur_micro_ = st.micro;
  in_backward_ = true;
  // Adaptive: each module's declared backward scratch, the room its reloads must leave.
  auto reserve = [&st](size_t module) {
    return module < st.declared.size() ? st.declared[module].backward_peak : int64_t{0};
  };

  // d loss / d residual stream, carried down the layers and accumulated in place.
  ASSIGN_OR_RETURN(tensor::Buffer dres_buf, AllocF32(ctx, NC, "residual.grad", true));  // (B,T,C)
  float* dres = dres_buf.as<float>();
  if (shard_.last_stage()) {
    const StashHandle top = st.layers.empty() ? st.first_input() : st.layers.back().out();
    const int head = 1 + 2 * static_cast<int>(st.layers.size());
    cur_module_ = head;
    if (adaptive()) {
      // The head's tensors, and its input (the last layer's output) behind them.
      RETURN_IF_ERROR(PrepareAdaptiveBackward(st.micro, head, head - 1, reserve(head)));
    }
    RETURN_IF_ERROR(HeadBackward(ctx, dims, config_.vocab, p + layout_.wte, p + layout_.lnf_w,
                                 g + layout_.wte, g + layout_.lnf_w, g + layout_.lnf_b, st.head,
                                 top, ce_scale, dres));
  } else {
    RETURN_IF_ERROR(tensor::CopyOnDevice(device_, dres, dx_out, F32Bytes(NC)));
  }
  for (int i = static_cast<int>(st.layers.size()) - 1; i >= 0; --i) {
    const LayerOffsets& off = layout_.layers[shard_.first_layer + i];
    const LayerState& ls = st.layers[i];
    const StashHandle x_in = i == 0 ? st.first_input() : st.layers[i - 1].out();
    const int attn = 1 + 2 * i;
    cur_module_ = attn + 1;
    RETURN_IF_ERROR(PrefetchForBackward(st, i));
    if (adaptive()) {
      // One module at a time, as the memory model and the floor count them: the MoE (or MLP)
      // module's tensors and its input (the attention's output) now, the attention's behind them.
      RETURN_IF_ERROR(PrepareAdaptiveBackward(st.micro, attn + 1, attn, reserve(attn + 1)));
    }
    if (ls.moe) {
      RETURN_IF_ERROR(MoeBlockBackward(ctx, dims, LayerMoe(moe, shard_.first_layer + i), off, p, g,
                                       ls.moe_saved, ls.attn.out, aux_scale, dres));
    } else {
      RETURN_IF_ERROR(MlpBlockBackward(ctx, dims, shard_.local_dense_ffn(config_), off, p, g,
                                       ls.mlp, ls.attn.out, dres));
    }
    cur_module_ = attn;
    if (adaptive()) {
      // The attention's tensors and its input (x_in) now; the module below's behind them.
      RETURN_IF_ERROR(PrepareAdaptiveBackward(st.micro, attn, attn - 1, reserve(attn)));
    }
    RETURN_IF_ERROR(AttentionBlockBackward(ctx, dims, off, p, g, ls.attn, x_in, dres));
  }
  if (shard_.first_stage()) {
    cur_module_ = 0;
    if (adaptive()) RETURN_IF_ERROR(PrepareAdaptiveBackward(st.micro, 0, kNoModule, reserve(0)));
    return EmbeddingBackward(ctx, dims, st.embedding, dres, g + layout_.wte, g + layout_.wpe);
  }
  RETURN_IF_ERROR(tensor::CopyOnDevice(device_, dx_in, dres, F32Bytes(NC)));
  return stash_.Release(st.input);
}

absl::Status GptMoe::ReleaseBehindEvaluation(StashHandle keep) {
  if (!evaluating_) return absl::OkStatus();
  for (const StashEntrySummary& e : stash_.Summaries()) {
    if (e.handle.id != keep.id) RETURN_IF_ERROR(stash_.Release(e.handle));
  }
  return absl::OkStatus();
}

train::MicroBatchResult GptMoe::Summarize(const ForwardState& st) const {
  train::MicroBatchResult r;
  r.routing_spike = st.routing_spike;
  if (shard_.last_stage()) {
    r.loss = st.head.ce_sum / (static_cast<double>(st.B) * config_.seq_len);
  }
  r.tokens_per_expert.resize(config_.num_moe_layers());
  int moe_index = 0;
  for (int l = 0; l < config_.layers; ++l) {
    if (!config_.IsMoeLayer(l)) continue;
    if (shard_.HoldsLayer(config_, l)) {
      const LayerState& ls = st.layers[l - shard_.first_layer];
      r.aux_loss += ls.moe_saved.aux;
      r.tokens_per_expert[moe_index] = ls.moe_saved.routed;
      r.dropped += ls.moe_saved.dropped;
    }
    ++moe_index;
  }
  return r;
}

absl::StatusOr<train::MicroBatchResult> GptMoe::ForwardBackward(const int32_t* inputs,
                                                                const int32_t* targets, int B,
                                                                double ce_scale, double aux_scale) {
  if (shard_.stages != 1) {
    return absl::FailedPreconditionError(
        "ForwardBackward runs a single-stage model; use "
        "StageForward / StageBackward for pipeline stages");
  }
  RETURN_IF_ERROR(CheckInputs(inputs, targets, B));
  StashGuard guard(stash_);
  arena_.ResetPeak();
  predicted_peak_ = 0;
  stash_.set_micro_batch(0);
  cur_micro_ = 0;
  ASSIGN_OR_RETURN(ForwardState st, Forward(inputs, targets, nullptr, B));
  RETURN_IF_ERROR(TimedBackward(st, nullptr, ce_scale, aux_scale, nullptr));
  train::MicroBatchResult r = Summarize(st);
  r.activation_peak_bytes = static_cast<int64_t>(arena_.peak_bytes());
  r.predicted_peak_bytes = predicted_peak_;
  return r;
}

absl::StatusOr<train::MicroBatchResult> GptMoe::Evaluate(const int32_t* inputs,
                                                         const int32_t* targets, int B) {
  if (shard_.stages != 1) {
    return absl::FailedPreconditionError("Evaluate runs a single-stage model");
  }
  arena_.ResetPeak();
  ASSIGN_OR_RETURN(train::MicroBatchResult r,
                   ForwardOnly(inputs, targets, nullptr, B, nullptr, /*spikes=*/true));
  r.activation_peak_bytes = static_cast<int64_t>(arena_.peak_bytes());
  return r;
}

absl::StatusOr<train::MicroBatchResult> GptMoe::StageEvaluate(const int32_t* inputs,
                                                              const int32_t* targets,
                                                              const float* x_in, int B,
                                                              float* x_out) {
  return ForwardOnly(inputs, targets, x_in, B, x_out, /*spikes=*/false);
}

absl::StatusOr<train::MicroBatchResult> GptMoe::ForwardOnly(const int32_t* inputs,
                                                            const int32_t* targets,
                                                            const float* x_in, int B, float* x_out,
                                                            bool spikes) {
  if (!in_flight_.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("evaluation while ", in_flight_.size(), " micro-batches are in flight"));
  }
  RETURN_IF_ERROR(CheckInputs(shard_.first_stage() ? inputs : nullptr,
                              shard_.last_stage() ? targets : nullptr, B));
  StashGuard guard(stash_);
  stash_.set_micro_batch(0);
  cur_micro_ = 0;
  evaluating_ = true;
  const int64_t step = step_;
  if (!spikes) step_ = -1;  // no step: no routing spike
  absl::StatusOr<ForwardState> forward = Forward(inputs, targets, x_in, B);
  step_ = step;
  evaluating_ = false;
  if (!forward.ok()) return forward.status();
  const ForwardState& st = *forward;
  train::MicroBatchResult r = Summarize(st);
  if (!shard_.last_stage()) {
    const StashHandle top = st.layers.empty() ? st.first_input() : st.layers.back().out();
    ModuleContext ctx = Context();
    ASSIGN_OR_RETURN(const float* o, GetF32(ctx, top));
    RETURN_IF_ERROR(tensor::CopyOnDevice(device_, x_out, o, F32Bytes(ActivationFloats(B))));
  }
  return r;
}

absl::StatusOr<train::MicroBatchResult> GptMoe::StageForward(int micro, const int32_t* inputs,
                                                             const int32_t* targets,
                                                             const float* x_in, int B,
                                                             float* x_out) {
  if (in_flight_.count(micro) != 0) {
    return absl::FailedPreconditionError(absl::StrCat("micro-batch ", micro, " is in flight"));
  }
  RETURN_IF_ERROR(CheckInputs(shard_.first_stage() ? inputs : nullptr,
                              shard_.last_stage() ? targets : nullptr, B));
  stash_.set_micro_batch(micro);
  cur_micro_ = micro;
  ASSIGN_OR_RETURN(ForwardState st, Forward(inputs, targets, x_in, B));
  train::MicroBatchResult r = Summarize(st);
  if (!shard_.last_stage()) {
    const StashHandle top = st.layers.empty() ? st.first_input() : st.layers.back().out();
    ModuleContext ctx = Context();
    ASSIGN_OR_RETURN(const float* o, GetF32(ctx, top));
    RETURN_IF_ERROR(tensor::CopyOnDevice(device_, x_out, o, F32Bytes(ActivationFloats(B))));
  }
  in_flight_[micro] = std::make_unique<ForwardState>(std::move(st));
  max_in_flight_ = std::max(max_in_flight_, static_cast<int>(in_flight_.size()));
  return r;
}

absl::Status GptMoe::StageBackward(int micro, const float* dx_out, double ce_scale,
                                   double aux_scale, float* dx_in) {
  auto it = in_flight_.find(micro);
  if (it == in_flight_.end()) {
    return absl::FailedPreconditionError(absl::StrCat("micro-batch ", micro, " is not in flight"));
  }
  std::unique_ptr<ForwardState> st = std::move(it->second);
  in_flight_.erase(it);
  // Under 1F1B this micro-batch's backward runs beside the saved tensors of those still in flight.
  int64_t others = 0;
  for (const auto& [m, other] : in_flight_) others += other->declared_saved;
  predicted_peak_ = std::max(predicted_peak_, others + st->declared_peak);
  return TimedBackward(*st, dx_out, ce_scale, aux_scale, dx_in);
}

absl::Status GptMoe::SetMemoryPolicy(memory::MemoryPolicy policy) {
  if (!in_flight_.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "memory policy: cannot change while ", in_flight_.size(), " micro-batches are in flight"));
  }
  policy_ = policy;
  if (policy == memory::MemoryPolicy::kAdaptive) {
    // Nothing up front; the planner's drops of tensors not saved yet, as they are saved.
    stash_.SetSavePolicy([this](const StashEntryInfo& e) { return FutureDrop(e); });
  } else if (policy == memory::MemoryPolicy::kNone || policy == memory::MemoryPolicy::kOffload) {
    stash_.SetSavePolicy(nullptr);  // drops nothing (offload acts through SetOffload)
  } else {
    stash_.SetSavePolicy([policy](const StashEntryInfo& e) {
      return memory::StaticSaveAction(policy, memory::TensorTag(e.producer));
    });
  }
  return absl::OkStatus();
}

void GptMoe::AbandonMicroBatches() {
  in_flight_.clear();
  unread_times_.clear();  // an abandoned step's spans say nothing of an ordinary micro-batch
  moved_.clear();
  planned_.clear();
  future_drops_.clear();
  deferred_.clear();
  stash_.ReleaseAll();
}

int64_t GptMoe::ActivationBytesForRouting(int B,
                                          const std::vector<int64_t>& rows_per_moe_layer) const {
  std::vector<MoeRows> rows;
  for (int64_t S : rows_per_moe_layer) rows.push_back(MoeRows::SingleRank(S));
  return ComposePeak(DeclaredModulesOf(config_, ModelShard{}, B, rows, policy_),
                     ResidualGradBytes(config_, B));
}

std::vector<ModuleBytes> GptMoe::DeclaredModules(int B, const std::vector<MoeRows>& rows) const {
  // The policy's drops; adaptive and offload keep everything up front.
  return DeclaredModulesOf(config_, shard_, B, rows, policy_);
}

int64_t GptMoe::PredictPeakBytes(int B, const std::vector<MoeRows>& rows) const {
  return ComposePeak(DeclaredModules(B, rows), ResidualGradBytes(config_, B));
}

MoeExchange GptMoe::Exchange() const {
  // The MoE layers' schedule (the first layer's; auto gives every layer the same).
  const std::vector<moe::Schedule> schedules = MoeSchedules();
  return {schedules.empty() ? moe::Schedule::kDeepspeed : schedules.front(), groups_.esp_is_tp};
}

int64_t GptMoe::MinimumActivationBytes(int B) const {
  return model::MinimumActivationBytes(config_, shard_, B, Exchange());
}

std::optional<int64_t> GptMoe::RoutingBoundActivationBytes(int B) const {
  return model::RoutingBoundActivationBytes(config_, shard_, B, Exchange());
}

int64_t GptMoe::InFlightBackwardRise() const {
  int64_t rise = 0;
  for (const auto& [m, other] : in_flight_) {
    // What the planner moved out of it comes back for its backward too.
    int64_t moved = 0;
    if (auto it = moved_.find(m); it != moved_.end()) {
      for (int64_t b : it->second) moved += b;
    }
    rise = std::max(rise, other->declared_peak - other->declared_saved + moved);
  }
  return rise;
}

void GptMoe::NotePrediction(ForwardState& s) {
  // Called at the end of a forward, before the micro-batch joins in_flight_.
  s.declared = DeclaredModules(s.B, s.rows);
  s.declared_saved = 0;
  for (const ModuleBytes& m : s.declared) s.declared_saved += m.saved;
  s.declared_peak = ComposePeak(s.declared, ResidualGradBytes(config_, s.B));
  int64_t others = 0;
  for (const auto& [m, other] : in_flight_) others += other->declared_saved;
  predicted_peak_ = std::max(predicted_peak_, others + s.declared_peak);
}

int64_t GptMoe::ActivationBytes(int B) const {
  const int64_t dropless_rows = int64_t{B} * config_.seq_len * config_.top_k;
  return ActivationBytesForRouting(B,
                                   std::vector<int64_t>(config_.num_moe_layers(), dropless_rows));
}

double GptMoe::FlopsPerToken() const {
  const ModelConfig& c = config_;
  const int64_t d = c.d_model;
  int64_t active = global_params_ - int64_t{c.seq_len} * d;  // wpe left out; tied wte once
  const int64_t per_expert = 2 * d * c.expert_ffn + c.expert_ffn + d;
  active -= int64_t{c.num_moe_layers()} * (c.experts - c.top_k) * per_expert;
  return 6.0 * static_cast<double>(active) + 12.0 * c.layers * c.seq_len * d;
}

// ---- Static stash actions ----

absl::Status GptMoe::SetCopyTargets(memory::CopyEngine* engine, tensor::HostPool* host,
                                    const char* what) {
  if (engine != nullptr && &engine->device() != &device_) {
    return absl::InvalidArgumentError("GptMoe: the copy engine belongs to another device");
  }
  if ((engine == nullptr) != (host == nullptr)) {
    return absl::InvalidArgumentError("GptMoe: offload needs both a copy engine and a host pool");
  }
  if (!in_flight_.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        what, ": cannot change while ", in_flight_.size(), " micro-batches are in flight"));
  }
  stash_.SetOffloadTargets(engine, host);
  return absl::OkStatus();
}

absl::Status GptMoe::SetOffload(double ratio, memory::CopyEngine* engine, tensor::HostPool* host) {
  if (!(ratio >= 0 && ratio <= 1)) {
    return absl::InvalidArgumentError(absl::StrCat("offload ratio must be in [0, 1], got ", ratio));
  }
  RETURN_IF_ERROR(SetCopyTargets(engine, host, "offload"));
  offload_ratio_ = engine == nullptr ? 0 : ratio;
  engine_ = engine;
  return absl::OkStatus();
}

namespace {

// The MoE layer's expert buffers, the ones whose size follows routing.
std::vector<StashHandle> ExpertBuffers(const MoeSaved& s) { return {s.xin, s.pre, s.hidden, s.eo}; }

}  // namespace

absl::Status GptMoe::ActAfterMoeForward(const MoeSaved& saved) {
  RETURN_IF_ERROR(ApplyDeferred(saved));
  if (adaptive() && adaptive_options_.drop_group != nullptr && saved.distributed) {
    for (StashHandle h : {saved.xin, saved.eo}) {  // slots 2i, 2i + 1 (AgreeCollectiveDrops)
      const std::optional<StashEntryInfo> e = stash_.Info(h);
      if (!e) return absl::InternalError("adaptive: an expert buffer left before its backward");
      agreeable_.push_back({h, e->layer, std::string(memory::TensorTag(e->producer)),
                            static_cast<int64_t>(e->bytes)});
    }
  }
  // This layer's four expert buffers by handle (not a scan of every live entry: that would be
  // O(layers^2) per micro-batch).
  if (compress_) {
    for (StashHandle h : ExpertBuffers(saved)) {
      const std::optional<StashEntryInfo> e = stash_.Info(h);
      if (e && memory::IsCompressible(e->producer, *compress_)) {
        RETURN_IF_ERROR(stash_.Compress(h, *compress_));
      }
    }
  }
  if (offload_ratio_ <= 0 || engine_ == nullptr) return absl::OkStatus();
  std::vector<StashHandle> kept;
  std::vector<uint64_t> bytes;
  for (StashHandle h : ExpertBuffers(saved)) {
    const std::optional<StashEntryInfo> e = stash_.Info(h);
    if (e && e->state == StashState::kKept) {
      kept.push_back(h);
      bytes.push_back(e->bytes);
    }
  }
  // The buffers whose bytes come closest to the ratio of them (at least one: a buffer is the
  // unit), submitted largest first.
  std::vector<size_t> chosen = memory::OffloadShare(bytes, offload_ratio_);
  std::stable_sort(chosen.begin(), chosen.end(),
                   [&](size_t a, size_t b) { return bytes[a] > bytes[b]; });
  for (size_t i : chosen) RETURN_IF_ERROR(stash_.Offload(kept[i]));
  return absl::OkStatus();
}

absl::Status GptMoe::PrefetchForBackward(const ForwardState& st, int layer_index) {
  if (engine_ == nullptr) return absl::OkStatus();
  // This layer's buffers if it is an MoE layer (needed now, unless their reload already started),
  // then those of the next MoE layer down, so that their reload overlaps this layer's backward.
  // The look-ahead is best effort: where the arena has no room for it yet, that layer's own
  // Acquire reloads it once this layer's backward has released its tensors.
  const int want = st.layers[layer_index].moe ? 2 : 1;
  int found = 0;
  for (int i = layer_index; i >= 0 && found < want; --i) {
    if (!st.layers[i].moe) continue;
    const absl::Status s = stash_.Prefetch(ExpertBuffers(st.layers[i].moe_saved));
    if (!s.ok() && (i == layer_index || !absl::IsResourceExhausted(s))) return s;
    ++found;
  }
  return absl::OkStatus();
}

}  // namespace furnace::model
