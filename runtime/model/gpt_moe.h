// GptMoe: the GPT with Mixture-of-Experts layers of MODEL.md, single process, fp32, on its device's
// backend (runtime/device/backend.h; on the CPU backend it is the oracle every parallel layout and
// memory policy is compared with).
//
// Parameters and gradients are one flat fp32 array each (ParamLayout), each one allocation of the
// device's memory outside the activation arena (tensor::DeviceMemory), initialised on the host
// and uploaded at creation. At model.precision bf16 a third, a bf16 mirror of the parameters
// (half their bytes), spares the GEMMs rounding their weights per call (runtime/device/
// weight_mirror.h; re-rounded once per step, before the first forward after the update).
// Activations come from the DeviceArena given at creation and everything saved for backward goes
// through the Stash, so a memory planner sees every saved tensor. ForwardBackward frees everything
// it allocated before it returns, on success and on error.
//
// Devices and streams (train::Trainable has the contract): every op goes through the device's
// backend, on the calling thread's current stream (device::StreamScope; none: the device's default
// stream), so on a discrete device (emulated, CUDA) the model enqueues and the host runs ahead.
// The host transfers of the data path, and the only places the host waits for the stream:
//   tokens and targets in      (UploadRing: pinned staging, no wait unless the ring comes round);
//   each MoE layer's forward   the top-k indices (and under s1 the router probabilities) copied
//                              to the host and the stream synchronised: the dispatch plan is built
//                              on the host from them (backend.h), and the aux loss comes back as a
//                              host scalar (aux_loss_forward synchronises too); backward and the
//                              rebuilds reuse the host indices (MoeSaved::host_indices), so they
//                              do not wait;
//   the head's forward         the per-token losses copied back and the stream synchronised (the
//                              loss is a host value), and the logits when captured;
//   collectives                a communicator over a host transport (comm::ForDevice) stages
//                              device buffers through the host and synchronises per call.
// Everything else (residual adds, the tied head's transpose, the stage activations in and out,
// zero fills) stays on the stream. On the CPU device every op has finished when it returns, and
// the results are bit-identical to the host loops these ops replaced.
//
// Declared activation bytes: each module states its saved bytes and its forward / backward peaks
// by replaying its own allocation order (module.h). ActivationBytesForRouting(B, rows) composes
// them into the arena peak of one ForwardBackward on an otherwise empty arena; it is exact (tests
// compare it with DeviceArena::peak_bytes() byte for byte). Only the MoE expert buffers depend on
// routing, through S = rows kept per MoE layer; dropless S is always N * k, so ActivationBytes(B)
// is exact dropless and an upper bound with a capacity.
// They describe policy none: with stash actions (SetOffload, SetCompress) the arena peak differs.
//
// Memory policy (SetMemoryPolicy, runtime/memory/policy.h): the stash drops the tensors the
// policy names once their module's forward is done, and each module's backward rebuilds them
// first (Stash::Acquire). Results are bit-identical to `none`; the declared bytes follow the
// policy (each dropped tensor leaves the saved bytes and is rebuilt, with its scratch, at the
// start of its module's backward).
//
// Parallel layouts: created with a ModelShard (and the groups it talks to), the model holds only
// that shard's parameters (BuildParamLayout), initialised to exactly the values the whole model
// has at the same indices, and runs one pipeline stage per micro-batch: StageForward takes the
// tokens (first stage) or the previous stage's activation, StageBackward the next stage's
// gradient; micro-batches may be in flight together (1F1B). ForwardBackward and Evaluate need a
// single-stage shard. The declared activation bytes describe the whole model on one rank.
//
// The memory model (per rank): DeclaredModules / PredictPeakBytes compose the same module
// declarations for this rank's shard: its stage's modules only (the embedding on the first stage,
// the received activation on the others, the head on the last), attention and dense MLP at the TP
// width, and each MoE layer at its MoeRows (S routed here, R processed by this rank's experts with
// the ESP width, the dispatch scratch). On a single-stage layout the prediction is exact for the
// static policies (tests compare it with the arena's peak byte for byte); with micro-batches in
// flight (1F1B) the model adds the declared saved bytes of the others in flight, an upper bound.
// PredictedPeakBytes reports the prediction for the rows each micro-batch actually had.
//
// The adaptive policy (SetAdaptive, memory.policy adaptive): after each MoE layer's token counts
// are exchanged, the model projects the rest of the micro-batch with the memory model on top of
// what the arena holds now (later MoE layers counted with no received rows: only a certain deficit
// is acted on), plus the saved bytes of the micro-batches its 1F1B stage has not started yet, one
// point per module of the timeline. If every point fits the budget (less a margin), nothing
// happens. If not, memory::CoverDeficits picks the cheapest actions per freed byte among the
// tensors that help at the points that are short (earlier layers and micro-batches, acted on at
// once; this layer's expert buffers, acted on right after its forward; the attention
// probabilities, qkv, norm, GELU, dense MLP and expert pre-activation outputs later modules save,
// dropped when their module's forward ends; attention probabilities come back from qkv through
// attention_probs, the forward's own scores and softmax, qkv and the MLP pre-activation from the
// norm's output by their GEMM, the attention's output under recomputed probabilities by its
// forward again): offload the copy engine can hide, then
// reduced precision (only when a codec is allowed), then recompute (a tensor whose rebuild needs
// a collective only by agreement: below). If the arena still refuses an allocation,
// an emergency offload (MakeRoom) takes the largest tensors nothing running reads out of the arena
// (dropped where a per-rank rebuild exists, else offloaded and waited for) before the step fails.
// Offload and recompute are bit-exact, so adaptive without a codec trains bit-identically to
// none. Costs are measured online: the compute time of a micro-batch (hence the FLOP rate of a
// rebuild and the copy time the compute can hide, a share of it that late reloads shrink:
// memory::NextHiddenShare), the host link (copy_engine.h), the MoE exchanges' time per byte (what
// re-running the all-to-all costs: the stream time on stream communicators), the casts at start.
//
// Collective drops. On an expert-parallel layout a layer's expert input and combined output come
// back only by re-running the all-to-all on every rank of its groups together, so one rank alone
// may not drop them. With a drop group (AdaptiveOptions::drop_group), at the last MoE layer of
// each micro-batch (after its token-count exchange: the projection is exact, every layer routed)
// every rank states which of the micro-batch's such buffers (every MoE layer's, this one's
// included) its plan would drop, a plan that fits wishing none, and which of the earlier ones it
// no longer can (offloaded, compressed, rebuilt from a compressed input: Stash::CanDropAgreed);
// one all-gather over the group (16 bytes a rank up to 32 MoE layers) ORs them, and every rank
// drops what some rank wished and none refused: the earlier layers' at once (Stash::DropAgreed),
// this layer's after its forward through the save policy, as full_recompute does. Their rebuilds
// then run on every rank in the same backward, in the same order. A rank whose own plan differs
// from the agreement plans again with the agreed drops counted and the others ruled out. The
// earlier MoE layers plan per rank. That all-gather synchronises every rank, which ordinary steps
// should not pay (on 4 ranks sharing 2 CPUs, one per MoE layer cost 14% of a step), so the ranks
// agree only on a run's first step and on steps after one in which some rank's memory ran short
// (a projection found a deficit, or the emergency path ran: CollectiveDropVote, OR-ed by the
// trainer in the step's world all-reduce it runs anyway: SetAgreeCollectiveDrops). Under a
// budget that keeps binding every step agrees; a spike after steps that fitted is planned per
// rank (those buffers kept or offloaded, the emergency path as the net) and the steps after it
// agree. Without a drop group (or on a pipeline) every plan is per rank.
//
// Routing spikes (config.spikes, spikes.h): on a spike step each MoE layer adds its spike to the
// router logits of its forced tokens. Which step and which tokens come from SetStepContext, which
// the training loop calls before every micro-batch; a micro-batch in flight keeps its spikes.
//
// Thread-safety: one thread at a time. Errors: InvalidArgument for bad inputs (token ids outside
// [0, V), B < 1); ResourceExhausted from the arena when the budget is too small (the gradients may
// then hold a partial accumulation: the step must be given up or retried after ZeroGrad); the
// device's errors (a failed kernel, a stream mark that cannot be made or read) as it gives them.
#pragma once

