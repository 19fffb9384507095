// GptMoe's adaptive memory policy (gpt_moe.h "The adaptive policy"; the choice itself is
// memory::CoverDeficit, runtime/memory/planner.h).
#include <algorithm>
#include <chrono>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "runtime/base/status.h"
#include "runtime/comm/stream_communicator.h"
#include "runtime/model/attention_block.h"
#include "runtime/model/gpt_moe.h"
#include "runtime/model/head.h"
#include "runtime/model/mlp_block.h"
#include "runtime/model/moe_block.h"

namespace furnace::model {
namespace {

double MiB(double bytes) { return bytes / 1048576.0; }

// Deferred candidates name this layer's expert buffers by these ids (stash ids are >= 0).
constexpr int64_t kDeferredXin = -1, kDeferredPre = -2, kDeferredHidden = -3, kDeferredEo = -4;
// And the tensors later modules will save by ids from kFutureBase down.
constexpr int64_t kFutureBase = -1000;

// Encode + decode seconds per fp32 byte of `codec` on `ops` (the table of `device`), measured on
// 4 MiB of device memory (outside the arena). One untimed round first (a GPU loads the cast
// kernels at their first launch), and the stream synchronised before the clock starts (the upload,
// and whatever else was queued, is not the cast's) and after it stops: timed on 1 MiB from a cold
// start, launch overhead made the cast look 10-1000x dearer than it is, and a GPU plan never
// compressed.
absl::StatusOr<double> MeasureCastSecondsPerByte(const device::Backend& ops, device::Device& device,
                                                 memory::Codec codec) {
  constexpr int64_t n = 1 << 20;
  constexpr int kRounds = 4;
  std::vector<float> in(n);
  for (int64_t i = 0; i < n; ++i) in[i] = static_cast<float>((i % 1000) - 500) * 1e-3f;
  ASSIGN_OR_RETURN(tensor::DeviceMemory dev_in,
                   tensor::DeviceMemory::Allocate(device, 4 * n, "cast measurement"));
  ASSIGN_OR_RETURN(tensor::DeviceMemory dev_out,
                   tensor::DeviceMemory::Allocate(device, 4 * n, "cast measurement"));
  ASSIGN_OR_RETURN(tensor::DeviceMemory enc,
                   tensor::DeviceMemory::Allocate(
                       device, (memory::EncodedBytes(codec, n) + 3) / 4 * 4, "cast measurement"));
  RETURN_IF_ERROR(tensor::CopyToDevice(device, dev_in.data(), in.data(), 4 * n));
  auto round = [&] {
    memory::Encode(ops, codec, dev_in.as<float>(), n, enc.data());
    memory::Decode(ops, codec, enc.data(), n, dev_out.as<float>());
  };
  round();
  RETURN_IF_ERROR(tensor::Synchronize(device));
  const auto t0 = std::chrono::steady_clock::now();
  for (int rep = 0; rep < kRounds; ++rep) round();
  RETURN_IF_ERROR(tensor::Synchronize(device));
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return s / (kRounds * 4.0 * n);
}

}  // namespace

absl::Status GptMoe::SetAdaptive(memory::CopyEngine* engine, tensor::HostPool* host,
                                 AdaptiveOptions options) {
  if (!(options.margin >= 0 && options.margin < 0.5)) {
    return absl::InvalidArgumentError(
        absl::StrCat("adaptive: margin must be in [0, 0.5), got ", options.margin));
  }
  RETURN_IF_ERROR(SetCopyTargets(engine, host, "adaptive"));
  // The ranks of a single stage run every micro-batch's forward in the same order; on a pipeline
  // the stages run different micro-batches at the same time, so they could not agree on one.
  if (!(shard_.first_stage() && shard_.last_stage()) ||
      (options.drop_group != nullptr && options.drop_group->size() == 1)) {
    options.drop_group = nullptr;
  }
  adaptive_options_ = options;
  adaptive_engine_ = engine;
  cast_seconds_per_byte_ = 0.0;
  if (options.codec) {
    ASSIGN_OR_RETURN(cast_seconds_per_byte_,
                     MeasureCastSecondsPerByte(ops_, device_, *options.codec));
  }
  return absl::OkStatus();
}

void GptMoe::NoteMicroBatchTime(int B, double seconds) {
  if (!(seconds > 0)) return;
  // An exponential average: routing and planner actions change it from one micro-batch to the
  // next, the costs should follow without jumping.
  micro_seconds_ = micro_seconds_ == 0 ? seconds : 0.8 * micro_seconds_ + 0.2 * seconds;
  const double stage_share = static_cast<double>(shard_.end_layer(config_) - shard_.first_layer) /
                             std::max(1, config_.layers);
  const double flops = FlopsPerToken() * B * config_.seq_len * stage_share;
  flops_per_second_ = flops / micro_seconds_;
}

void GptMoe::NoteLateReloads() {
  const int64_t late = stash_.action_stats().late_reloads;
  hidden_share_ = memory::NextHiddenShare(hidden_share_, late > seen_late_reloads_);
  seen_late_reloads_ = late;
}

int GptMoe::NumMoeLayersOfStage() const {
  int n = 0;
  for (int l = shard_.first_layer; l < shard_.end_layer(config_); ++l) n += config_.IsMoeLayer(l);
  return n;
}

int GptMoe::NumModules() const {
  return 1 + 2 * (shard_.end_layer(config_) - shard_.first_layer) + (shard_.last_stage() ? 1 : 0);
}

int GptMoe::ModuleIndexOf(int layer, std::string_view tag) const {
  // DeclaredModules' order: the embedding (or the stage input), then per layer its attention and
  // its MoE or MLP block, then the head. Layer -1 holds the embedding's tensors and the head's.
  const int modules = NumModules();
  const auto starts = [tag](std::string_view prefix) {
    return tag.substr(0, prefix.size()) == prefix;
  };
  if (layer < 0) return starts("embedding.") ? 0 : modules - 1;
  if (starts("stage.input")) return 0;
  const int i = layer - shard_.first_layer;
  return starts("ln1.") || starts("attn.") ? 1 + 2 * i : 2 + 2 * i;
}

std::vector<int64_t>& GptMoe::MovedOf(int micro, int modules) {
  std::vector<int64_t>& v = moved_[micro];
  if (static_cast<int>(v.size()) < modules) v.resize(modules, 0);
  return v;
}

std::vector<int64_t>& GptMoe::PlannedOf(int micro, int modules) {
  std::vector<int64_t>& v = planned_[micro];
  if (static_cast<int>(v.size()) < modules) v.resize(modules, 0);
  return v;
}

memory::SaveAction GptMoe::FutureDrop(const StashEntryInfo& e) const {
  // A tensor whose rebuild needs the other ranks only by their agreement (AgreeCollectiveDrops
  // is what puts its tag in future_drops_).
  if (e.recompute.collective != RecomputeCollective::kNone &&
      adaptive_options_.drop_group == nullptr) {
    return memory::SaveAction::kKeep;
  }
  auto it = future_drops_.find(e.micro);
  if (it == future_drops_.end()) return memory::SaveAction::kKeep;
  return it->second.count({e.layer, std::string(memory::TensorTag(e.producer))}) != 0
             ? memory::SaveAction::kDropAfterForward
             : memory::SaveAction::kKeep;
}

absl::StatusOr<std::vector<bool>> GptMoe::AgreeCollectiveDrops(
    const std::vector<bool>& wish, const std::vector<bool>& cannot) const {
  comm::Communicator* group = adaptive_options_.drop_group;
  const size_t n = wish.size(), words = (n + 63) / 64;
  // This rank's wishes, then what it cannot drop, as bits.
  std::vector<uint64_t> mine(2 * words, 0);
  for (size_t i = 0; i < n; ++i) {
    if (wish[i]) mine[i / 64] |= uint64_t{1} << (i % 64);
    if (cannot[i]) mine[words + i / 64] |= uint64_t{1} << (i % 64);
  }
  std::vector<uint64_t> all(mine.size() * static_cast<size_t>(group->size()));
  if (absl::Status s = group->AllGather(mine.data(), all.data(),
                                        static_cast<int64_t>(mine.size() * sizeof(uint64_t)));
      !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("adaptive: agreeing on collective drops over ",
                                               group->name(), ": ", s.message()));
  }
  std::vector<uint64_t> any(2 * words, 0);
  for (size_t r = 0; r < static_cast<size_t>(group->size()); ++r) {
    for (size_t w = 0; w < 2 * words; ++w) any[w] |= all[r * 2 * words + w];
  }
  std::vector<bool> agreed(n, false);
  for (size_t i = 0; i < n; ++i) {
    const uint64_t bit = uint64_t{1} << (i % 64);
    agreed[i] = (any[i / 64] & bit) != 0 && (any[words + i / 64] & bit) == 0;
  }
  return agreed;
}

