#include "bench/parm/parm_layer.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "bench/common/stats.h"
#include "runtime/base/status.h"
#include "runtime/device/backend.h"
#include "runtime/device/device.h"
#include "runtime/model/moe_block.h"
#include "runtime/model/stash.h"
#include "runtime/tensor/arena.h"

namespace furnace::bench {
namespace {

void Fill(float* p, int64_t n, float std, std::mt19937& rng) {
  std::normal_distribution<float> d(0.0f, std);
  for (int64_t i = 0; i < n; ++i) p[i] = d(rng);
}

}  // namespace

struct RankLayer::State {
  LayerConfig config;
  model::ParallelGroups groups;
  std::unique_ptr<device::Device> cpu;
  std::unique_ptr<tensor::DeviceArena> arena;
  std::unique_ptr<model::Stash> stash;
  const device::Backend* ops = nullptr;
  model::Dims dims;
  model::MoeShape shape;
  model::LayerOffsets off;
  std::vector<float> params, grads;
  std::vector<float> dout, dres;  // (N, C) d loss / d out, and the block's in-out gradient
  model::StashHandle x_in;

  model::ModuleContext Context(moe::ExchangeCounters* counters) {
    model::ModuleContext ctx{*ops, *arena, *stash, groups};
    ctx.moe_counters = counters;
    return ctx;
  }
};

RankLayer::RankLayer(std::unique_ptr<State> state) : s_(std::move(state)) {}
RankLayer::~RankLayer() = default;

absl::StatusOr<std::unique_ptr<RankLayer>> RankLayer::Create(const LayerConfig& c,
                                                             const model::ModelShard& sh,
                                                             const model::ParallelGroups& groups) {
  const int64_t N = int64_t{c.B} * c.T;
  if (c.E % sh.ep != 0 || c.f % sh.esp != 0 || N % sh.tp != 0 || c.k < 1 || c.k > c.E) {
    return absl::InvalidArgumentError(absl::StrCat("layer N=", N, " C=", c.C, " f=", c.f,
                                                   " E=", c.E, " k=", c.k, " does not fit tp ",
                                                   sh.tp, " ep ", sh.ep, " esp ", sh.esp));
  }
  auto s = std::make_unique<State>();
  s->config = c;
  s->groups = groups;
  s->cpu = device::CreateCpuDevice();
  s->arena = std::make_unique<tensor::DeviceArena>(*s->cpu, 0);
  s->stash = std::make_unique<model::Stash>(s->cpu->kind());
  ASSIGN_OR_RETURN(s->ops, device::BackendFor(*s->cpu));
  s->dims = model::Dims{c.B, c.T, c.C, 8, sh.tp};
  s->shape = model::MoeShape{c.E, c.k, c.f, 0.0, c.k > 1, 0.01};
  s->shape.local_E = c.E / sh.ep;
  s->shape.local_f = c.f / sh.esp;
  s->shape.adds_b2 = sh.esp_rank == 0;

  // Parameters in the block's layout: w1 [El, C, fl], b1 [El, fl], w2 [El, fl, C], b2 [El, C].
  const int64_t C = c.C, E = c.E, El = s->shape.El(), fl = s->shape.fl();
  int64_t at = 0;
  auto take = [&](int64_t n) {
    const int64_t o = at;
    at += n;
    return o;
  };
  model::LayerOffsets& off = s->off;
  off.ln2_w = take(C);
  off.ln2_b = take(C);
  off.router = take(C * E);
  off.w1 = take(El * C * fl);
  off.b1 = take(El * fl);
  off.w2 = take(El * fl * C);
  off.b2 = take(El * C);
  off.moe = true;
  s->params.assign(at, 0.0f);
  s->grads.assign(at, 0.0f);
  std::fill(s->params.begin() + off.ln2_w, s->params.begin() + off.ln2_w + C, 1.0f);
  std::mt19937 router_rng(static_cast<uint32_t>(c.seed));
  Fill(s->params.data() + off.router, C * E, 0.02f, router_rng);
  for (int64_t le = 0; le < El; ++le) {
    const int64_t e = sh.ep_rank * El + le;
    std::mt19937 rng(static_cast<uint32_t>(c.seed * 100003 + e * 97 + sh.esp_rank + 1));
    Fill(s->params.data() + off.w1 + le * C * fl, C * fl, 0.02f, rng);
    Fill(s->params.data() + off.w2 + le * fl * C, fl * C, 0.02f, rng);
  }

  const int64_t NC = N * C;
  std::mt19937 rng(static_cast<uint32_t>(c.seed * 7919 + sh.dp_rank));
  std::vector<float> x(NC);
  Fill(x.data(), NC, 1.0f, rng);
  s->dout.resize(NC);
  Fill(s->dout.data(), NC, 1.0f / std::sqrt(static_cast<float>(NC)), rng);
  s->dres.resize(NC);
  model::ModuleContext ctx = s->Context(nullptr);
  ASSIGN_OR_RETURN(tensor::Buffer xb, model::AllocF32(ctx, NC, "x", false));
  std::copy(x.begin(), x.end(), xb.as<float>());
  ASSIGN_OR_RETURN(s->x_in, model::SaveF32(ctx, "x", 0, std::move(xb), {c.B, c.T, c.C}));
  return std::unique_ptr<RankLayer>(new RankLayer(std::move(s)));
}

absl::StatusOr<LayerTimes> RankLayer::Run(moe::Schedule schedule, moe::ExchangeCounters* counters,
                                          LayerOutputs* outputs) {
  State& s = *s_;
  s.shape.schedule = schedule;
  model::ModuleContext ctx = s.Context(counters);
  std::copy(s.dout.begin(), s.dout.end(), s.dres.begin());
  if (outputs != nullptr) std::fill(s.grads.begin(), s.grads.end(), 0.0f);
  LayerTimes t;
  const double t0 = Now();
  ASSIGN_OR_RETURN(model::MoeSaved saved,
                   model::MoeBlockForward(ctx, s.dims, s.shape, 0, s.off, s.params.data(), s.x_in));
  const double t1 = Now();
  if (outputs != nullptr) {
    ASSIGN_OR_RETURN(tensor::TensorView out, s.stash->Get(saved.out));
    outputs->out.assign(out.as<float>(), out.as<float>() + out.numel());
  }
  const double t2 = Now();
  RETURN_IF_ERROR(model::MoeBlockBackward(ctx, s.dims, s.shape, s.off, s.params.data(),
                                          s.grads.data(), saved, s.x_in, 1.0, s.dres.data()));
  const double t3 = Now();
  t.fwd_s = t1 - t0;
  t.bwd_s = t3 - t2;
  if (outputs != nullptr) {
    outputs->dx = s.dres;
    outputs->grads = s.grads;
  }
  return t;
}

}  // namespace furnace::bench