#include <algorithm>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/comm/stream_marks.h"
#include "runtime/device/backend.h"
#include "runtime/device/device.h"
#include "runtime/device/weight_mirror.h"
#include "runtime/memory/codec.h"
#include "runtime/memory/copy_engine.h"
#include "runtime/memory/planner.h"
#include "runtime/memory/policy.h"
#include "runtime/model/config.h"
#include "runtime/model/module.h"
#include "runtime/model/moe_block.h"
#include "runtime/model/param_layout.h"
#include "runtime/model/shard.h"
#include "runtime/model/stash.h"
#include "runtime/moe/executor.h"
#include "runtime/moe/schedule.h"
#include "runtime/tensor/arena.h"
#include "runtime/tensor/device_memory.h"
#include "runtime/tensor/host_pool.h"
#include "runtime/tensor/transfer.h"
#include "runtime/trainable/trainable.h"

namespace furnace::model {

struct ForwardState;

// Marks around a span of work on a stream (comm/stream_marks.h): its stream time, once passed.
struct StreamSpan {
  std::unique_ptr<comm::StreamMark> begin, end;
};

class GptMoe final : public train::PipelineStage, private MemoryHooks {
 public:
  // `device` and `activations` must outlive the model. The model computes with the device's
  // backend at `precision` (device::BackendFor(device, precision)); a device and precision without
  // one are refused with BackendFor's error, which names the device and the precision.
  // `shard` must fit `config` (runtime/topology validates layouts); the groups must outlive the
  // model and take buffers of `device` (comm::ForDevice over a host transport). ResourceExhausted
  // when the device cannot hold the parameters and gradients.
  static absl::StatusOr<std::unique_ptr<GptMoe>> Create(
      const ModelConfig& config, uint64_t seed, device::Device& device,
      tensor::DeviceArena& activations, const ModelShard& shard = {}, ParallelGroups groups = {},
      device::Precision precision = device::Precision::kFp32);
  ~GptMoe() override;