double GptMoe::ExchangeSecondsPerByte() const {
  double seconds = 0, bytes = 0;
  // On a stream communicator (NCCL on CUDA, the emulated device's) a call's host time is only its
  // enqueueing: the time of the exchange is its stream time, the collectives of the expert groups
  // (their count exchanges included) as the watchdog saw them complete.
  bool streamed = false;
  for (comm::Communicator* group : {groups_.ep, groups_.esp}) {
    const auto* stream = dynamic_cast<const comm::StreamCommunicator*>(group);
    if (stream == nullptr) continue;
    streamed = true;
    for (int op = 0; op < comm::kNumCollectiveOps; ++op) {
      seconds += stream->stream_counters().seconds(static_cast<comm::CollectiveOp>(op));
      bytes +=
          static_cast<double>(stream->stream_counters().bytes(static_cast<comm::CollectiveOp>(op)));
    }
  }
  if (streamed) return bytes > 0 ? seconds / bytes : 0;
  for (const auto& [op, e] : moe_counters_.Snapshot()) {
    if (op == "counts") continue;  // the count exchange: a few bytes, mostly latency
    seconds += e.seconds;
    bytes += static_cast<double>(e.bytes);
  }
  return bytes > 0 ? seconds / bytes : 0;
}

bool GptMoe::Protected(const StashEntrySummary& e) const {
  if (e.pinned) return true;
  if (e.micro != cur_micro_) return false;
  return ReadByModule(ModuleIndexOf(e.layer, memory::TensorTag(e.producer)),
                      memory::TensorTag(e.producer), cur_module_);
}

bool GptMoe::ReadByModule(int j, std::string_view tag, int module) {
  // Its own tensors, and its input: the output of the module before it (the residual stream,
  // which its forward adds to and its backward's rebuilds and layer norm read). The rest of the
  // module before it is read only by that module's own backward. The later modules' are being
  // made (forward) or released (backward).
  if (j >= module) return true;
  return j == module - 1 && IsModuleOutput(tag);
}

