// The training loop on the emulated discrete device against the CPU device, bit for bit: a run of
// several steps (gradient accumulation, clipping, AdamW with its moments on the device, held-out
// evaluation, routing spikes) gives the same losses, gradient norms and parameters; its
// checkpoints (saved from device-to-host copies, synchronously or through the asynchronous
// snapshot's copy on its own stream) hold the same bytes; and a run restored from one (host to
// device) continues exactly as the uninterrupted run.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kernels/blas.h"
#include "runtime/data/markov.h"
#include "runtime/data/sampler.h"
#include "runtime/device/current_stream.h"
#include "runtime/device/emulated_device.h"
#include "runtime/model/gpt_moe.h"
#include "runtime/tensor/arena.h"
#include "runtime/tensor/transfer.h"
#include "runtime/train/trainer.h"
#include "tests/testing/file_bytes.h"
#include "tests/testing/test_dir.h"

namespace furnace::train {
namespace {

model::ModelConfig Config() {
  model::ModelConfig c;
  c.vocab = 32;
  c.seq_len = 8;
  c.d_model = 16;
  c.heads = 2;
  c.layers = 2;
  c.moe_every = 1;
  c.experts = 4;
  c.top_k = 2;
  c.expert_ffn = 16;
  c.capacity_factor = 1.25;
  c.spikes = {.probability = 0.5, .max_ratio = 2.0, .seed = 11};
  return c;
}

struct Outcome {
  std::vector<double> loss, aux, norm, eval;
  std::vector<float> params;
  std::vector<float> m;  // the Adam first moments at the end
};

struct Options {
  int64_t steps = 4;
  std::string dir;  // checkpoints (every 2 steps) when set
  bool async = false;
  bool restore = false;  // RestoreLatest before running
};

std::unique_ptr<device::Device> MakeDevice(device::Kind kind) {
  if (kind == device::Kind::kCpu) return device::CreateCpuDevice();
  auto emulated = device::CreateEmulatedDevice({.memory_bytes = size_t{128} << 20});
  EXPECT_TRUE(emulated.ok()) << emulated.status();
  return emulated.ok() ? std::move(*emulated) : nullptr;
}

absl::StatusOr<std::unique_ptr<data::Sampler>> Sampler(uint64_t seed) {
  data::MarkovConfig mc;
  mc.vocab = 32;
  mc.seed = 5;
  absl::StatusOr<data::MarkovChain> chain = data::MarkovChain::Create(mc);
  if (!chain.ok()) return chain.status();
  data::SamplerConfig sc;
  sc.batch = 2;
  sc.seq_len = 8;
  sc.seed = seed;
  return data::MakeMarkovSampler(*chain, sc);
}

std::optional<Outcome> Train(device::Kind kind, const Options& o) {
  kernels::cpu::SetBlasThreads(1);
  std::unique_ptr<device::Device> dev = MakeDevice(kind);
  if (dev == nullptr) return std::nullopt;
  auto stream = dev->CreateStream();
  EXPECT_TRUE(stream.ok());
  if (!stream.ok()) return std::nullopt;
  device::StreamScope scope(**stream);
  tensor::DeviceArena arena(*dev, 0);
  auto model = model::GptMoe::Create(Config(), 3, *dev, arena);
  EXPECT_TRUE(model.ok()) << model.status();
  auto sampler = Sampler(7);
  auto held_out = Sampler(1007);
  EXPECT_TRUE(sampler.ok() && held_out.ok());
  if (!model.ok() || !sampler.ok() || !held_out.ok()) return std::nullopt;
  TrainConfig tc;
  tc.steps = o.steps;
  tc.micro_batches = 2;
  tc.seed = 7;
  tc.schedule.lr = 3e-3;
  tc.schedule.warmup_steps = 2;
  tc.schedule.max_steps = 4;
  tc.clip = 0.5;  // clips: the scale runs
  tc.eval = {.every = 2, .batches = 2};
  tc.checkpoint.dir = o.dir;
  tc.checkpoint.every = 2;
  tc.checkpoint.keep = 0;
  tc.checkpoint.async = o.async;
  auto trainer =
      Trainer::Create(model->get(), sampler->get(), tc, nullptr, nullptr, held_out->get());
  EXPECT_TRUE(trainer.ok()) << trainer.status();
  if (!trainer.ok()) return std::nullopt;
  if (o.restore) {
    const absl::StatusOr<LoadedCheckpoint> loaded = (*trainer)->RestoreLatest();
    EXPECT_TRUE(loaded.ok()) << loaded.status();
    if (!loaded.ok()) return std::nullopt;
  }
  Outcome r;
  const absl::Status ran = (*trainer)->Run([&r](const StepStats& s) {
    r.loss.push_back(s.loss);
    r.aux.push_back(s.aux_loss);
    r.norm.push_back(s.grad_norm);
    if (s.eval) r.eval.push_back(s.eval->loss);
  });
  EXPECT_TRUE(ran.ok()) << ran;
  EXPECT_TRUE((*trainer)->checkpoint_errors().empty());
  if (!ran.ok()) return std::nullopt;
  r.params.resize((*model)->num_params());
  EXPECT_TRUE(
      tensor::CopyToHost(*dev, r.params.data(), (*model)->param_data(), 4 * r.params.size()).ok());
  absl::StatusOr<std::vector<float>> m = (*trainer)->optimizer().HostM();
  EXPECT_TRUE(m.ok());
  if (m.ok()) r.m = *m;
  return r;
}

void ExpectBitIdentical(const std::vector<float>& a, const std::vector<float>& b,
                        const char* what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  EXPECT_EQ(std::memcmp(a.data(), b.data(), 4 * a.size()), 0) << what;
}

std::string Shard(const std::string& dir, int step) {
  char name[64];
  std::snprintf(name, sizeof(name), "/step-%08d/shard-00000.bin", step);
  return testing_util::ReadAll(dir + name);
}

TEST(DeviceTrainerTest, TrainingOnTheEmulatedDeviceIsTheCpusBitForBit) {
  testing_util::TestDir cpu_dir, emu_dir;
  const std::optional<Outcome> cpu = Train(device::Kind::kCpu, {.dir = cpu_dir.path()});
  const std::optional<Outcome> emu = Train(device::Kind::kEmulated, {.dir = emu_dir.path()});
  ASSERT_TRUE(cpu && emu);
  ASSERT_EQ(cpu->loss.size(), 4u);
  EXPECT_EQ(emu->loss, cpu->loss);
  EXPECT_EQ(emu->aux, cpu->aux);
  EXPECT_EQ(emu->norm, cpu->norm);
  EXPECT_EQ(emu->eval, cpu->eval);
  EXPECT_EQ(emu->eval.size(), 2u);
  ExpectBitIdentical(cpu->params, emu->params, "parameters");
  ExpectBitIdentical(cpu->m, emu->m, "Adam moments");
  for (int step : {2, 4}) {
    const std::string want = Shard(cpu_dir.path(), step);
    ASSERT_FALSE(want.empty()) << "step " << step;
    EXPECT_EQ(Shard(emu_dir.path(), step), want) << "checkpoint shard of step " << step;
  }
}

// The asynchronous snapshot on the emulated device (a device-to-host copy on the writer's stream
// after the update's event) writes the bytes the synchronous save writes, and training is the
// same.
TEST(DeviceTrainerTest, AsyncSnapshotsCopyFromTheDevice) {
  testing_util::TestDir sync_dir, async_dir;
  const std::optional<Outcome> sync = Train(device::Kind::kCpu, {.dir = sync_dir.path()});
  const std::optional<Outcome> async =
      Train(device::Kind::kEmulated, {.dir = async_dir.path(), .async = true});
  ASSERT_TRUE(sync && async);
  EXPECT_EQ(async->loss, sync->loss);
  ExpectBitIdentical(sync->params, async->params, "parameters");
  for (int step : {2, 4}) {
    const std::string want = Shard(sync_dir.path(), step);
    ASSERT_FALSE(want.empty());
    EXPECT_EQ(Shard(async_dir.path(), step), want) << "checkpoint shard of step " << step;
  }
}

// Two steps, a checkpoint, then a fresh model and trainer on another emulated device restored
// from it (host to device) run the last two: exactly the uninterrupted CPU run.
TEST(DeviceTrainerTest, RestoredOnTheEmulatedDeviceContinuesExactly) {
  testing_util::TestDir dir;
  const std::optional<Outcome> whole = Train(device::Kind::kCpu, {});
  ASSERT_TRUE(whole);
  const std::optional<Outcome> first =
      Train(device::Kind::kEmulated, {.steps = 2, .dir = dir.path()});
  ASSERT_TRUE(first);
  const std::optional<Outcome> rest =
      Train(device::Kind::kEmulated, {.steps = 4, .dir = dir.path(), .restore = true});
  ASSERT_TRUE(rest);
  ASSERT_EQ(rest->loss.size(), 2u);
  EXPECT_EQ(rest->loss[0], whole->loss[2]);
  EXPECT_EQ(rest->loss[1], whole->loss[3]);
  ExpectBitIdentical(whole->params, rest->params, "parameters");
  ExpectBitIdentical(whole->m, rest->m, "Adam moments");
}

}  // namespace
}  // namespace furnace::train