  // train::Trainable.
  const std::vector<train::ParamInfo>& params() const override { return layout_.params; }
  int64_t num_params() const override { return layout_.total; }
  device::Device& device() override { return device_; }
  // Tests: GEMMs round their weights per call again (the bf16 weight mirror unregistered), to show
  // the mirror changes nothing.
  void DisableWeightMirrorForTest() { mirror_registration_ = device::WeightMirror(); }
  // Marks the bf16 weight mirror stale (below): whoever takes the array may write it.
  float* param_data() override {
    mirror_stale_ = true;
    return params_.as<float>();
  }
  float* grad_data() override { return grads_.as<float>(); }
  void ZeroGrad() override;
  absl::StatusOr<train::MicroBatchResult> ForwardBackward(const int32_t* inputs,
                                                          const int32_t* targets, int B,
                                                          double ce_scale,
                                                          double aux_scale) override;
  absl::StatusOr<train::MicroBatchResult> Evaluate(const int32_t* inputs, const int32_t* targets,
                                                   int B) override;
  int seq_len() const override { return config_.seq_len; }
  int vocab() const override { return config_.vocab; }
  double FlopsPerToken() const override;
  // Routing spikes (config.spikes, spikes.h) are drawn for this step and these sequences. Before
  // the first call the model has no step and injects no spike.
  void SetStepContext(int64_t step, int64_t first_global_sequence) override;
  // The stash's action counters: bytes rebuilt after a drop, offloaded, stored compressed; late
  // reloads.
  train::MemoryActionTotals MemoryActions() const override;
  std::vector<train::MoeOpTotal> MoeOps() const override;
  std::vector<std::string> MoeScheduleNames() const override;
  bool CollectiveDropVote() const override { return ran_short_; }
  void SetAgreeCollectiveDrops(bool on) override {
    agree_this_step_ = on;
    ran_short_ = false;
  }