bool GptMoe::IsModuleOutput(std::string_view tag) {
  return tag == "embedding.out" || tag == "stage.input" ||
         (tag.size() > 9 && tag.substr(tag.size() - 9) == ".residual");
}

int GptMoe::FirstBackwardReader(int j, std::string_view tag, int modules) {
  return IsModuleOutput(tag) && j + 1 < modules ? j + 1 : j;
}

absl::Status GptMoe::BeforeExpertBuffers(int layer, const MoeRows& rows) {
  const auto t0 = std::chrono::steady_clock::now();
  // The agreement's all-gather waits for every rank: its time is counted apart from the
  // planner's own (PlannerStats::agreement_seconds).
  double agreement_s = 0;
  const auto done = [this, t0, &agreement_s] {
    planner_stats_.seconds +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() - agreement_s;
    planner_stats_.agreement_seconds += agreement_s;
  };
  const auto timed_agreement = [this, &agreement_s](const std::vector<bool>& wish,
                                                    const std::vector<bool>& cannot) {
    const auto a0 = std::chrono::steady_clock::now();
    ++planner_stats_.agreements;
    absl::StatusOr<std::vector<bool>> agreed = AgreeCollectiveDrops(wish, cannot);
    agreement_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - a0).count();
    return agreed;
  };
  const int B = fwd_B_;
  const int64_t budget = static_cast<int64_t>(arena_.budget());
  const int64_t usable =
      static_cast<int64_t>(static_cast<double>(budget) * (1.0 - adaptive_options_.margin));
  // What the arena holds once the offloads still copying land: their bytes are already counted as
  // moved (MovedOf) and come back at their backward; counting them in `used` too would project
  // them twice until their copies land, and plan (or emergency-offload) more than the deficit.
  const int64_t used = HeldOnceCopiesLand();

  // The memory model for the rest of this micro-batch: the layers done with their rows, this one
  // with its own.
  // Later MoE layers are not routed yet. Their S is known (what this rank routes does not depend
  // on the routing when dropless, and is at most N k otherwise), their R (what this rank's experts
  // receive) is not: the projection counts it as 0, so that a plan is made only for a deficit that
  // is certain and a micro-batch that fits is never touched. Each later MoE layer projects again
  // with its own rows (the last one knows them all), with every tensor saved before it still a
  // candidate, and the emergency offload is the net below.
  std::vector<MoeRows> all = fwd_rows_;
  all.push_back(rows);
  // With a capacity factor S itself depends on the routing: its lower bound is 0 too.
  const int64_t later_s = config_.capacity_factor > 0 ? 0 : rows.S;
  for (size_t i = all.size(); i < static_cast<size_t>(NumMoeLayersOfStage()); ++i) {
    all.push_back({later_s, rows.distributed ? 0 : later_s, 0, rows.distributed});
  }
  const std::vector<ModuleBytes> modules = DeclaredModules(B, all);
  const int M = static_cast<int>(modules.size());
  const Dims dims{B,
                  config_.seq_len,
                  config_.d_model,
                  config_.heads,
                  shard_.tp,
                  config_.recompute_attention_probs};
  const MoeShape moe = MoeShapeOf(config_, shard_);
  const MoeExpertPoint point = MoeExpertPointBytes(dims, moe, rows);
  const int h = ModuleIndexOf(layer, "moe.");  // this layer's MoE module
  std::vector<int64_t> live_before(M + 1, 0);
  for (int j = 0; j < M; ++j) live_before[j + 1] = live_before[j] + modules[j].saved;
  const int64_t level = live_before[h] + point.level;  // declared bytes at this point
  // Actual = declared + (used - level), plus what the planner moved out of this micro-batch's
  // modules at or after the point (those come back before it, or were never out).
  std::vector<int64_t>& moved = MovedOf(cur_micro_, M);
  // Drops planned for tensors later modules save: those of modules whose forward is done have
  // happened (they are out of `used`: moved); the others (this MoE module's own included, dropped
  // when its forward ends) will be out after their module, until its backward.
  std::vector<int64_t>& planned = PlannedOf(cur_micro_, M);
  for (int j = 0; j < h; ++j) {
    moved[j] += planned[j];
    planned[j] = 0;
  }
  std::vector<int64_t> moved_from(M + 1, 0);  // moved_from[j]: moved out of modules >= j
  for (int j = M - 1; j >= 0; --j) moved_from[j] = moved_from[j + 1] + moved[j];
  std::vector<int64_t> planned_before(M + 1, 0);  // planned_before[j]: planned for modules < j
  for (int j = 0; j < M; ++j) planned_before[j + 1] = planned_before[j] + planned[j];
  const int64_t offset = used - level;
  // The micro-batches this 1F1B stage starts before this one's backward frees anything.
  const int not_started = std::max(0, max_in_flight_ - static_cast<int>(in_flight_.size()) - 1);
  const int64_t reservation = not_started * live_before[M];
  const int64_t dres = F32Bytes(int64_t{B} * config_.seq_len * config_.d_model);
  std::vector<memory::Deficit> deficits;
  int64_t projected = used + point.rest_peak;
  auto add = [&](int j, int64_t actual) {
    projected = std::max(projected, actual);
    if (actual > usable) deficits.push_back({j, actual - usable});
  };
  // Point times: module j's forward at j, the 1F1B gap (another micro-batch's backward) at M, and
  // module j's backward at 2M - j.
  const auto back = [M](int j) { return 2 * M - j; };
  add(h, used + point.rest_peak);
  for (int j = h + 1; j < M; ++j) {
    add(j, live_before[j] + modules[j].forward_peak + offset - planned_before[j]);
  }
  for (int j = M - 1; j >= 0; --j) {
    add(back(j), live_before[j + 1] + dres + modules[j].backward_peak + offset + moved_from[j] -
                     planned_before[j] + reservation);
  }
  // 1F1B: once this forward is done, the stage may run the backward of an older micro-batch
  // before this one's: its rise above its own saved bytes comes on top of everything in flight.
  const int64_t rise = InFlightBackwardRise();
  if (rise > 0) add(M, used + (live_before[M] - level) - planned_before[M] + rise);
  deferred_.clear();
  // Collective drops (gpt_moe.h): at the stage's last MoE layer of a micro-batch, on a step that
  // agrees, every rank of the drop group takes part, a rank that fits too (wishing nothing).
  // There the projection is exact (every layer is routed) and every earlier layer's buffers are
  // still candidates, so one agreement per micro-batch covers what one per layer would, but for a
  // deficit before that layer (planned per rank). Slots 2i and 2i + 1: the expert input and the
  // combined output of the i-th MoE layer of this forward that exchanges (agreeable_); this
  // layer's are the last two when it exchanges (under moe.schedule auto some layers may not).
  const int k = static_cast<int>(agreeable_.size()) / 2;  // the earlier layers that exchange
  int last_moe_layer = -1;
  for (int l = shard_.first_layer; l < shard_.end_layer(config_); ++l) {
    if (config_.IsMoeLayer(l)) last_moe_layer = l;
  }
  const int every_slot = 2 * k + (rows.distributed ? 2 : 0);
  const bool agree = adaptive_options_.drop_group != nullptr && agree_this_step_ &&
                     layer == last_moe_layer && every_slot > 0;
  const int slots = agree ? every_slot : 0;
  const int64_t xin_bytes = F32Bytes(rows.R * config_.d_model);
  const int64_t eo_bytes = F32Bytes(rows.S * config_.d_model);
  // The earlier layers' buffers this rank cannot drop (offloaded, compressed, dropped already, or
  // rebuilt from a compressed input): no rank drops those.
  std::vector<bool> cannot(slots, false);
  for (int i = 0; i < 2 * k && agree; ++i) {
    cannot[i] = !stash_.CanDropAgreed(agreeable_[i].handle);
  }
  auto slot_name = [&](int i) {
    const char* what = i % 2 == 0 ? "expert input" : "combined output";
    return absl::StrCat("layer ", i < 2 * k ? agreeable_[i].layer : layer, "'s ", what);
  };
  auto agreed_list = [&](const std::vector<bool>& agreed) {
    std::vector<std::string> names;
    for (int i = 0; i < slots; ++i) {
      if (agreed[i]) names.push_back(slot_name(i));
    }
    return absl::StrJoin(names, ", ");
  };
  // Carries the agreed drops out: this layer's buffers through the save policy as they are saved
  // (FutureDrop; out of the arena once its forward is done), the earlier layers' now.
  auto take_agreed = [&](const std::vector<bool>& agreed) -> absl::Status {
    for (int i = 0; i < slots; ++i) {
      if (!agreed[i]) continue;
      ++planner_stats_.agreed_drops;
      if (i >= 2 * k) {
        future_drops_[cur_micro_].insert(
            {layer, i % 2 == 0 ? "moe.expert_input" : "moe.combined_output"});
        planned[h] += i % 2 == 0 ? xin_bytes : eo_bytes;
        continue;
      }
      const Agreeable& a = agreeable_[i];
      if (absl::Status s = stash_.DropAgreed(a.handle); !s.ok()) {
        // Every rank checked it could (CanDropAgreed) before agreeing: its peers have dropped it.
        return absl::InternalError(absl::StrCat("adaptive: the ranks agreed to drop ", slot_name(i),
                                                " but this rank could not: ", s.message()));
      }
      moved[FirstBackwardReader(ModuleIndexOf(a.layer, a.tag), a.tag, M)] += a.bytes;
    }
    return absl::OkStatus();
  };
  if (deficits.empty()) {
    if (agree) {
      ASSIGN_OR_RETURN(const std::vector<bool> agreed,
                       timed_agreement(std::vector<bool>(slots, false), cannot));
      RETURN_IF_ERROR(take_agreed(agreed));
      if (planner_log_ && std::find(agreed.begin(), agreed.end(), true) != agreed.end()) {
        planner_log_(absl::StrFormat(
            "adaptive: step %d micro-batch %d layer %d rows S=%d R=%d: fits (projected peak %.3f "
            "MiB, usable %.3f MiB); drops %s as the ranks agreed",
            step_, cur_micro_, layer, rows.S, rows.R, MiB(projected), MiB(usable),
            agreed_list(agreed)));
      }
    }
    done();
    return absl::OkStatus();  // it fits: the common path, nothing else to do
  }
  ran_short_ = true;

  // Candidates: what earlier layers and micro-batches hold (acted on now), this layer's expert
  // buffers (acted on after its forward).
  const bool offload = adaptive_engine_ != nullptr;
  const std::optional<memory::Codec> codec = adaptive_options_.codec;
  std::vector<memory::PlanCandidate> candidates;
  // Stash id -> (micro-batch, the module whose backward first reads it), to record what the plan
  // moves (MovedOf).
  std::map<int64_t, std::pair<int, int>> position_of;
  // Before any exchange is timed (the first micro-batch), re-running the all-to-all is priced at
  // 1 GB/s: a guess that errs dear against any interconnect a GPU has.
  const double measured_per_byte = ExchangeSecondsPerByte();
  const double exchange_per_byte = measured_per_byte > 0 ? measured_per_byte : 1e-9;
  std::map<int64_t, int> slot_of_id;  // stash id or deferred id -> its slot
  for (int i = 0; i < 2 * k && agree; ++i) slot_of_id[agreeable_[i].handle.id] = i;
  for (const StashEntrySummary& e : stash_.Summaries()) {
    // Kept tensors, and encodings (stored compressed by an earlier plan: they can still go to
    // the host, and nothing else).
    const bool encoded = e.state == StashState::kCompressed;
    if ((e.state != StashState::kKept && !(encoded && offload)) || e.pinned) continue;
    const std::string_view tag = memory::TensorTag(e.producer);
    const int module = ModuleIndexOf(e.layer, tag);
    if (e.micro == cur_micro_ && ReadByModule(module, tag, h)) continue;
    memory::PlanCandidate c;
    c.id = e.handle.id;
    // This micro-batch's: from the module that saved it to that module's backward. Another's
    // (1F1B): until the gap, when that micro-batch's backward brings it back.
    c.position = e.micro == cur_micro_ ? module : -1;
    c.until = e.micro == cur_micro_ ? back(FirstBackwardReader(module, tag, M)) : M;
    c.bytes = e.held_bytes;
    c.can_offload = offload;
    if (encoded) {
      candidates.push_back(c);
      position_of[c.id] = {e.micro, FirstBackwardReader(module, tag, M)};
      continue;
    }
    // A rebuild reads exact inputs: none stored in reduced precision (the stash refuses the drop),
    // and nothing a dropped tensor's rebuild reads may be compressed (it refuses that too).
    c.can_recompute = e.rebuildable && !e.lossy_input;
    c.recompute_seconds = e.rebuild_flops / flops_per_second_;
    if (auto slot = slot_of_id.find(e.handle.id); slot != slot_of_id.end()) {
      // Rebuilt through the all-to-all: by agreement only, at the price of the exchange too.
      c.can_recompute = e.collective_rebuild && !e.lossy_input && !cannot[slot->second];
      c.recompute_seconds += static_cast<double>(e.bytes) * exchange_per_byte;
    }
    c.rebuild_inputs = e.rebuild_inputs;
    c.can_compress = codec && !e.dropped_reader && memory::IsCompressible(e.producer, *codec);
    if (c.can_compress) {
      c.compressed_fraction =
          static_cast<double>(memory::EncodedBytes(*codec, static_cast<int64_t>(e.bytes / 4))) /
          e.bytes;
    }
    candidates.push_back(c);
    position_of[c.id] = {e.micro, FirstBackwardReader(module, tag, M)};
  }
  const std::string p = absl::StrCat("layers.", layer, ".");
  const int64_t C = config_.d_model, fl = moe.fl();
  const std::set<std::pair<int, std::string>>& dropping = future_drops_[cur_micro_];
  // input: the deferred buffer its rebuild reads (0: none of them); reader: the tag of this
  // layer's buffer whose rebuild reads it (a drop already planned for it rules out compressing).
  // exchange: the bytes its rebuild sends through the all-to-all again (0: a local rebuild); such
  // a drop is only by agreement.
  auto deferred = [&](int64_t id, std::string_view tag, int64_t floats, double rebuild_flops,
                      int64_t input, std::string_view reader, int64_t exchange = 0) {
    if (dropping.count({layer, std::string(tag)}) != 0) return;  // planned already
    memory::PlanCandidate c;
    c.id = id;
    c.position = h;
    c.until = back(h);
    c.bytes = F32Bytes(floats);
    c.deferred = true;
    c.can_offload = offload;
    c.can_recompute = exchange > 0 ? agree : rebuild_flops > 0;
    c.recompute_seconds =
        rebuild_flops / flops_per_second_ + static_cast<double>(exchange) * exchange_per_byte;
    if (input != 0) c.rebuild_inputs = {input};
    c.can_compress = codec && dropping.count({layer, std::string(reader)}) == 0 &&
                     memory::IsCompressible(p + std::string(tag), *codec);
    if (c.can_compress) {
      c.compressed_fraction =
          static_cast<double>(memory::EncodedBytes(*codec, floats)) / F32Bytes(floats);
    }
    candidates.push_back(c);
  };
  // The expert input and the combined output rebuild through the all-to-all on a distributed
  // layout: dropped only by agreement (`agree`). Single rank, the combined output's rebuild is
  // local and the expert input's a permutation (not counted: kept).
  deferred(kDeferredXin, "moe.expert_input", rows.R * C, 0, 0, "moe.expert_pre",
           rows.distributed ? xin_bytes : 0);
  deferred(kDeferredPre, "moe.expert_pre", rows.R * fl, 2.0 * rows.R * C * fl, kDeferredXin,
           "moe.expert_hidden");
  deferred(kDeferredHidden, "moe.expert_hidden", rows.R * fl, 10.0 * rows.R * fl, kDeferredPre,
           "moe.combined_output");
  deferred(kDeferredEo, "moe.combined_output", rows.S * C, 2.0 * rows.R * C * fl, kDeferredHidden,
           "", rows.distributed ? eo_bytes : 0);
  if (agree && rows.distributed) {
    slot_of_id[kDeferredXin] = 2 * k;
    slot_of_id[kDeferredEo] = 2 * k + 1;
  }

  // Tensors later modules of this micro-batch will save: a per-rank rebuild exists for these tags
  // (local kernels on the module's own inputs), so the plan may have them dropped as they are
  // saved (FutureDrop). Their rebuild FLOPs per element.
  struct FutureTag {
    std::string_view tag;
    double flops_per_float;
  };
  // Per float of a GEMM's output from the norm (qkv, mlp.pre) or of expert_pre (R x fl).
  const double gemm = 2.0 * config_.d_model;
  // Per probability: its q . k product, and the softmax's passes (as the norms and GELU count).
  const double scores = 2.0 * config_.d_model / config_.heads + 8;
  std::vector<FutureTag> future_tags = {
      {"attn.probs", scores},  {"attn.qkv", gemm}, {"mlp.pre", gemm},  {"ln1.out", 8},
      {"ln2.out", 8},          {"lnf.out", 8},     {"mlp.hidden", 10}, {"moe.expert_hidden", 10},
      {"moe.expert_pre", gemm}};
  // Under recomputed probabilities the attention's output rebuilds by the forward again: per
  // float of y, its row's scores and weighted sum over the T keys (4T FLOPs).
  if (config_.recompute_attention_probs) future_tags.push_back({"attn.y", 4.0 * config_.seq_len});
  struct Future {
    int layer;
    std::string_view tag;
    int position;
  };
  std::vector<Future> future;  // by candidate
  {
    const int F = shard_.local_dense_ffn(config_);
    const int last = shard_.end_layer(config_);
    size_t moe_index = 0;
    for (int l = shard_.first_layer; l <= last; ++l) {
      const bool head = l == last;
      if (head && !shard_.last_stage()) break;
      std::vector<SavedTensorBytes> saved;
      int position = 0;
      if (head) {
        saved = HeadSavedTensors(dims, config_.vocab);
        position = M - 1;
      } else {
        const bool is_moe = config_.IsMoeLayer(l);
        const MoeRows& r = is_moe ? all[std::min(moe_index, all.size() - 1)] : rows;
        if (is_moe) ++moe_index;
        if (l <= layer) continue;  // saved already, or this layer (its buffers are deferred)
        saved = AttentionSavedTensors(dims);
        for (const SavedTensorBytes& t :
             is_moe ? MoeSavedTensors(dims, moe, r) : MlpSavedTensors(dims, F)) {
          saved.push_back(t);
        }
        position = -1;  // per tensor below
      }
      for (const SavedTensorBytes& t : saved) {
        for (const FutureTag& f : future_tags) {
          if (t.tag != f.tag || t.bytes == 0) continue;
          if (dropping.count({head ? -1 : l, std::string(f.tag)}) != 0) continue;  // planned
          memory::PlanCandidate c;
          c.id = kFutureBase - static_cast<int64_t>(future.size());
          c.position = position >= 0 ? position : ModuleIndexOf(l, t.tag);
          c.until = back(c.position);
          c.bytes = static_cast<uint64_t>(t.bytes);
          c.deferred = true;
          c.can_recompute = true;
          c.recompute_seconds = f.flops_per_float * (t.bytes / 4.0) / flops_per_second_;
          candidates.push_back(c);
          future.push_back({head ? -1 : l, f.tag, c.position});
        }
      }
    }
  }

  memory::PlannerCosts costs;
  const double gbps = offload ? adaptive_engine_->host_link_gbps() : 0;
  costs.link_bytes_per_second = gbps > 0 ? gbps * 1e9 : 10e9;  // unpaced: a memcpy
  costs.hidden_seconds =
      hidden_share_ * std::max(0.0, 0.5 * micro_seconds_ - copy_committed_seconds_);
  costs.cast_seconds_per_byte = cast_seconds_per_byte_;
  memory::Plan plan = memory::CoverDeficits(candidates, deficits, costs);
  std::vector<bool> agreed_now(slots, false);
  if (agree) {
    std::vector<bool> wish(slots, false);
    for (const memory::PlanChoice& c : plan.choices) {
      auto slot = slot_of_id.find(c.id);
      if (c.action == memory::PlanAction::kRecompute && slot != slot_of_id.end()) {
        wish[slot->second] = true;
      }
    }
    ASSIGN_OR_RETURN(agreed_now, timed_agreement(wish, cannot));
    if (agreed_now != wish) {
      ++planner_stats_.replans;
      // Plan again: the agreed drops free their bytes over their intervals whatever this rank
      // does (their rebuilds then read exact inputs: none of those may be compressed); the slots
      // not agreed stay (kept, offloaded or compressed).
      std::vector<memory::Deficit> left = deficits;
      std::set<int64_t> exact;  // the agreed drops' rebuild inputs
      std::vector<memory::PlanCandidate> again;
      for (memory::PlanCandidate& c : candidates) {
        auto slot = slot_of_id.find(c.id);
        if (slot != slot_of_id.end() && agreed_now[slot->second]) {
          for (memory::Deficit& d : left) {
            if (d.position > c.position && d.position < c.until) {
              d.bytes -= static_cast<int64_t>(c.bytes);
            }
          }
          exact.insert(c.rebuild_inputs.begin(), c.rebuild_inputs.end());
          continue;
        }
        if (slot != slot_of_id.end()) c.can_recompute = false;
        again.push_back(std::move(c));
      }
      for (memory::PlanCandidate& c : again) {
        if (exact.count(c.id) != 0) c.can_compress = false;
      }
      std::erase_if(left, [](const memory::Deficit& d) { return d.bytes <= 0; });
      plan = memory::CoverDeficits(again, left, costs);  // covered (no choice) if none is left
    }
    // The agreed buffers leave by the agreement, not as this plan's actions.
    std::erase_if(plan.choices, [&slot_of_id](const memory::PlanChoice& c) {
      return c.action == memory::PlanAction::kRecompute && slot_of_id.count(c.id) != 0;
    });
    RETURN_IF_ERROR(take_agreed(agreed_now));
  }

  deferred_.clear();
  for (const memory::PlanChoice& c : plan.choices) {
    if (c.action == memory::PlanAction::kOffload) {
      copy_committed_seconds_ += 2.0 * c.freed / costs.link_bytes_per_second;
    }
    if (c.id <= kFutureBase) {  // dropped by the save policy when its module saves it
      const Future& f = future[static_cast<size_t>(kFutureBase - c.id)];
      future_drops_[cur_micro_].insert({f.layer, std::string(f.tag)});
      planned[f.position] += static_cast<int64_t>(c.freed);
      continue;
    }
    if (c.deferred) {  // recorded in `moved` when ApplyDeferred has done it
      deferred_.push_back(c);
      continue;
    }
    absl::Status s;
    switch (c.action) {
      case memory::PlanAction::kOffload:
        s = stash_.Offload(StashHandle{c.id});
        break;
      case memory::PlanAction::kCompress:
        s = stash_.Compress(StashHandle{c.id}, *codec);
        break;
      case memory::PlanAction::kRecompute:
        s = stash_.Drop(StashHandle{c.id});
        break;
    }
    // A failed action (a compress whose encoding the arena refuses, an entry that changed state)
    // is skipped: the projection of the next layer and the emergency path cover what it leaves.
    if (!s.ok()) {
      ++planner_stats_.refused_actions;
      continue;
    }
    const auto [micro, module] = position_of[c.id];
    std::vector<int64_t>& out = MovedOf(micro, M);
    if (module >= 0 && module < M) out[module] += static_cast<int64_t>(c.freed);
  }
  ++planner_stats_.decisions;
  done();
  if (planner_log_) {
    planner_log_(absl::StrFormat(
        "adaptive: step %d micro-batch %d layer %d rows S=%d R=%d: projected peak %.3f MiB, usable "
        "%.3f "
        "MiB (budget %.3f), %d points short -> %s (est. %.3f ms)%s%s",
        step_, cur_micro_, layer, rows.S, rows.R, MiB(projected), MiB(usable), MiB(budget),
        static_cast<int>(deficits.size()), memory::PlanSummary(plan), plan.cost_seconds * 1e3,
        std::find(agreed_now.begin(), agreed_now.end(), true) != agreed_now.end()
            ? absl::StrCat("; drops ", agreed_list(agreed_now), " as the ranks agreed")
            : "",
        plan.covered ? "" : " (not covered: emergency offload may run)"));
  }
  return absl::OkStatus();
}

