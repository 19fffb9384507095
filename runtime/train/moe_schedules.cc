#include "runtime/train/moe_schedules.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "runtime/base/status.h"
#include "runtime/checkpoint/durable_file.h"
#include "runtime/comm/device_staging.h"
#include "runtime/comm/stream_communicator.h"
#include "runtime/device/backend.h"
#include "runtime/memory/policy.h"
#include "runtime/moe/calibrate.h"
#include "runtime/tensor/device_memory.h"
#include "runtime/tensor/transfer.h"

namespace furnace::train {
namespace {

// f's enqueued work timed to its completion on `device` (the calling thread's stream).
absl::StatusOr<double> Seconds(device::Device& device, const std::function<absl::Status()>& f) {
  RETURN_IF_ERROR(tensor::Synchronize(device));
  const auto t0 = std::chrono::steady_clock::now();
  RETURN_IF_ERROR(f());
  RETURN_IF_ERROR(tensor::Synchronize(device));
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// One square-ish GEMM of about `flops` through the model's backend, on the model's device.
absl::StatusOr<double> GemmSeconds(const device::Backend& ops, device::Device& device,
                                   int64_t flops) {
  const int n = std::max(8, static_cast<int>(std::cbrt(static_cast<double>(flops) / 2)));
  const uint64_t bytes = uint64_t{4} * n * n;
  ASSIGN_OR_RETURN(tensor::DeviceMemory a, tensor::DeviceMemory::Allocate(device, bytes, "gemm a"));
  ASSIGN_OR_RETURN(tensor::DeviceMemory b, tensor::DeviceMemory::Allocate(device, bytes, "gemm b"));
  ASSIGN_OR_RETURN(tensor::DeviceMemory c, tensor::DeviceMemory::Allocate(device, bytes, "gemm c"));
  RETURN_IF_ERROR(tensor::Fill(device, a.data(), 0, bytes));
  RETURN_IF_ERROR(tensor::Fill(device, b.data(), 0, bytes));
  const auto gemm = [&] {
    ops.matmul_forward(c.as<float>(), a.as<float>(), b.as<float>(), nullptr, n, n, n);
    return absl::OkStatus();
  };
  RETURN_IF_ERROR(Seconds(device, gemm).status());  // warm
  ASSIGN_OR_RETURN(const double t, Seconds(device, gemm));
  return t * static_cast<double>(flops) / (2.0 * n * n * n);
}

// One row copy of `bytes` on the model's device.
absl::StatusOr<double> CopySeconds(device::Device& device, int64_t bytes) {
  const uint64_t n = static_cast<uint64_t>(bytes);
  ASSIGN_OR_RETURN(tensor::DeviceMemory from, tensor::DeviceMemory::Allocate(device, n, "copy"));
  ASSIGN_OR_RETURN(tensor::DeviceMemory to, tensor::DeviceMemory::Allocate(device, n, "copy"));
  RETURN_IF_ERROR(tensor::Fill(device, from.data(), 1, n));
  const auto copy = [&] { return tensor::CopyOnDevice(device, to.data(), from.data(), n); };
  RETURN_IF_ERROR(Seconds(device, copy).status());  // warm
  return Seconds(device, copy);
}

// Rank 0's text to every rank of `world` (a length, then the bytes).
absl::StatusOr<std::string> FromRankZero(comm::Communicator* world, std::string text) {
  if (world == nullptr || world->size() == 1) return text;
  int64_t n = static_cast<int64_t>(text.size());
  RETURN_IF_ERROR(world->Broadcast(&n, sizeof(n), 0));
  text.resize(static_cast<size_t>(n));
  RETURN_IF_ERROR(world->Broadcast(text.data(), n, 0));
  return text;
}

// How a group moves bytes, for the cost profile's cache key: on a communication stream of its own
// (NCCL; the emulated device's transport), staged through host memory (Gloo for a discrete device
// without NCCL), or on the host.
const char* TransportOf(const comm::Communicator* group) {
  if (dynamic_cast<const comm::StreamCommunicator*>(group) != nullptr) return "stream";
  if (dynamic_cast<const comm::StagedCommunicator*>(group) != nullptr) return "staged";
  return "host";
}

// FNV-1a over `bytes`, from `h`: stable across processes and builds (a cache key).
uint64_t Fnv1a(uint64_t h, const void* bytes, size_t n) {
  const auto* p = static_cast<const unsigned char*>(bytes);
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}

// Where this layout's ranks are in its groups: each rank's coordinates (which follow
// parallel.order), in rank order, hashed. Not which ranks share a host: a restart placed on another
// split over nodes (after losing one) keeps the profile, so auto picks the schedules the attempts
// before it ran and the run continues bit for bit (the schedules agree only to about 1e-4, not
// bitwise); delete the cache files (the profile's and the trial's) to price the new placement.
absl::StatusOr<uint64_t> PlacementHash(const RankLayout& layout) {
  constexpr uint64_t kFnvBasis = 0xcbf29ce484222325ull;
  const topology::Coords& c = layout.coords;
  // [pp, dp, tp, edp, ep, esp] per rank.
  constexpr int kFields = 6;
  const uint64_t mine[kFields] = {static_cast<uint64_t>(c.pp), static_cast<uint64_t>(c.dp),
                                  static_cast<uint64_t>(c.tp), static_cast<uint64_t>(c.edp),
                                  static_cast<uint64_t>(c.ep), static_cast<uint64_t>(c.esp)};
  const int world = layout.world == nullptr ? 1 : layout.world->size();
  std::vector<uint64_t> all(mine, mine + kFields);
  if (world > 1) {
    all.resize(static_cast<size_t>(world) * kFields);
    RETURN_IF_ERROR(layout.world->AllGather(mine, all.data(), sizeof(mine)));
  }
  return Fnv1a(kFnvBasis, all.data(), all.size() * sizeof(uint64_t));
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return "";
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// The trial's pick (runtime/moe/trial.h), or the one an earlier attempt of the same layout, shape
// and memory policy measured and cached beside the profile (so a restarted attempt runs the same
// schedules and continues bit for bit). Rank 0 decides whether the cache is used, as for the
// profile.
absl::StatusOr<moe::Choice> MeasuredChoice(moe::Choice predicted, const moe::LayerShape& shape,
                                           model::GptMoe& model, const RankLayout& layout,
                                           int micro_batch, const std::string& cache_dir,
                                           const std::string& profile_key,
                                           const moe::TrialOptions& trial, MoeScheduleChoice& out) {
  if (!cache_dir.empty()) {
    const std::string key =
        absl::StrCat(profile_key, "_N", shape.N, "_C", shape.C, "_f", shape.f, "_E", shape.E, "_k",
                     shape.k, "_cap", absl::StrFormat("%g", shape.capacity_factor), "_",
                     memory::MemoryPolicyName(model.memory_policy()));
    out.trial_cache_path =
        (std::filesystem::path(cache_dir) / ("moe_trial." + key + ".json")).string();
  }
  std::string cached =
      layout.rank == 0 && !out.trial_cache_path.empty() ? ReadFile(out.trial_cache_path) : "";
  ASSIGN_OR_RETURN(cached, FromRankZero(layout.world.get(), std::move(cached)));
  if (!cached.empty()) {
    // Every rank parses the same text: all use it, or all measure.
    absl::StatusOr<moe::Choice> c = moe::TrialFromJson(predicted, cached);
    if (c.ok()) {
      out.trial_from_cache = true;
      return c;
    }
  }
  // The layer's input by data-parallel replica (tp peers hold the same tokens), unit scale like
  // the residual stream after a layer norm, and an output gradient as small as a loss's: drawn
  // once, every run of the trial reuses them.
  const model::ModelConfig& config = model.config();
  const int64_t NC = int64_t{micro_batch} * config.seq_len * config.d_model;
  std::vector<float> x(static_cast<size_t>(NC)), dout(static_cast<size_t>(NC));
  std::mt19937 rng(static_cast<uint32_t>(7919 + layout.shard.dp_rank));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (float& v : x) v = normal(rng);
  const float scale = 1.0f / std::sqrt(static_cast<float>(NC));
  for (float& v : dout) v = normal(rng) * scale;
  ASSIGN_OR_RETURN(moe::Choice measured, moe::MeasureSchedules(
                                             predicted, shape, layout.world.get(),
                                             [&](moe::Schedule s) {
                                               return model.TimeMoeLayer(s, micro_batch, x.data(),
                                                                         dout.data());
                                             },
                                             trial));
  if (layout.rank == 0 && !out.trial_cache_path.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(cache_dir, ec);
    if (absl::Status written = WriteFileDurably(out.trial_cache_path, moe::TrialToJson(measured));
        !written.ok()) {
      absl::StrAppend(&out.cache_error, out.cache_error.empty() ? "" : "; ", written.message());
    }
  }
  return measured;
}

}  // namespace

std::vector<int64_t> CalibrationSizesFor(const moe::LayerShape& shape) {
  constexpr int64_t kMaxBytes = int64_t{64} << 20;
  std::vector<int64_t> sizes = moe::CalibrationOptions().sizes_bytes;
  int64_t largest = 0;
  for (moe::Schedule s : moe::kAllSchedules) {
    const bool sliced = moe::SlicedExperts(s, shape.esp_is_tp, shape.esp);
    for (const moe::Direction dir : {moe::Direction::kForward, moe::Direction::kBackward}) {
      for (const moe::Op& op : dir == moe::Direction::kForward ? moe::ForwardOps(s, sliced)
                                                               : moe::BackwardOps(s, sliced)) {
        const moe::GroupBytes b = moe::OpBytes(op, dir, shape, s);
        largest = std::max({largest, b.tp, b.ep, b.esp});
      }
    }
  }
  largest = std::min(largest, kMaxBytes);
  if (largest > sizes.back()) sizes.push_back(largest);
  return sizes;
}

std::vector<int64_t> CalibrationGemmFlopsFor(const moe::LayerShape& shape) {
  constexpr int64_t kMaxFlops = int64_t{1} << 34;
  std::vector<int64_t> flops = moe::CalibrationOptions().gemm_flops;
  double largest = 0;
  for (moe::Schedule s : moe::kAllSchedules) {
    // The expert op's GEMM (cost_model.cc, OpSeconds kExpert).
    const moe::ScheduleRows rows = moe::RowsOf(shape, s);
    largest =
        std::max(largest, 2.0 * static_cast<double>(rows.R) * shape.C *
                              (static_cast<double>(shape.f) / std::max<int64_t>(shape.esp, 1)));
  }
  const auto top = static_cast<int64_t>(std::min(largest, static_cast<double>(kMaxFlops)));
  if (top > flops.back()) flops.push_back(top);
  return flops;
}

moe::LayerShape LayerShapeOf(const model::ModelConfig& c, const RankLayout& layout,
                             int micro_batch) {
  moe::LayerShape s;
  s.N = int64_t{micro_batch} * c.seq_len;
  s.C = c.d_model;
  s.f = c.expert_ffn;
  s.E = c.experts;
  s.k = c.top_k;
  s.capacity_factor = c.capacity_factor;
  s.tp = layout.tp == nullptr ? 1 : layout.tp->size();
  s.ep = layout.ep == nullptr ? 1 : layout.ep->size();
  s.esp = layout.esp == nullptr ? 1 : layout.esp->size();
  s.esp_is_tp = layout.esp_is_tp;
  return s;
}

absl::StatusOr<MoeScheduleChoice> ChooseMoeSchedules(const std::string& requested,
                                                     model::GptMoe& model, const RankLayout& layout,
                                                     int micro_batch, const std::string& cache_dir,
                                                     const moe::TrialOptions& trial) {
  const int layers = model.config().num_moe_layers();
  MoeScheduleChoice out;
  if (requested != "auto") {
    // An empty value is the spec's default.
    const std::optional<moe::Schedule> s =
        requested.empty() ? moe::Schedule::kDeepspeed : moe::ParseSchedule(requested);
    if (!s.has_value()) {
      return absl::InvalidArgumentError(absl::StrCat("moe.schedule: unknown value '", requested,
                                                     "' (allowed: deepspeed, s1, s2, auto)"));
    }
    out.per_layer.assign(layers, *s);
    return out;
  }
  const moe::LayerShape shape = LayerShapeOf(model.config(), layout, micro_batch);
  if (shape.tp == 1) {
    out.per_layer.assign(layers, moe::Schedule::kDeepspeed);
    moe::Choice choice;
    choice.schedule = moe::Schedule::kDeepspeed;
    choice.reason = "tp = 1: nothing to pause";
    out.choice = choice;
    return out;
  }
  // The cache key: the layout's sizes, the device kind, the GEMMs' precision, how the groups move
  // bytes (TransportOf), the ranks' group coordinates (PlacementHash) and the largest collective
  // and GEMM timed (a function of the layer's shape): a resubmission on GPUs after a CPU run, in
  // bf16 after fp32, with NCCL after host-staged Gloo, in another parallel.order, or with larger
  // micro-batches than the profile was fitted for calibrates again; a restart on other hosts, split
  // over nodes the same way or not, does not (PlacementHash: the run continues bit for bit).
  const model::ModelShard& sh = layout.shard;
  const int world = layout.world == nullptr ? 1 : layout.world->size();
  ASSIGN_OR_RETURN(const uint64_t placement, PlacementHash(layout));
  const std::vector<int64_t> sizes = CalibrationSizesFor(shape);
  // On a GPU only: where GEMMs run on host cores (the CPU and the emulated device) the default
  // sizes already take milliseconds (no launch overhead to drown in), and a GEMM of the layer's
  // size would cost every rank seconds at start.
  const std::vector<int64_t> gemm_flops = model.device().kind() == device::Kind::kCuda
                                              ? CalibrationGemmFlopsFor(shape)
                                              : moe::CalibrationOptions().gemm_flops;
  const std::string key = absl::StrCat(
      "world", world, "_pp", sh.stages, "_tp", sh.tp, "_ep", sh.ep, "_esp", sh.esp, "_",
      device::KindName(model.device().kind()), "_",
      device::PrecisionName(model.backend().precision), "_", TransportOf(layout.tp.get()), "_",
      absl::Hex(placement, absl::kZeroPad16), "_b", sizes.back(), "_f", gemm_flops.back());
  if (!cache_dir.empty()) {
    out.cache_path =
        (std::filesystem::path(cache_dir) / ("cost_profile." + key + ".json")).string();
  }
  // Rank 0 reads the cache; everyone takes its text (empty: calibrate).
  std::string cached = layout.rank == 0 && !out.cache_path.empty() ? ReadFile(out.cache_path) : "";
  ASSIGN_OR_RETURN(cached, FromRankZero(layout.world.get(), std::move(cached)));
  if (!cached.empty()) {
    absl::StatusOr<moe::CostProfile> p = moe::CostProfile::FromJson(cached);
    if (p.ok()) {
      out.profile = *std::move(p);
      out.from_cache = true;
    }
  }
  if (!out.profile.has_value()) {
    // Every rank reaches here alike: the cached text was the same everywhere.
    moe::CalibrationOptions options;
    options.sizes_bytes = sizes;
    options.gemm_flops = gemm_flops;
    const device::Backend& ops = model.backend();
    device::Device& device = model.device();
    options.device = &device;
    options.gemm_seconds = [&](int64_t flops) { return GemmSeconds(ops, device, flops); };
    options.copy_seconds = [&](int64_t bytes) { return CopySeconds(device, bytes); };
    ASSIGN_OR_RETURN(moe::CostProfile p, moe::Calibrate({layout.world.get(), layout.tp.get(),
                                                         layout.ep.get(), layout.esp.get()},
                                                        options));
    out.profile = std::move(p);
    if (layout.rank == 0 && !out.cache_path.empty()) {
      // A cache: a failed write only means the next job calibrates again. Written atomically
      // through a temporary file of its own (every job's rank 0 may write it at once).
      std::error_code ec;
      std::filesystem::create_directories(cache_dir, ec);
      if (absl::Status written = WriteFileDurably(out.cache_path, out.profile->ToJson());
          !written.ok()) {
        out.cache_error = std::string(written.message());
      }
    }
  }
  moe::Choice choice = moe::ChooseSchedule(*out.profile, shape);
  if (layers > 0 && moe::TrialCandidates(choice, shape, trial).size() > 1) {
    if (model.device_budget() > 0) {
      // The trial runs a layer outside the memory policy's plan (the adaptive planner's): under a
      // budget it could run out of memory on one rank while its peers wait in the collectives.
      absl::StrAppend(&choice.reason,
                      "; not measured (the trial runs only without memory.device_budget)");
    } else {
      ASSIGN_OR_RETURN(choice, MeasuredChoice(std::move(choice), shape, model, layout, micro_batch,
                                              cache_dir, key, trial, out));
    }
  }
  out.per_layer.assign(layers, choice.schedule);
  out.choice = std::move(choice);
  return out;
}

}  // namespace furnace::train