  // One micro-batch through this stage. `micro` names it until its StageBackward. inputs: (B, T)
  // token ids on the first stage (else ignored); targets: (B, T) on the last stage (else
  // ignored); x_in: (B, T, C) the previous stage's output on later stages; x_out: (B, T, C)
  // receives this stage's output unless it is the last. The result has the loss on the last
  // stage only, and tokens_per_expert for every MoE layer of the model (empty where this stage
  // does not hold the layer).
  absl::StatusOr<train::MicroBatchResult> StageForward(int micro, const int32_t* inputs,
                                                       const int32_t* targets, const float* x_in,
                                                       int B, float* x_out) override;
  // dx_out: (B, T, C) d loss / d this stage's output (ignored on the last stage, which starts
  // from its loss); dx_in: (B, T, C) receives d loss / d x_in unless this is the first stage.
  absl::Status StageBackward(int micro, const float* dx_out, double ce_scale, double aux_scale,
                             float* dx_in) override;
  // Forward only through this stage (held-out evaluation; train::PipelineStage): like
  // StageForward, but everything it saved is freed before it returns, routing spikes are off and
  // the adaptive planner does not act. Evaluate is this on a single-stage model, with the step's
  // routing spikes (Trainable::Evaluate).
  absl::StatusOr<train::MicroBatchResult> StageEvaluate(const int32_t* inputs,
                                                        const int32_t* targets, const float* x_in,
                                                        int B, float* x_out) override;
  int64_t ActivationFloats(int B) const override {
    return int64_t{B} * config_.seq_len * config_.d_model;
  }
  int64_t PredictedPeakBytes() const override { return predicted_peak_; }
  void SetInFlightLimit(int micro_batches) override { max_in_flight_ = std::max(1, micro_batches); }
  // Micro-batches between StageForward and StageBackward.
  int in_flight() const { return static_cast<int>(in_flight_.size()); }
  // Drops every in-flight micro-batch (after an error: the step is given up).
  void AbandonMicroBatches() override;
  void ResetActivationPeak() override {
    arena_.ResetPeak();
    predicted_peak_ = 0;
  }
  int64_t ActivationPeakBytes() const override { return static_cast<int64_t>(arena_.peak_bytes()); }
  int num_experts() const override { return config_.experts; }

  // The ops the model computes with (its device's backend).
  const device::Backend& backend() const { return ops_; }
  const ModelShard& shard() const { return shard_; }
  const ModelConfig& config() const { return config_; }
  const ParamLayout& layout() const { return layout_; }
  // nullptr when there is no parameter of that name.
  const train::ParamInfo* FindParam(const std::string& name) const;

  // Declared activation bytes (see the file comment). rows_per_moe_layer: S of each MoE layer in
  // layer order.
  int64_t ActivationBytesForRouting(int B, const std::vector<int64_t>& rows_per_moe_layer) const;
  int64_t ActivationBytes(int B) const;
  // S of each MoE layer (this stage's) in the last forward.
  std::vector<int64_t> last_rows_per_moe_layer() const {
    std::vector<int64_t> S;
    for (const MoeRows& r : fwd_rows_) S.push_back(r.S);
    return S;
  }
  // Bytes held by the stash at the end of the last forward (everything saved for backward).
  uint64_t last_stashed_bytes() const { return last_stashed_bytes_; }

  // ---- The memory model (per rank; see the file comment) ----
  // This stage's modules in forward order for one micro-batch of B sequences whose MoE layers
  // (this stage's, in order) have `rows`; a missing entry repeats the last one given (none given:
  // dropless single-rank rows, S = R = N k).
  std::vector<ModuleBytes> DeclaredModules(int B, const std::vector<MoeRows>& rows) const;
  // The arena peak of one micro-batch through this stage on an otherwise empty arena.
  int64_t PredictPeakBytes(int B, const std::vector<MoeRows>& rows) const;
  // A floor no memory policy goes below for one micro-batch of B sequences on this rank, whatever
  // it drops or moves: the largest of its modules' forward peak and of its backward (all its own
  // saved tensors back, its scratch, the residual-stream gradient), each beside the module's input
  // (the module before's output), with balanced dropless rows
  // (S = N k; R = S times the ESP width, S with sliced experts) under the MoE layers' schedule.
  // A budget below it cannot train.
  int64_t MinimumActivationBytes(int B) const;
  // The same floor for the most rows routing can send this rank (expert parallelism, tp 1): with
  // a capacity_factor, each source rank gives each expert at most its capacity; dropless, each
  // source's every token sends one row to each of its k experts that lives here (at most
  // min(k, local experts) rows a token: every token routed to this rank). A budget at or above
  // it leaves room for any routing. The floor itself on one rank (whose rows are at most N k);
  // nullopt with tp > 1 (not computed).
  std::optional<int64_t> RoutingBoundActivationBytes(int B) const;