absl::Status GptMoe::ApplyDeferred(const MoeSaved& saved) {
  if (deferred_.empty()) return absl::OkStatus();
  const std::vector<memory::PlanChoice> choices = std::move(deferred_);
  deferred_.clear();
  for (const memory::PlanChoice& c : choices) {
    const StashHandle h = c.id == kDeferredXin      ? saved.xin
                          : c.id == kDeferredPre    ? saved.pre
                          : c.id == kDeferredHidden ? saved.hidden
                                                    : saved.eo;
    absl::Status s;
    switch (c.action) {
      case memory::PlanAction::kOffload:
        s = stash_.Offload(h);
        break;
      case memory::PlanAction::kCompress:
        s = stash_.Compress(h, *adaptive_options_.codec);
        break;
      case memory::PlanAction::kRecompute:
        s = stash_.Drop(h);
        break;
    }
    if (!s.ok()) {  // skipped: see BeforeExpertBuffers
      ++planner_stats_.refused_actions;
      continue;
    }
    std::vector<int64_t>& moved = MovedOf(cur_micro_, NumModules());
    moved[cur_module_] += static_cast<int64_t>(c.freed);
  }
  return absl::OkStatus();
}

int64_t GptMoe::HeldOnceCopiesLand() const {
  // The arena first: an offload that lands between the two reads then leaves `landing` smaller
  // (counted as still held: conservative), never subtracted twice.
  const auto used = static_cast<int64_t>(arena_.current_bytes());
  const auto landing = static_cast<int64_t>(stash_.OffloadingBytes());
  return std::max<int64_t>(0, used - landing);
}

