#include "runtime/train/moe_schedules.h"

#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "runtime/base/status.h"
#include "runtime/moe/calibrate.h"

namespace furnace::train {
namespace {

double Seconds(const std::function<void()>& f) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// One square-ish GEMM of about `flops` through the model's backend.
double GemmSeconds(const device::Backend& ops, int64_t flops) {
  const int n = std::max(8, static_cast<int>(std::cbrt(static_cast<double>(flops) / 2)));
  std::vector<float> a(static_cast<size_t>(n) * n, 0.5f), b(a.size(), 0.25f), c(a.size());
  ops.matmul_forward(c.data(), a.data(), b.data(), nullptr, n, n, n);  // warm
  return Seconds([&] { ops.matmul_forward(c.data(), a.data(), b.data(), nullptr, n, n, n); }) *
         static_cast<double>(flops) / (2.0 * n * n * n);
}

double CopySeconds(int64_t bytes) {
  std::vector<char> from(static_cast<size_t>(bytes), 1), to(from.size());
  std::memcpy(to.data(), from.data(), from.size());  // warm
  return Seconds([&] { std::memcpy(to.data(), from.data(), from.size()); });
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

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return "";
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace

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
  return s;
}

absl::StatusOr<MoeScheduleChoice> ChooseMoeSchedules(const std::string& requested,
                                                     const model::GptMoe& model,
                                                     const RankLayout& layout, int micro_batch,
                                                     const std::string& cache_dir) {
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
  // The cache key: the layout's sizes (the groups' places follow from them and the orders, which
  // a job keeps across its attempts).
  const model::ModelShard& sh = layout.shard;
  const int world = layout.world == nullptr ? 1 : layout.world->size();
  const std::string key =
      absl::StrCat("world", world, "_pp", sh.stages, "_tp", sh.tp, "_ep", sh.ep, "_esp", sh.esp);
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
    const device::Backend& ops = model.backend();
    options.gemm_seconds = [&ops](int64_t flops) { return GemmSeconds(ops, flops); };
    options.copy_seconds = CopySeconds;
    ASSIGN_OR_RETURN(moe::CostProfile p, moe::Calibrate({layout.world.get(), layout.tp.get(),
                                                         layout.ep.get(), layout.esp.get()},
                                                        options));
    out.profile = std::move(p);
    if (layout.rank == 0 && !out.cache_path.empty()) {
      std::error_code ec;
      std::filesystem::create_directories(cache_dir, ec);
      const std::string tmp = out.cache_path + ".tmp";
      std::ofstream f(tmp);
      f << out.profile->ToJson();
      f.close();
      if (f) std::filesystem::rename(tmp, out.cache_path, ec);
    }
  }
  moe::Choice choice = moe::ChooseSchedule(*out.profile, shape);
  if (choice.schedule == moe::Schedule::kS1 && shape.N % shape.tp != 0) {
    // s1 needs the tokens to split over tp: the cheapest of the others.
    const moe::Prediction* best = nullptr;
    for (const moe::Prediction& p : choice.all) {
      if (p.schedule == moe::Schedule::kS1) continue;
      if (best == nullptr || p.total_s() < best->total_s()) best = &p;
    }
    choice.schedule = best->schedule;
    choice.reason =
        absl::StrCat(moe::ScheduleName(best->schedule), ": s1 would be cheaper but ", shape.N,
                     " tokens do not split over tp = ", shape.tp, "; ", choice.reason);
  }
  out.per_layer.assign(layers, choice.schedule);
  out.choice = std::move(choice);
  return out;
}

}  // namespace furnace::train