  // ---- The MoE layers' schedules (runtime/moe/schedule.h) ----
  // One per MoE layer of the whole model, in layer order (default: deepspeed everywhere). Every
  // rank of the job must set the same list before its first step. With tp == 1 every schedule
  // runs as deepspeed. Sets how each layer's gradients are reduced over tp (ParamInfo::tp_partial).
  absl::Status SetMoeSchedules(const std::vector<moe::Schedule>& per_moe_layer);
  // The schedule each MoE layer of the model runs (tp == 1: deepspeed), in layer order.
  std::vector<moe::Schedule> MoeSchedules() const;
  // Whether schedule `s` slices this rank's experts (moe::SlicedExperts on its groups).
  bool SlicedExperts(moe::Schedule s) const;
  // moe.schedule auto's trial (runtime/moe/trial.h): this stage's first MoE layer, forward and
  // backward under `schedule`, on a micro-batch of B sequences whose input (x_host) and output
  // gradient (dout_host) the caller gives (host memory, B * seq_len * d_model floats each; the
  // same on the tp peers of a data-parallel replica, as after attention), with the model's
  // parameters, device, groups and memory policy (its drops and their rebuilds; no planner, and
  // offload only if the stash has its copy engine already); the seconds from the first kernel to
  // its completion on the device. Collective on the layer's groups (every rank of the stage calls
  // it alike). Every gradient is zeroed and the activation peak reset before it returns (so: before
  // the first step only; FailedPrecondition with micro-batches in flight); the parameters are
  // untouched. 0 when the stage holds no MoE layer.
  absl::StatusOr<double> TimeMoeLayer(moe::Schedule schedule, int B, const float* x_host,
                                      const float* dout_host);
  // The arena's budget in bytes (0: unlimited).
  uint64_t device_budget() const { return arena_.budget(); }
  // What the schedules' ops moved on this rank so far, per op (executor.h).
  const moe::ExchangeCounters& moe_op_counters() const { return moe_counters_; }

  // When on, each forward copies its logits (B, T, V) to the host for last_logits() (a host
  // transfer: the stream is synchronised for it).
  void set_capture_logits(bool on) { capture_logits_ = on; }
  const std::vector<float>& last_logits() const { return last_logits_; }

  Stash& stash() { return stash_; }

  // ---- Static stash actions (memory.policy offload; compress for tests and benchmarks) ----
  // The static `offload` policy: after each MoE layer's forward, the largest of its expert buffers
  // (expert input, pre-activation, hidden, output) are offloaded through `engine` to `host`,
  // largest first, each one that still fits within ratio x their total bytes; they are prefetched
  // when the backward reaches the layer above (one MoE layer ahead) and acquired by the layer's
  // backward. Bit-exact. ratio 0 or a null engine: off. `engine` (on this model's device) and
  // `host` must outlive the model. InvalidArgument for a ratio outside [0, 1] or an engine of
  // another device.
  absl::Status SetOffload(double ratio, memory::CopyEngine* engine, tensor::HostPool* host);
  // After each MoE layer's forward, every expert buffer the codec may store (codec.h whitelist)
  // is stored compressed; nullopt: off. Not bit-exact (see codec.h for the tolerance).
  void SetCompress(std::optional<memory::Codec> codec) { compress_ = codec; }
  double offload_ratio() const { return offload_ratio_; }
  // The static memory policy, for every later forward (and the declared bytes). FailedPrecondition
  // while micro-batches are in flight.
  absl::Status SetMemoryPolicy(memory::MemoryPolicy policy);
  memory::MemoryPolicy memory_policy() const { return policy_; }