bool GptMoe::MakeRoom(uint64_t bytes) {
  // The emergency: the largest tensors nothing running reads leave the arena at once, dropped
  // where a per-rank rebuild exists (instant; rebuilt in their backward), else offloaded (waited
  // for: on a slow host link that is the expensive part, hence last). Encodings (entries stored
  // compressed) are offloaded too: otherwise a plan that compressed would pin their bytes to the
  // device for good, and an emergency after it could find nothing to move.
  std::vector<StashEntrySummary> entries = stash_.Summaries();
  std::stable_sort(entries.begin(), entries.end(),
                   [](const StashEntrySummary& a, const StashEntrySummary& b) {
                     return a.held_bytes > b.held_bytes;
                   });
  const uint64_t budget = arena_.budget();
  const uint64_t used = arena_.current_bytes();
  const uint64_t free_now = budget > used ? budget - used : 0;
  // The offloads still copying free their bytes as they land (waited for below): room already
  // on its way, not to be made again. (Allocate's caller has waited for them: 0 there.)
  const uint64_t landing = stash_.OffloadingBytes();
  uint64_t freed = free_now + landing;
  int dropped = 0, offloaded = 0;
  auto note = [this](const StashEntrySummary& e) {
    std::vector<int64_t>& out = MovedOf(e.micro, NumModules());
    const std::string_view tag = memory::TensorTag(e.producer);
    const int j = FirstBackwardReader(ModuleIndexOf(e.layer, tag), tag, NumModules());
    if (j >= 0 && j < static_cast<int>(out.size())) out[j] += static_cast<int64_t>(e.held_bytes);
  };
  for (bool offload : {false, true}) {
    if (offload && adaptive_engine_ == nullptr) break;
    for (const StashEntrySummary& e : entries) {
      if (freed >= bytes) break;
      const bool movable =
          e.state == StashState::kKept || (offload && e.state == StashState::kCompressed);
      if (!movable || Protected(e)) continue;
      if (!offload && !e.rebuildable) continue;
      const absl::Status s = offload ? stash_.Offload(e.handle) : stash_.Drop(e.handle);
      if (!s.ok()) continue;  // moved by the first pass, or pinned meanwhile
      freed += e.held_bytes;
      ++(offload ? offloaded : dropped);
      note(e);
    }
  }
  ran_short_ = true;
  if (dropped + offloaded == 0) return false;
  if (offloaded > 0 || landing > 0) stash_.WaitForCopies();
  ++planner_stats_.emergency_offloads;
  if (planner_log_) {
    planner_log_(absl::StrFormat(
        "adaptive: emergency: the arena refused %.3f MiB (%.3f of %.3f MiB in use); dropped %d and "
        "offloaded %d tensors (%.3f MiB) out of the %s of micro-batch %d module %d",
        MiB(bytes), MiB(used), MiB(budget), dropped, offloaded, MiB(freed - free_now - landing),
        in_backward_ ? "backward" : "forward", cur_micro_, cur_module_));
  }
  return true;
}

