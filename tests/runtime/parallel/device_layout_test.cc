// Parallel layouts on the emulated discrete device: each rank a forked process with an emulated
// device of its own (its Gloo communicators wrapped by comm::ForDevice, so every collective gets
// device buffers and stages them through the host), against the same layout on the CPU device,
// bit for bit: per-step loss, aux loss, gradient norm and global tokens per expert, the final
// parameters of every shard, the bytes each collective moved, and the MoE schedules' per-op bytes.
// Covered: data, tensor, expert with expert sharding, 1F1B pipeline, and the Parm schedules s1 and
// s2 (s2's fused all-to-all + all-gather on host staging), and the static offload through the copy
// streams and the adaptive policy under a budget (both bit-identical to none on the CPU). The
// `_streams` cases run every group as a CUDA rank runs NCCL: a StreamCommunicator over the emulated
// transport (Gloo on a communication stream of its own per group, ordered with the compute stream
// by events, under the rank's watchdog), s2's fused exchange on the two groups' streams.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/runtime/parallel/layout_run.h"

namespace furnace::testing {
namespace {

struct Case {
  const char* name;
  int pp, dp, tp, ep, esp, m;
  const char* schedule;
  bool offload;  // the emulated run offloads its expert buffers (policy offload, ratio 1)
  // The emulated run's groups are stream communicators over the emulated transport (as NCCL on a
  // GPU: collectives on streams of their own, ordered by events), not Gloo staged through the host.
  bool streams = false;
};

absl::StatusOr<RunResult> RunOn(LayoutCase c, const Case& k, device::Kind kind, bool offload) {
  c.device = kind;
  c.stream_comms = kind == device::Kind::kEmulated && k.streams;
  if (offload) {
    c.policy = memory::MemoryPolicy::kOffload;
    c.offload_ratio = 1.0;
  }
  const std::string dir = absl::StrCat(::testing::TempDir(), "/device-layout-", k.name, "-",
                                       device::KindName(kind), "-", getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  absl::StatusOr<RunResult> r = RunLayout(c, dir);
  std::filesystem::remove_all(dir);
  return r;
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), 4 * a.size()) == 0;
}

class DeviceLayoutTest : public ::testing::TestWithParam<Case> {};

TEST_P(DeviceLayoutTest, EmulatedRanksTrainAsCpuRanksBitForBit) {
  const Case& k = GetParam();
  LayoutCase c;
  c.model = TinyLayoutModel(2, 1.25);
  c.model.spikes = {.probability = 0.5, .max_ratio = 2.0, .seed = 9};
  c.sizes.pp = k.pp;
  c.sizes.dp = k.dp;
  c.sizes.tp = k.tp;
  c.sizes.ep = k.ep;
  c.sizes.esp = k.esp;
  c.micro_batches = k.m;
  c.steps = 3;
  c.schedule = k.schedule;
  const absl::StatusOr<RunResult> cpu = RunOn(c, k, device::Kind::kCpu, false);
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  const absl::StatusOr<RunResult> emu = RunOn(c, k, device::Kind::kEmulated, k.offload);
  ASSERT_TRUE(emu.ok()) << emu.status();

  EXPECT_EQ(emu->loss, cpu->loss);
  EXPECT_EQ(emu->aux_loss, cpu->aux_loss);
  EXPECT_EQ(emu->grad_norm, cpu->grad_norm);
  EXPECT_EQ(emu->tokens_per_expert, cpu->tokens_per_expert);
  EXPECT_EQ(emu->routing_spike, cpu->routing_spike);
  EXPECT_EQ(emu->in_flight_peak, cpu->in_flight_peak);
  EXPECT_EQ(emu->comm_bytes, cpu->comm_bytes);
  EXPECT_EQ(emu->moe_op_bytes, cpu->moe_op_bytes);
  EXPECT_EQ(emu->moe_schedules, cpu->moe_schedules);
  EXPECT_EQ(emu->replica_spread, 0.0);
  ASSERT_EQ(emu->params.size(), cpu->params.size());
  for (const auto& [name, want] : cpu->params) {
    EXPECT_TRUE(SameBits(emu->params.at(name), want)) << name;
  }
  if (k.offload) {
    uint64_t offloaded = 0;
    for (const model::StashActionStats& s : emu->stash_actions) offloaded += s.offloaded_bytes;
    EXPECT_GT(offloaded, 0u);
  }
  std::printf("REPORT %s: %zu steps, loss %.7f .. %.7f, emulated == cpu bit for bit\n", k.name,
              cpu->loss.size(), cpu->loss.front(), cpu->loss.back());
}

// model.attention_probs recomputed on emulated stream ranks under tensor parallelism (each rank
// NH / 2 heads) and a 1F1B pipeline: the row statistics instead of the probabilities, rebuilt in
// backward, train as the CPU ranks with stored probabilities, bit for bit, in less memory.
TEST(DeviceLayoutAttentionTest, RecomputedProbsOnEmulatedRanksTrainAsStoredOnCpuRanks) {
  const Case k{"pp2_tp2_recomputed_probs", 2, 1, 2, 1, 1, 2, "deepspeed", false, true};
  LayoutCase c;
  c.model = TinyLayoutModel(2, 1.25);
  c.sizes.pp = 2;
  c.sizes.tp = 2;
  c.micro_batches = 2;
  c.steps = 3;
  const absl::StatusOr<RunResult> cpu = RunOn(c, k, device::Kind::kCpu, false);
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  LayoutCase r = c;
  r.model.recompute_attention_probs = true;
  const absl::StatusOr<RunResult> emu = RunOn(r, k, device::Kind::kEmulated, false);
  ASSERT_TRUE(emu.ok()) << emu.status();
  EXPECT_EQ(emu->loss, cpu->loss);
  EXPECT_EQ(emu->aux_loss, cpu->aux_loss);
  EXPECT_EQ(emu->grad_norm, cpu->grad_norm);
  EXPECT_EQ(emu->tokens_per_expert, cpu->tokens_per_expert);
  ASSERT_EQ(emu->params.size(), cpu->params.size());
  for (const auto& [name, want] : cpu->params) {
    EXPECT_TRUE(SameBits(emu->params.at(name), want)) << name;
  }
  ASSERT_EQ(emu->activation_peak.size(), cpu->activation_peak.size());
  for (size_t rank = 0; rank < cpu->activation_peak.size(); ++rank) {
    ASSERT_EQ(emu->activation_peak[rank].size(), cpu->activation_peak[rank].size());
    for (size_t step = 0; step < cpu->activation_peak[rank].size(); ++step) {
      EXPECT_LT(emu->activation_peak[rank][step], cpu->activation_peak[rank][step])
          << "rank " << rank << " step " << step;
    }
  }
  std::printf(
      "REPORT %s: rank 0 activation peak %lld B stored (cpu), %lld B recomputed "
      "(emulated); bit for bit\n",
      k.name, static_cast<long long>(cpu->activation_peak[0][0]),
      static_cast<long long>(emu->activation_peak[0][0]));
}

// memory.policy adaptive on emulated ranks (ep 2, dp 2) under a budget the unlimited run exceeds:
// the planner offloads through the copy streams and drops to fit, and training is the CPU's under
// policy none, bit for bit.
TEST(DeviceLayoutAdaptiveTest, AdaptiveOnEmulatedRanksIsNoneOnCpuRanks) {
  const Case k{"ep2_adaptive", 1, 2, 1, 2, 1, 2, "deepspeed", false};
  LayoutCase c;
  c.model = TinyLayoutModel(2, 0);
  c.model.spikes = {.probability = 1.0, .max_ratio = 2.0, .seed = 9};
  c.sizes.dp = 2;
  c.sizes.ep = 2;
  c.micro_batches = 2;
  c.steps = 3;
  const absl::StatusOr<RunResult> cpu = RunOn(c, k, device::Kind::kCpu, false);
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  int64_t top = 0;
  for (const std::vector<int64_t>& rank : cpu->activation_peak) {
    for (int64_t peak : rank) top = std::max(top, peak);
  }
  LayoutCase a = c;
  a.policy = memory::MemoryPolicy::kAdaptive;
  a.device_budget = static_cast<uint64_t>(0.85 * static_cast<double>(top));
  const absl::StatusOr<RunResult> emu = RunOn(a, k, device::Kind::kEmulated, false);
  ASSERT_TRUE(emu.ok()) << emu.status();
  EXPECT_EQ(emu->loss, cpu->loss);
  EXPECT_EQ(emu->grad_norm, cpu->grad_norm);
  EXPECT_EQ(emu->tokens_per_expert, cpu->tokens_per_expert);
  for (const auto& [name, want] : cpu->params) {
    EXPECT_TRUE(SameBits(emu->params.at(name), want)) << name;
  }
  int64_t acted = 0;
  for (size_t r = 0; r < emu->activation_peak.size(); ++r) {
    for (size_t s = 0; s < emu->activation_peak[r].size(); ++s) {
      EXPECT_LE(emu->activation_peak[r][s], static_cast<int64_t>(a.device_budget));
      acted += emu->planner_decisions[r][s] + emu->emergency_offloads[r][s];
    }
  }
  EXPECT_GT(acted, 0);
  std::printf(
      "REPORT ep2_adaptive: budget %llu B (85%% of the unlimited peak %lld B), %lld "
      "planner actions, emulated adaptive == cpu none bit for bit\n",
      static_cast<unsigned long long>(a.device_budget), static_cast<long long>(top),
      static_cast<long long>(acted));
}

// Case `c` under moe.schedule auto on emulated ranks (every schedule tried: a wide window): every
// rank of the `world` runs one schedule on each of its `moe_layers` MoE layers, and the run is the
// CPU run of that schedule named, bit for bit (the trial leaves no trace in the parameters,
// gradients, routing or op counters). Returns the schedule auto picked ("" on a failure).
std::string ExpectAutoTrainsAsItsPick(LayoutCase c, const Case& k, size_t world,
                                      size_t moe_layers) {
  c.schedule = "auto";
  c.trial.window = 1e9;
  const absl::StatusOr<RunResult> emu = RunOn(c, k, device::Kind::kEmulated, false);
  EXPECT_TRUE(emu.ok()) << emu.status();
  if (!emu.ok()) return "";
  EXPECT_EQ(emu->moe_schedules.size(), world);
  if (emu->moe_schedules.empty() || emu->moe_schedules[0].empty()) {
    ADD_FAILURE() << "no MoE schedule reported";
    return "";
  }
  const std::string chosen = emu->moe_schedules[0][0];
  for (const std::vector<std::string>& rank : emu->moe_schedules) {
    EXPECT_EQ(rank.size(), moe_layers);
    for (const std::string& name : rank) EXPECT_EQ(name, chosen);
  }
  c.schedule = chosen;
  const absl::StatusOr<RunResult> cpu = RunOn(c, k, device::Kind::kCpu, false);
  EXPECT_TRUE(cpu.ok()) << cpu.status();
  if (!cpu.ok()) return "";
  EXPECT_EQ(emu->loss, cpu->loss);
  EXPECT_EQ(emu->aux_loss, cpu->aux_loss);
  EXPECT_EQ(emu->grad_norm, cpu->grad_norm);
  EXPECT_EQ(emu->tokens_per_expert, cpu->tokens_per_expert);
  EXPECT_EQ(emu->moe_op_bytes, cpu->moe_op_bytes);
  for (const auto& [name, want] : cpu->params) {
    EXPECT_TRUE(SameBits(emu->params.at(name), want)) << name;
  }
  std::printf("REPORT %s: auto chose %s on emulated stream ranks; == cpu %s bit for bit\n", k.name,
              chosen.c_str(), chosen.c_str());
  return chosen;
}

// moe.schedule auto on emulated ranks whose groups are stream communicators (as NCCL on a GPU):
// the calibration runs on device memory (collectives, GEMM and copy timed to their completion on
// the device), then the trial times the MoE layer under every schedule on the device, and every
// rank takes one schedule; training is then the CPU run of that schedule, bit for bit.
// (Calibrating on host buffers stopped the rank: the emulated backend refuses host pointers, as a
// GPU kernel faults on them.)
TEST(DeviceLayoutAutoTest, AutoCalibratesOnTheDeviceAndTrainsAsCpuRanks) {
  const Case k{"tp2_ep2_auto_streams", 1, 2, 2, 2, 1, 1, "auto", false, true};
  LayoutCase c;
  c.model = TinyLayoutModel(2, 1.25);
  c.sizes.dp = 2;
  c.sizes.tp = 2;
  c.sizes.ep = 2;
  c.micro_batches = 1;
  c.steps = 3;
  EXPECT_NE(ExpectAutoTrainsAsItsPick(c, k, 4, static_cast<size_t>(c.model.num_moe_layers())), "");
}

// auto on a 1F1B pipeline whose first stage holds no MoE layer (4 layers, moe_every 4: layer 3
// only), on emulated stream ranks: that stage's ranks take part in the trial's barriers and
// all-gathers with nothing to time, every rank takes one schedule, and the run trains bit for bit
// as the CPU run of that schedule named.
TEST(DeviceLayoutAutoTest, AStageWithoutMoeLayersTakesPartInTheTrial) {
  const Case k{"pp2_tp2_ep2_auto_streams", 2, 1, 2, 2, 1, 2, "auto", false, true};
  LayoutCase c;
  c.model = TinyLayoutModel(2, 1.25);
  c.model.moe_every = 4;
  c.sizes.pp = 2;
  c.sizes.tp = 2;
  c.sizes.ep = 2;
  c.micro_batches = 2;
  c.steps = 2;
  EXPECT_NE(ExpectAutoTrainsAsItsPick(c, k, 4, 1), "");
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, DeviceLayoutTest,
    ::testing::Values(Case{"dp2", 1, 2, 1, 1, 1, 2, "deepspeed", false},
                      Case{"tp2", 1, 1, 2, 1, 1, 2, "deepspeed", false},
                      Case{"ep2_esp2", 1, 4, 1, 2, 2, 1, "deepspeed", false},
                      Case{"pp2_1f1b", 2, 1, 1, 1, 1, 3, "deepspeed", false},
                      Case{"tp2_ep2_s1", 1, 2, 2, 2, 1, 1, "s1", false},
                      Case{"tp2_ep2_s2", 1, 2, 2, 2, 1, 1, "s2", false},
                      Case{"ep2_offload", 1, 2, 1, 2, 1, 2, "deepspeed", true},
                      // The CUDA path's shape: every group on its own stream, ordered by events.
                      Case{"dp2_streams", 1, 2, 1, 1, 1, 2, "deepspeed", false, true},
                      Case{"ep2_esp2_streams", 1, 4, 1, 2, 2, 1, "deepspeed", false, true},
                      Case{"pp2_1f1b_streams", 2, 1, 1, 1, 1, 3, "deepspeed", false, true},
                      Case{"tp2_ep2_s2_streams", 1, 2, 2, 2, 1, 1, "s2", false, true},
                      Case{"ep2_offload_streams", 1, 2, 1, 2, 1, 2, "deepspeed", true, true}),
    [](const ::testing::TestParamInfo<Case>& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace furnace::testing