  // ---- The adaptive policy (see the file comment) ----
  struct AdaptiveOptions {
    double margin = 0.02;                // share of the budget the projection keeps free
    std::optional<memory::Codec> codec;  // reduced precision allowed (not bit-exact); nullopt: off
    // The ranks that agree on collective drops (see "Collective drops" in the file comment): every
    // rank of the job, on a single-stage layout (they run every MoE layer's forward in the same
    // order). nullptr, or a layout of several stages: drops stay per rank.
    comm::Communicator* drop_group = nullptr;
  };
  // Takes effect with SetMemoryPolicy(kAdaptive). `engine` and `host` (both or neither; neither:
  // no offload) must outlive the model. InvalidArgument for a margin outside [0, 0.5), an engine of
  // another device or one without the other; FailedPrecondition while micro-batches are in flight.
  absl::Status SetAdaptive(memory::CopyEngine* engine, tensor::HostPool* host,
                           AdaptiveOptions options);
  struct PlannerStats {
    int64_t decisions = 0;           // MoE layers where the planner acted
    int64_t emergency_offloads = 0;  // MakeRoom calls that freed something
    int64_t refused_actions = 0;     // planned actions the stash refused (the plan came up short)
    int64_t agreements = 0;          // the ranks' agreements on collective drops
    int64_t agreed_drops = 0;        // expert buffers dropped by them
    int64_t replans = 0;             // plans made again because the agreement differed
    double agreement_seconds = 0;    // in the agreements' all-gathers (waiting for the peers)
    double hidden_share = 1;         // of the compute ahead copies are taken to hide behind
    double seconds = 0;              // spent projecting and planning (not agreeing)
    // The device time of a micro-batch its costs assume (an average of those read: its forward
    // and backward spans); 0 before the first is read.
    double micro_batch_seconds = 0;
  };
  PlannerStats planner_stats() const {
    PlannerStats stats = planner_stats_;
    stats.micro_batch_seconds = micro_seconds_;
    stats.hidden_share = hidden_share_;
    return stats;
  }
  // Receives one line per planner decision and per emergency offload (the worker logs them at
  // debug level); nullptr: none.
  void SetPlannerLog(std::function<void(const std::string&)> log) { planner_log_ = std::move(log); }

 private:
  GptMoe(const ModelConfig& config, const device::Backend& ops, device::Device& device,
         tensor::DeviceArena& activations, const ModelShard& shard, ParallelGroups groups);

  absl::Status CheckInputs(const int32_t* inputs, const int32_t* targets, int B) const;
  // Evaluate and StageEvaluate: one forward that keeps nothing; `spikes`: with the step
  // context's routing spike (Evaluate) or none (held-out evaluation).
  absl::StatusOr<train::MicroBatchResult> ForwardOnly(const int32_t* inputs, const int32_t* targets,
                                                      const float* x_in, int B, float* x_out,
                                                      bool spikes);
  absl::StatusOr<ForwardState> Forward(const int32_t* inputs, const int32_t* targets,
                                       const float* x_in, int B);
  absl::Status Backward(const ForwardState& state, const float* dx_out, double ce_scale,
                        double aux_scale, float* dx_in);
  train::MicroBatchResult Summarize(const ForwardState& state) const;
  ModuleContext Context();

  const ModelConfig config_;
  const ModelShard shard_;
  const ParallelGroups groups_;
  std::vector<moe::Schedule> moe_schedules_;  // per model layer (dense layers: unused)
  moe::ExchangeCounters moe_counters_;
  MoeShape LayerMoe(const MoeShape& base, int layer) const;
  ParamLayout layout_;         // fixed at creation but for ParamInfo::tp_partial (SetMoeSchedules)
  int64_t global_params_ = 0;  // parameters of the whole model (for the FLOP count)
  std::map<int, std::unique_ptr<ForwardState>> in_flight_;
  const device::Backend& ops_;
  device::Device& device_;
  tensor::DeviceArena& arena_;
  Stash stash_;
  tensor::DeviceMemory params_;  // (num_params) memory of device_
  tensor::DeviceMemory grads_;   // (num_params) memory of device_
  // A bf16 table's weight mirror (runtime/device/weight_mirror.h): the parameters rounded to bf16
  // once, for every GEMM that reads a weight, instead of once per GEMM call. Refreshed at the start
  // of the first forward after param_data() was taken (the optimizer's update, a restore, a test),
  // on the current stream. Empty under fp32. The registration goes before the arrays it names.
  tensor::DeviceMemory mirror_;  // (num_params) bf16
  device::WeightMirror mirror_registration_;
  bool mirror_stale_ = true;
  absl::Status RefreshWeightMirror();
  tensor::UploadRing uploads_;  // the token and target uploads
  uint64_t last_stashed_bytes_ = 0;
  memory::MemoryPolicy policy_ = memory::MemoryPolicy::kNone;
  bool capture_logits_ = false;
  int64_t step_ = -1;  // SetStepContext; -1: none yet
  int64_t first_sequence_ = 0;
  std::vector<float> last_logits_;