absl::Status GptMoe::PrepareAdaptiveBackward(int micro, int module, int ahead_module,
                                             int64_t reserve) {
  if (arena_.budget() == 0) return absl::OkStatus();
  // What the backward about to run must bring back (what the module reads: ReadByModule) or
  // rebuild (a dropped tensor: its Acquire allocates it), and the module below it (look-ahead).
  std::vector<StashHandle> now, ahead;
  // decoded: of `need`, what a compressed entry (or one offloaded from it) decodes to at its
  // Acquire, after Prefetch (which brings back only the encoding).
  uint64_t need = 0, decoded = 0, rebuilt = 0, ahead_bytes = 0;
  for (const StashEntrySummary& e : stash_.Summaries()) {
    if (e.micro != micro || e.state == StashState::kKept) continue;
    const std::string_view tag = memory::TensorTag(e.producer);
    const int j = ModuleIndexOf(e.layer, tag);
    if (ReadByModule(j, tag, module)) {
      if (e.state == StashState::kDropped) {
        rebuilt += e.bytes;
        continue;
      }
      now.push_back(e.handle);
      // An encoding coming back from the host is held beside the tensor it decodes to.
      need += e.bytes + (e.state == StashState::kOffloaded ? e.encoded_bytes : 0);
      if (e.encoded_bytes > 0) decoded += e.bytes;
    } else if (j == ahead_module && e.state == StashState::kOffloaded) {
      ahead.push_back(e.handle);
      ahead_bytes += e.bytes;
    }
  }
  if (now.empty() && rebuilt == 0 && ahead.empty()) return absl::OkStatus();
  const uint64_t budget = arena_.budget();
  const auto usable =
      static_cast<uint64_t>(static_cast<double>(budget) * (1 - adaptive_options_.margin));
  // Room for the tensors it needs and for its own scratch (`reserve`, declared), within the
  // usable share: MakeRoom(b) leaves at least b bytes free. Made here, before the module, in one
  // go: left to the module's own allocations, each rebuild or scratch buffer the arena refused
  // would run the emergency path again, and wait for its copies, mid-module.
  const uint64_t scratch = static_cast<uint64_t>(std::max<int64_t>(0, reserve));
  const uint64_t want = need + rebuilt + scratch;
  // Counted as the arena will be once the offloads still copying land (a reload that needs their
  // bytes sooner waits for them: RetriedAfterCopies), not dropping or offloading more for bytes
  // that are already leaving.
  const auto held = static_cast<uint64_t>(HeldOnceCopiesLand());
  const bool brings_back = !now.empty() || rebuilt > 0;
  if (brings_back && held + want > usable) MakeRoom(want + (budget - usable));
  if (!now.empty()) RETURN_IF_ERROR(stash_.Prefetch(now));
  // The look-ahead only where it leaves this backward its decodes, rebuilds and scratch:
  // otherwise the module's own Acquire brings those tensors back once this one has released its
  // own. (A look-ahead that took the rebuilds' room made the arena refuse them mid-module, and
  // the emergency path sent out again what had just come back: AdaptiveBudgetTest.AtTheFloor*.)
  if (!ahead.empty() &&
      arena_.current_bytes() + ahead_bytes + decoded + rebuilt + scratch <= usable) {
    const absl::Status s = stash_.Prefetch(ahead);
    if (!s.ok() && !absl::IsResourceExhausted(s)) return s;
  }
  return absl::OkStatus();
}

}  // namespace furnace::model