  // ---- The adaptive policy (gpt_moe_adaptive.cc) ----
  absl::Status BeforeExpertBuffers(int layer, const MoeRows& rows) override;
  bool MakeRoom(uint64_t bytes) override;
  // The offloaded and compressed tensors that `module`'s backward reads (a DeclaredModules index;
  // its own and its input: ReadByModule) of micro-batch `micro`, brought back ahead of that
  // backward after making room for them, for the rebuilds of its dropped ones and for `reserve`
  // bytes of its scratch (one emergency before the module, not one per refused buffer); those of
  // `ahead_module` too where that leaves the room. One module at a time, as the memory model and
  // MinimumActivationBytes count them. Adaptive only.
  static constexpr int kNoModule = -1000;
  absl::Status PrepareAdaptiveBackward(int micro, int module, int ahead_module, int64_t reserve);
  // Whether the emergency offload must leave `e` in the arena: pinned, or read by the running
  // module (ReadByModule).
  bool Protected(const StashEntrySummary& e) const;
  // This rank's MoE exchange (its layers' schedule, its ESP group) for the declared floors.
  MoeExchange Exchange() const;
  // Whether module `module`, running (forward or backward), reads a tensor tagged `tag` that module
  // j saved in the same micro-batch.
  static bool ReadByModule(int j, std::string_view tag, int module);
  // Whether a tensor tagged `tag` is its module's output (the residual stream: the next module's
  // input, which that module's backward reads too).
  static bool IsModuleOutput(std::string_view tag);
  // The module whose backward first reads the tensor tagged `tag` that module j saved (of
  // `modules`): the next one for an output, j otherwise. It is back in the arena from there on.
  static int FirstBackwardReader(int j, std::string_view tag, int modules);
  // The module (DeclaredModules index) that saves the tensor tagged `tag` (memory::TensorTag) of
  // `layer` (-1: the embedding's or the head's).
  int ModuleIndexOf(int layer, std::string_view tag) const;
  int NumMoeLayersOfStage() const;
  // The largest rise of an in-flight micro-batch's backward above the bytes it holds now: its
  // declared backward rise plus what the planner moved out of it.
  int64_t InFlightBackwardRise() const;
  // Bytes the planner moved out of micro-batch `micro`, by the module whose backward first reads
  // them back (FirstBackwardReader; at least `modules` long).
  std::vector<int64_t>& MovedOf(int micro, int modules);
  std::map<int, std::vector<int64_t>> moved_;
  // Bytes the plan will drop from each module's tensors as they are saved (not saved yet).
  std::vector<int64_t>& PlannedOf(int micro, int modules);
  std::map<int, std::vector<int64_t>> planned_;
  // Per micro-batch: (layer, tag) of tensors later modules save that the plan drops as they are
  // saved (the stash's save policy under adaptive asks FutureDrop).
  std::map<int, std::set<std::pair<int, std::string>>> future_drops_;
  memory::SaveAction FutureDrop(const StashEntryInfo& e) const;
  // Collective drops. The buffers of this micro-batch's forward whose rebuild re-runs the
  // all-to-all, by slot: 2i the expert input and 2i + 1 the combined output of its i-th MoE layer
  // (appended after each MoE layer's forward, cleared at the next forward).
  struct Agreeable {
    StashHandle handle;
    int layer = 0;
    std::string tag;  // memory::TensorTag
    int64_t bytes = 0;
  };
  std::vector<Agreeable> agreeable_;
  // Whether the ranks agree during this step (true for a run's first step;
  // then as SetAgreeCollectiveDrops says), and whether this rank's memory ran short since (a
  // projection found a deficit, or the emergency path ran: its vote for the next step).
  bool agree_this_step_ = true;
  bool ran_short_ = false;
  // Per slot: wished by some rank of the drop group and refused by none (one all-gather; each
  // rank calls it once per micro-batch of a step that agrees, fitting or not).
  absl::StatusOr<std::vector<bool>> AgreeCollectiveDrops(const std::vector<bool>& wish,
                                                         const std::vector<bool>& cannot) const;
  // Seconds per byte the MoE exchanges have taken so far (0 before the first): what re-running
  // one costs. Their stream time where the expert groups are stream communicators.
  double ExchangeSecondsPerByte() const;
  // The plan's actions on the current MoE layer's own expert buffers, after its forward. An
  // action that fails is skipped (the emergency path is the net), never an error.
  absl::Status ApplyDeferred(const MoeSaved& saved);
  int NumModules() const;
  // The planner's costs follow the time each micro-batch takes on the compute stream: marks
  // (comm/stream_marks.h) around its forward and its backward, read once the stream has passed
  // them (at the end of the backward on the CPU device; on a discrete one at a later micro-batch,
  // as the host runs ahead), never by waiting. The host's clock would see only the enqueueing on a
  // GPU. Stream time counts what the stream waits for too (a late reload, a collective).
  struct MicroBatchTimes {
    int B = 0;
    StreamSpan forward, backward;
  };
  static constexpr size_t kMaxUnreadTimes = 64;  // bounds unread_times_ should the device stall
  std::unique_ptr<comm::StreamMarker> marker_;   // made by the first Mark
  std::deque<MicroBatchTimes> unread_times_;
  // A mark at the current point of the compute stream (device::CurrentStreamOf).
  absl::StatusOr<std::unique_ptr<comm::StreamMark>> Mark();
  // Backward(st, ...) between marks of its own, its span then queued with the forward's.
  absl::Status TimedBackward(ForwardState& st, const float* dx_out, double ce_scale,
                             double aux_scale, float* dx_in);
  // Notes the queued micro-batches the stream has passed, oldest first.
  absl::Status ReadMicroBatchTimes();
  void NoteMicroBatchTime(int B, double seconds);
  bool adaptive() const { return policy_ == memory::MemoryPolicy::kAdaptive; }
  AdaptiveOptions adaptive_options_;
  std::function<void(const std::string&)> planner_log_;
  memory::CopyEngine* adaptive_engine_ = nullptr;
  PlannerStats planner_stats_;
  // Where the compute thread is (MakeRoom must not move what the running module reads).
  int cur_micro_ = 0;
  int cur_module_ = 0;  // DeclaredModules index of the running module
  // The arena's bytes in use once the offloads still copying land (Stash::OffloadingBytes).
  int64_t HeldOnceCopiesLand() const;
  // "layers.3.moe", "layers.3.attention", "the embedding", "the head": DeclaredModules index
  // `module` of this stage, for errors.
  std::string ModuleName(int module) const;
  bool evaluating_ = false;
  bool in_backward_ = false;
  std::vector<MoeRows> fwd_rows_;  // this (or the last) forward's MoE layers so far
  int fwd_B_ = 0;
  std::vector<memory::PlanChoice> deferred_;  // for the current MoE layer's expert buffers
  double micro_seconds_ = 0;                  // compute time of one micro-batch (EMA)
  double flops_per_second_ = 1e9;             // measured (EMA)
  double cast_seconds_per_byte_ = 0;
  double copy_committed_seconds_ = 0;  // offload copy time planned in this micro-batch
  // The share of the compute ahead that copies are taken to hide behind, following the late
  // reloads since the last forward (memory::NextHiddenShare; NoteLateReloads, at the start of
  // each forward).
  double hidden_share_ = 1.0;
  int64_t seen_late_reloads_ = 0;
  void NoteLateReloads();
  int max_in_flight_ = 1;  // micro-batches in flight at most (SetInFlightLimit, else seen)

  // The memory model's bookkeeping.
  int64_t predicted_peak_ = 0;
  void NotePrediction(ForwardState& st);

  // ---- Static stash actions ----
  // Where offloads go (SetOffload, SetAdaptive): checks the engine's device, that both or neither
  // are given and that no micro-batch is in flight (`what` names the caller), then tells the stash.
  absl::Status SetCopyTargets(memory::CopyEngine* engine, tensor::HostPool* host, const char* what);
  absl::Status ActAfterMoeForward(const MoeSaved& saved);
  // Held-out evaluation (evaluating_) has no backward: once a module's forward is done, nothing
  // it or an earlier module saved is read again but `keep`, its output (the next module's
  // input), so the rest is freed. An evaluation then holds one module's tensors at a time,
  // within any budget the run trains at; kept to its end, it took policy none's forward peak,
  // above most budgets the adaptive policy trains at. No-op when training.
  absl::Status ReleaseBehindEvaluation(StashHandle keep);
  absl::Status PrefetchForBackward(const ForwardState& state, int layer_index);
  double offload_ratio_ = 0;
  memory::CopyEngine* engine_ = nullptr;
  std::optional<memory::Codec> compress_;
};

}  // namespace furnace::model
